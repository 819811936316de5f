//! Mount+unmount pairs per second, tmpfs and bind, through `LinuxMounter` and through raw
//! `nix::mount::mount`/`umount2` (the physical floor), interleaved round by round so both see
//! the same machine. Run as root in a private mount namespace:
//!
//! ```sh
//! unshare -m --propagation private env RUSTLET_PRIVATE_MOUNT_NS=1 \
//!     cargo bench -p rustlet-mount --features test-util --bench mount_pairs
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use rustlet_mount::testing::privileged_dir;
use rustlet_mount::{BindAccess, LinuxMounter, TmpfsOptions, UnmountMode};

const PAIRS: u32 = 1000;
const ROUNDS: usize = 9;
const NONE: Option<&str> = None;

fn time(mut pair: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..PAIRS {
        pair();
    }
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn per_pair_us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / f64::from(PAIRS)
}

fn report(name: &str, raw: Vec<Duration>, ours: Vec<Duration>) {
    let (raw, ours) = (median(raw), median(ours));
    let overhead = (ours.as_secs_f64() / raw.as_secs_f64() - 1.0) * 100.0;
    println!(
        "| {name} | {:.1} µs ({:.0} pairs/s) | {:.1} µs ({:.0} pairs/s) | {overhead:+.1} % |",
        per_pair_us(raw),
        1e6 / per_pair_us(raw),
        per_pair_us(ours),
        1e6 / per_pair_us(ours),
    );
}

fn raw_tmpfs(target: &Path) {
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=755"),
    )
    .unwrap();
    umount2(target, MntFlags::empty()).unwrap();
}

fn ours_tmpfs(m: &LinuxMounter, target: &Path) {
    m.tmpfs(target, TmpfsOptions::default()).unwrap();
    m.unmount(target, UnmountMode::Normal).unwrap();
}

fn raw_bind(source: &Path, target: &Path) {
    mount(Some(source), target, NONE, MsFlags::MS_BIND, NONE).unwrap();
    umount2(target, MntFlags::empty()).unwrap();
}

fn ours_bind(m: &LinuxMounter, source: &Path, target: &Path) {
    m.bind(source, target, BindAccess::ReadWrite).unwrap();
    m.unmount(target, UnmountMode::Normal).unwrap();
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then do one quick round.
    let quick = !std::env::args().any(|a| a == "--bench");
    let Some(dir) = privileged_dir("mount_pairs") else {
        return;
    };
    let m = LinuxMounter::new();
    let target = dir.mkdir("target");
    let source = dir.mkdir("source");
    let rounds = if quick { 1 } else { ROUNDS };
    let (mut raw_t, mut ours_t, mut raw_b, mut ours_b) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        raw_t.push(time(|| raw_tmpfs(&target)));
        ours_t.push(time(|| ours_tmpfs(&m, &target)));
        raw_b.push(time(|| raw_bind(&source, &target)));
        ours_b.push(time(|| ours_bind(&m, &source, &target)));
    }
    println!("{PAIRS} pairs per round, median of {rounds} interleaved rounds");
    println!("| pair | raw nix (floor) | LinuxMounter | overhead |");
    println!("|---|---|---|---|");
    report("tmpfs mount + unmount", raw_t, ours_t);
    report("bind mount + unmount", raw_b, ours_b);
}
