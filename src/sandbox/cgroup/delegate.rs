//! cgroup v2 delegation: making sure the controllers fork needs are enabled for the children
//! of our own cgroup, and honouring the "no internal processes" rule by moving only ourselves
//! into a leaf of our own.
//!
//! Hand-written: cgroups-rs's v2 `Cgroup::create` enables every controller the hierarchy root
//! lists, writing `cgroup.subtree_control` at the root and at every ancestor on the way, and
//! ignores the errors; fork only ever writes to its own cgroup and must tell the operator why a
//! write was refused.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::CgroupError;
use crate::ioerr::{IoContext, IoError};

/// The v2 leaf fork moves itself into when its own cgroup must stay process-free.
pub(super) const SUPERVISOR_LEAF: &str = "fork-supervisor";
/// v2 controllers we need.
pub(super) const V2_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];
/// The fix for missing v2 delegation.
pub const DELEGATE_FIX: &str = "start fork as the only process of a delegated cgroup: `systemd-run --user --scope -p Delegate=yes fork ...` (for root's own runs: `systemd-run --scope -p Delegate=yes fork ...`), or enable the controllers in the parent's cgroup.subtree_control";

/// How long fork waits, once it has moved itself into its leaf, for its own cgroup to empty
/// (see [`after_busy`]): an exiting thread is gone within milliseconds (the longest wait
/// seen, on an emulated guest, was about 20 ms).
const EMPTY_WAIT: Duration = Duration::from_millis(500);
/// The longest pause between two tries within [`EMPTY_WAIT`].
const EMPTY_POLL_MAX: Duration = Duration::from_millis(50);

/// What to do when enabling the controllers is refused as busy (the "no internal
/// processes" rule), given the processes `cgroup.procs` lists, our own pid, and how long we
/// have waited since we first moved into the leaf (`None`: not moved yet).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Busy {
    /// Another process is in our cgroup: fork is not the only process of a delegated cgroup.
    Refuse { others: usize },
    /// Only we are listed (before the move), or nobody (after it): move into the leaf if not
    /// done yet, wait `pause`, try again. A thread of ours that was exiting when the
    /// process moved is not moved by the kernel and keeps the cgroup populated until its
    /// exit is done; `cgroup.procs` lists thread-group leaders only, so it does not show.
    MoveAndRetry { pause: Duration },
    /// Still busy after [`EMPTY_WAIT`]: the write's error stands.
    GiveUp,
}

fn after_busy(procs: &[i32], me: i32, waited: Option<Duration>) -> Busy {
    let others = procs.iter().filter(|&&p| p != me).count();
    if others > 0 {
        return Busy::Refuse { others };
    }
    match waited {
        None => Busy::MoveAndRetry {
            pause: Duration::ZERO,
        },
        Some(w) if w >= EMPTY_WAIT => Busy::GiveUp,
        // The time waited so far plus 1 ms (the total roughly doubles), at most EMPTY_POLL_MAX.
        Some(w) => Busy::MoveAndRetry {
            pause: (w + Duration::from_millis(1)).min(EMPTY_POLL_MAX),
        },
    }
}

/// The whitespace-separated words of a file (`cgroup.controllers`, `cgroup.subtree_control`).
pub(super) fn read_words(path: &Path) -> Result<Vec<String>, CgroupError> {
    let text = fs::read_to_string(path).ctx("reading", path)?;
    Ok(text.split_whitespace().map(str::to_string).collect())
}

