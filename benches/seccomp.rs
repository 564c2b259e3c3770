//! Benchmark of the seccomp allowlist's two program shapes (`fork::sandbox::seccomp::
//! Dispatch`): seccompiler's linear chain and the binary search fork installs.
//!
//! Each sample is a fresh process (this binary re-executed with `--child SHAPE`) that
//! compiles the shipped profile, sets no_new_privs, then times: the installation of both
//! filters (`seccomp(SET_MODE_FILTER)` twice: the kernel checks, converts and JITs each
//! program and runs it for every syscall number to find the always-allowed ones), a
//! `getpid` loop (an always-allowed syscall: the kernel skips the filter), and an
//! `ioctl(TCGETS)` loop on /dev/null (a syscall with an argument rule: the filter runs each
//! time; the kernel answers ENOTTY). Shapes (and a run with no filter, for the syscalls' own cost) alternate sample by
//! sample, so drift in the machine's load hits all alike; medians are printed.
//!
//! Before that, the compilation of the profile into each shape is timed in-process.
//!
//! Run: `cargo bench --bench seccomp`. Environment: FORK_BENCH_RUNS (samples per shape,
//! 40), FORK_BENCH_CALLS (syscalls per loop, 200000).

use fork::sandbox::seccomp::{compile_json_with, Dispatch};
use std::process::Command;
use std::time::Instant;

const PROFILE: &str = include_str!("../policies/seccomp/default.json");

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One sample: prints `install_us getpid_ns ioctl_ns instructions`.
fn child(shape: &str) {
    let calls: u32 = env_or("FORK_BENCH_CALLS", 200_000);
    let dispatch = match shape {
        "linear" => Some(Dispatch::Linear),
        "search" => Some(Dispatch::BinarySearch),
        _ => None,
    };
    let profile = dispatch.map(|d| compile_json_with("default", PROFILE.as_bytes(), d).unwrap());
    let null = std::fs::File::open("/dev/null").expect("/dev/null");
    nix::sys::prctl::set_no_new_privs().expect("no_new_privs");
    let t = Instant::now();
    if let Some(p) = &profile {
        p.install().expect("install");
    }
    let install = t.elapsed();
    let t = Instant::now();
    for _ in 0..calls {
        std::hint::black_box(std::process::id());
    }
    let getpid = t.elapsed();
    let t = Instant::now();
    for _ in 0..calls {
        let _ = std::hint::black_box(nix::sys::termios::tcgetattr(&null));
    }
    let ioctl = t.elapsed();
    let insns = profile.map_or(0, |p| p.instruction_counts()["successor"]);
    println!(
        "{} {} {} {insns}",
        install.as_secs_f64() * 1e6,
        getpid.as_secs_f64() * 1e9 / f64::from(calls),
        ioctl.as_secs_f64() * 1e9 / f64::from(calls)
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(&args[i + 1]);
        return;
    }
    let runs: usize = env_or("FORK_BENCH_RUNS", 40);
    // Compilation (in the supervisor, once per process): both shapes, interleaved.
    let mut compile = [Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (i, d) in [Dispatch::Linear, Dispatch::BinarySearch]
            .into_iter()
            .enumerate()
        {
            let t = Instant::now();
            let p = compile_json_with("default", PROFILE.as_bytes(), d).expect("compiles");
            compile[i].push(t.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(p);
        }
    }
    println!(
        "compile (µs, median): linear {:.1}, search {:.1}",
        median(&mut compile[0]),
        median(&mut compile[1])
    );
    let exe = std::env::current_exe().expect("current_exe");
    let shapes = ["none", "linear", "search"];
    let mut samples: Vec<Vec<[f64; 4]>> = vec![Vec::new(); shapes.len()];
    for _ in 0..runs {
        for (i, shape) in shapes.iter().enumerate() {
            let out = Command::new(&exe)
                .args(["--child", shape])
                .output()
                .expect("run a sample");
            assert!(out.status.success(), "{shape}: {out:?}");
            let line = String::from_utf8_lossy(&out.stdout);
            let v: Vec<f64> = line
                .split_whitespace()
                .map(|x| x.parse().expect("a number"))
                .collect();
            samples[i].push([v[0], v[1], v[2], v[3]]);
        }
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "seccomp allowlist, {runs} samples per shape (medians), kernel {}",
        kernel.trim()
    );
    println!(
        "  {:<8} {:>6} {:>12} {:>12} {:>16}",
        "shape", "insns", "install µs", "getpid ns", "ioctl ns"
    );
    for (shape, s) in shapes.iter().zip(&samples) {
        let col = |k: usize| median(&mut s.iter().map(|x| x[k]).collect::<Vec<_>>());
        println!(
            "  {shape:<8} {:>6} {:>12.1} {:>12.1} {:>16.1}",
            col(3),
            col(0),
            col(1),
            col(2)
        );
    }
}
