//! Helpers shared by the inline tests that drive real cgroups: unique run ids, gated and
//! bounded child processes, and an independent reading of our own v1 cgroups.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub(super) fn unique(tag: &str) -> String {
    format!("test-{tag}-{}", uuid::Uuid::new_v4().simple())
}

pub(super) fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Spawns `sh -c 'read go; <script>'`: it blocks until released, so it is inside the
/// cgroup before it does any work.
pub(super) fn spawn_gated(script: &str) -> Child {
    Command::new("sh")
        .args(["-c", &format!("read go; {script}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

pub(super) fn release(child: &mut Child) {
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
}

pub(super) fn read_trim(path: &Path) -> String {
    fs::read_to_string(path).unwrap().trim().to_string()
}

/// Our own cgroup path for a v1 controller, read independently of the module.
pub(super) fn own_v1(controller: &str) -> String {
    let text = fs::read_to_string("/proc/self/cgroup").unwrap();
    text.lines()
        .find_map(|l| {
            let mut it = l.splitn(3, ':');
            let _ = it.next();
            let ctls = it.next()?;
            let path = it.next()?;
            ctls.split(',')
                .any(|c| c == controller)
                .then(|| path.to_string())
        })
        .unwrap()
}
