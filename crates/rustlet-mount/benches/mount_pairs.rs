//! Mount+unmount pairs per second, tmpfs and bind, through `LinuxMounter` and through raw
//! `nix::mount::mount`/`umount2` (the physical floor), alternating pair by pair so both see the
//! same machine. Run as root in a private mount namespace:
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
const ROUNDS: usize = 15;
const NONE: Option<&str> = None;

/// Times `PAIRS` pairs of each contender, alternating them pair by pair (and which goes first),
/// so that neither inherits more of the kernel's deferred unmount work than the other.
fn time_alternating(mut raw: impl FnMut(), mut ours: impl FnMut()) -> (Duration, Duration) {
    let (mut raw_total, mut ours_total) = (Duration::ZERO, Duration::ZERO);
    for i in 0..PAIRS {
        let run = |f: &mut dyn FnMut(), total: &mut Duration| {
            let start = Instant::now();
            f();
            *total += start.elapsed();
        };
        if i % 2 == 0 {
            run(&mut raw, &mut raw_total);
            run(&mut ours, &mut ours_total);
        } else {
            run(&mut ours, &mut ours_total);
            run(&mut raw, &mut raw_total);
        }
    }
    (raw_total, ours_total)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn per_pair_us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / f64::from(PAIRS)
}

fn report(name: &str, raw: Vec<Duration>, ours: Vec<Duration>) {
    // The overhead is the median of the per-round ratios: each round's two figures were taken
    // side by side, so their ratio cancels most of the machine's drift between rounds.
    let mut ratios: Vec<f64> = raw
        .iter()
        .zip(&ours)
        .map(|(r, o)| o.as_secs_f64() / r.as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    let overhead = (ratios[ratios.len() / 2] - 1.0) * 100.0;
    let (raw, ours) = (median(raw), median(ours));
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
        let (raw, ours) = time_alternating(|| raw_tmpfs(&target), || ours_tmpfs(&m, &target));
        raw_t.push(raw);
        ours_t.push(ours);
        let (raw, ours) = time_alternating(
            || raw_bind(&source, &target),
            || ours_bind(&m, &source, &target),
        );
        raw_b.push(raw);
        ours_b.push(ours);
    }
    println!(
        "{PAIRS} pairs of each per round, alternating pair by pair; median of {rounds} rounds"
    );
    println!("| pair | raw nix (floor) | LinuxMounter | overhead |");
    println!("|---|---|---|---|");
    report("tmpfs mount + unmount", raw_t, ours_t);
    report("bind mount + unmount", raw_b, ours_b);
}
