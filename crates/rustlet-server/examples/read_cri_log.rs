//! Reads a CRI container log file as the kubelet server's `/containerLogs` does: the query
//! decoded as the kubelet decodes it, the file's `<time> <stream> <P|F> <content>` lines
//! parsed, partial lines joined, the options applied.
//!
//! ```sh
//! cargo run -p rustlet-server --example read_cri_log -- [FILE] ['tailLines=4&timestamps=true']
//! ```
//!
//! Without a file, it writes a small one (containerd's format) to a temporary directory and
//! reads that.

use rustlet_server::logs::reader::StatusError;
use rustlet_server::logs::{ContainerRunning, LogOptions, LogReader, parse_pod_log_query};

/// The container is not running, so even a `follow=true` query ends at the end of the file.
struct Stopped;

#[async_trait::async_trait]
impl ContainerRunning for Stopped {
    async fn is_running(&self) -> Result<bool, StatusError> {
        Ok(false)
    }
}

const SAMPLE: &str = "2026-12-03T10:00:00.000000001Z stdout F starting\n\
2026-12-03T10:00:01.000000002Z stderr F a warning\n\
2026-12-03T10:00:02.000000003Z stdout P a line written \n\
2026-12-03T10:00:02.000000004Z stdout F in two pieces\n\
2026-12-03T10:00:03.000000005Z stdout F done\n";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let scratch = tempfile::tempdir()?;
    let path = match args.next() {
        Some(file) => std::path::PathBuf::from(file),
        None => {
            let path = scratch.path().join("0.log");
            std::fs::write(&path, SAMPLE)?;
            path
        }
    };
    // `tailLines` counts the file's lines, a partial (`P`) piece included, as upstream's
    // `findTailLineStartIndex`: the last 4 file lines are the last 3 log lines here.
    let query = args
        .next()
        .unwrap_or_else(|| "tailLines=4&timestamps=true".to_owned());
    let api = parse_pod_log_query(&query)?;
    let options = LogOptions::new(&api, k8s_openapi::jiff::Timestamp::now());
    let mut out = Vec::new();
    let stats = LogReader::new(&path, options)
        .read_logs(&Stopped, &mut out)
        .await?;
    println!("{} ({query}):", path.display());
    print!("{}", String::from_utf8_lossy(&out));
    println!(
        "-- {} bytes written, buffer {} bytes",
        stats.bytes_written, stats.buffer_capacity
    );
    Ok(())
}
