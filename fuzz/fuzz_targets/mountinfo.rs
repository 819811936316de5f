//! Fuzz target `mountinfo`: `/proc/self/mountinfo` text through the parser the mount library
//! reads the mount table with.
//!
//! Nothing may panic; a parsed line written back by `format_line` (its inverse) parses to the
//! same mount, and the kernel escaping of any path decodes back to that path.

#![no_main]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rustlet_mount::mountinfo::{escape, format_line, parse, parse_line, unescape};

fuzz_target!(|data: &[u8]| {
    let path = Path::new(OsStr::from_bytes(data));
    assert_eq!(
        unescape(&escape(path)),
        path.as_os_str(),
        "escape then unescape changed the path"
    );
    let text = String::from_utf8_lossy(data);
    let Ok(mounts) = parse(&text) else {
        return;
    };
    for mount in mounts {
        let line = format_line(&mount);
        let again = parse_line(&line, 1)
            .unwrap_or_else(|e| panic!("format_line wrote {line:?}, which does not parse: {e}"));
        assert_eq!(
            again, mount,
            "format_line then parse_line changed the mount"
        );
    }
});