/// The pids listed in a `cgroup.procs` text.
fn parse_pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Makes sure memory, cpu and pids are enabled for children of `own_dir` (v2).
pub(super) fn ensure_v2_controllers(own_dir: &Path) -> Result<(), CgroupError> {
    let available = read_words(&own_dir.join("cgroup.controllers"))?;
    let missing: Vec<String> = V2_CONTROLLERS
        .iter()
        .filter(|c| !available.iter().any(|a| a == *c))
        .map(|c| c.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(CgroupError::NotDelegated {
            path: own_dir.to_path_buf(),
            missing,
            fix: DELEGATE_FIX.into(),
        });
    }
    let subtree = own_dir.join("cgroup.subtree_control");
    let enabled = read_words(&subtree)?;
    let to_enable: Vec<&str> = V2_CONTROLLERS
        .iter()
        .copied()
        .filter(|c| !enabled.iter().any(|e| e == c))
        .collect();
    if to_enable.is_empty() {
        return Ok(());
    }
    let line = to_enable
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    match fs::write(&subtree, &line) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            // We may be the only process: then move into a leaf so the parent may enable
            // controllers, and try again until our own stragglers are gone (see `Busy`).
            let procs_path = own_dir.join("cgroup.procs");
            let me = std::process::id() as i32;
            let leaf = own_dir.join(SUPERVISOR_LEAF);
            let leaf_procs = leaf.join("cgroup.procs");
            let mut moved: Option<Instant> = None;
            loop {
                let procs =
                    parse_pids(&fs::read_to_string(&procs_path).ctx("reading", &procs_path)?);
                match after_busy(&procs, me, moved.map(|t| t.elapsed())) {
                    Busy::Refuse { others } => {
                        return Err(CgroupError::InternalProcesses {
                            path: own_dir.to_path_buf(),
                            others,
                            fix: format!(
                                "{DELEGATE_FIX}; fork then moves itself into {SUPERVISOR_LEAF}"
                            ),
                        })
                    }
                    Busy::GiveUp => {
                        return Err(CgroupError::Write {
                            file: subtree.clone(),
                            value: line.clone(),
                            source: Box::new(io::Error::from_raw_os_error(libc::EBUSY)),
                        })
                    }
                    Busy::MoveAndRetry { pause } => {
                        if moved.is_some() {
                            tracing::debug!(
                                "{} still busy after fork moved into {SUPERVISOR_LEAF} (a thread of ours still exiting there?): trying again in {pause:?}",
                                own_dir.display()
                            );
                        }
                        std::thread::sleep(pause)
                    }
                }
                if moved.is_none() {
                    match fs::create_dir(&leaf) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(IoError::new("creating", &leaf, e).into()),
                    }
                    // The whole thread group, once: threads made later start in the leaf.
                    fs::write(&leaf_procs, me.to_string()).ctx("writing", &leaf_procs)?;
                    moved = Some(Instant::now());
                }
                match fs::write(&subtree, &line) {
                    Ok(()) => {
                        if let Some(t) = moved.filter(|t| t.elapsed() > Duration::from_millis(1)) {
                            tracing::debug!(
                                "{} emptied {:?} after fork moved into {SUPERVISOR_LEAF}",
                                own_dir.display(),
                                t.elapsed()
                            );
                        }
                        return Ok(());
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                    Err(source) => {
                        return Err(CgroupError::Write {
                            file: subtree.clone(),
                            value: line.clone(),
                            source: Box::new(source),
                        })
                    }
                }
            }
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EPERM | libc::EROFS)
            ) =>
        {
            Err(CgroupError::NotDelegated {
                path: own_dir.to_path_buf(),
                missing: to_enable.iter().map(|c| c.to_string()).collect(),
                fix: DELEGATE_FIX.into(),
            })
        }
        Err(source) => Err(CgroupError::Write {
            file: subtree,
            value: line,
            source: Box::new(source),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Busy with another process in our cgroup: refused at once, whatever the wait. Busy with
    /// only us (or nobody listed: a thread of ours still exiting there): move into the leaf
    /// and retry, pausing the time waited so far plus 1 ms, never more than EMPTY_POLL_MAX,
    /// and give up after EMPTY_WAIT.
    #[test]
    fn a_busy_cgroup_is_waited_for_only_while_the_stragglers_are_ours() {
        let me = 4242;
        for waited in [None, Some(Duration::ZERO), Some(EMPTY_WAIT)] {
            assert_eq!(
                after_busy(&[me, 17, 18], me, waited),
                Busy::Refuse { others: 2 }
            );
        }
        assert_eq!(
            after_busy(&[me], me, None),
            Busy::MoveAndRetry {
                pause: Duration::ZERO
            }
        );
        assert_eq!(
            after_busy(&[], me, Some(Duration::ZERO)),
            Busy::MoveAndRetry {
                pause: Duration::from_millis(1)
            }
        );
        assert_eq!(
            after_busy(&[me], me, Some(Duration::from_millis(3))),
            Busy::MoveAndRetry {
                pause: Duration::from_millis(4)
            }
        );
        assert_eq!(
            after_busy(&[], me, Some(EMPTY_WAIT - Duration::from_millis(1))),
            Busy::MoveAndRetry {
                pause: EMPTY_POLL_MAX
            }
        );
        assert_eq!(after_busy(&[], me, Some(EMPTY_WAIT)), Busy::GiveUp);
        assert_eq!(after_busy(&[me], me, Some(EMPTY_WAIT * 2)), Busy::GiveUp);
    }

    #[test]
    fn parses_cgroup_procs() {
        assert_eq!(parse_pids("12\n34\n\n"), vec![12, 34]);
    }

    /// The pure decisions, on plain files standing in for a v2 cgroup directory.
    #[test]
    fn enables_only_the_missing_controllers_and_names_the_undelegated_ones() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path();
        let subtree = own.join("cgroup.subtree_control");

        fs::write(own.join("cgroup.controllers"), "cpuset cpu io pids\n").unwrap();
        fs::write(&subtree, "").unwrap();
        match ensure_v2_controllers(own) {
            Err(CgroupError::NotDelegated { path, missing, fix }) => {
                assert_eq!(path, own);
                assert_eq!(missing, vec!["memory".to_string()]);
                assert_eq!(fix, DELEGATE_FIX);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(fs::read_to_string(&subtree).unwrap(), "");

        fs::write(own.join("cgroup.controllers"), "cpu memory io pids\n").unwrap();
        fs::write(&subtree, "cpu\n").unwrap();
        ensure_v2_controllers(own).unwrap();
        assert_eq!(fs::read_to_string(&subtree).unwrap(), "+memory +pids");

        fs::write(&subtree, "memory cpu pids\n").unwrap();
        ensure_v2_controllers(own).unwrap();
        assert_eq!(
            fs::read_to_string(&subtree).unwrap(),
            "memory cpu pids\n",
            "nothing rewritten when every controller is enabled"
        );
        assert!(!own.join(SUPERVISOR_LEAF).exists());
    }
}
