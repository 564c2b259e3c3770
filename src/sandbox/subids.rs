//! Subordinate ids: without root, the distinct uid and gid of each sandbox come from the
//! user's ranges in `/etc/subuid` and `/etc/subgid`, mapped into fork's own user namespace
//! by the setuid helpers `newuidmap` and `newgidmap` (package `uidmap`), as rootless
//! container engines do.
//!
//! The helpers must write the maps from outside the namespace (a setuid program started
//! inside it is not setuid there), and only once fork has entered it: [`Helper::spawn`]
//! forks each one before the `unshare`, blocked on a pipe, and [`Helper::release`] lets it
//! exec and waits for it. The maps are identities (the user's own id, then the range at
//! the same numbers), so every id the supervisor sees is the host's.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The fewest subordinate ids fork uses: each run draws one at random, so four runs at
/// once share one with a chance of about 1e-4 at this size.
pub const MIN_IDS: u64 = 65536;

/// One contiguous range of subordinate ids (`start` .. `start + count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u32,
    pub count: u32,
}

/// The user's ranges fork maps: one for uids, one for gids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranges {
    pub uid: Range,
    pub gid: Range,
}

impl Ranges {
    /// A fresh uid and gid for one run, at the same random offset in both ranges.
    pub fn draw(&self) -> (u32, u32) {
        let n = u64::from_str_radix(&crate::rundir::new_run_id()[..15], 16).unwrap_or(0);
        let off = (n % u64::from(self.uid.count.min(self.gid.count))) as u32;
        (self.uid.start + off, self.gid.start + off)
    }
}

/// The fix printed wherever a user's sandboxes share the user's uid.
pub fn fix(user: &str) -> String {
    format!(
        "add a range for {user} to /etc/subuid and /etc/subgid (usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}) and install uidmap (newuidmap, newgidmap)"
    )
}

/// The first range of at least [`MIN_IDS`] ids given in `text` (the contents of
/// `/etc/subuid` or `/etc/subgid`: `name-or-id:start:count` lines) to the user named `name`
/// or numbered `id`, that does not hold `own` (the user's own id, mapped beside it).
pub fn find_range(text: &str, name: &str, id: u32, own: u32) -> Option<Range> {
    text.lines().find_map(|line| {
        let mut f = line.trim().splitn(3, ':');
        let who = f.next()?;
        if who != name && who.parse::<u32>().ok() != Some(id) {
            return None;
        }
        let start: u32 = f.next()?.trim().parse().ok()?;
        let count: u64 = f.next()?.trim().parse().ok()?;
        // Only as many ids as fit below 2^32 - 1 (the kernel's invalid id).
        let count = count.min(u64::from(u32::MAX) - u64::from(start));
        let holds_own = own >= start && u64::from(own - start) < count;
        (count >= MIN_IDS && !holds_own && start > 0).then_some(Range {
            start,
            count: count as u32,
        })
    })
}

/// The user's ranges and the two helpers, or why fork cannot use them (the reason
/// names what is missing).
pub fn lookup(uid: u32, gid: u32) -> Result<(Ranges, [PathBuf; 2]), String> {
    let name = user_name(uid);
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let (subuid, subgid) = (read("/etc/subuid"), read("/etc/subgid"));
    let uid_range = find_range(&subuid, &name, uid, uid);
    let gid_range = find_range(&subgid, &name, uid, gid);
    let (Some(u), Some(g)) = (uid_range, gid_range) else {
        let missing = match (uid_range, gid_range) {
            (None, None) => "/etc/subuid and /etc/subgid give",
            (None, _) => "/etc/subuid gives",
            _ => "/etc/subgid gives",
        };
        return Err(format!(
            "{missing} {name} no range of at least {MIN_IDS} ids apart from its own"
        ));
    };
    let (Some(newuidmap), Some(newgidmap)) = (helper("newuidmap"), helper("newgidmap")) else {
        return Err("newuidmap or newgidmap (package uidmap) is not installed".into());
    };
    Ok((Ranges { uid: u, gid: g }, [newuidmap, newgidmap]))
}

/// The user's name from the password database, else the number.
pub fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// The path of a helper: the first executable file of that name on `PATH`, then in
/// /usr/bin and /bin.
fn helper(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A helper forked before fork's `unshare`, waiting to be released.
pub struct Helper {
    pid: nix::unistd::Pid,
    go: OwnedFd,
    errors: OwnedFd,
    what: String,
}

impl Helper {
    /// Forks a child that, once released, runs `program` with `args` (its output kept for
    /// the error). Contract: the calling process has a single thread.
    pub fn spawn(program: &Path, args: &[String]) -> Result<Helper, String> {
        let what = format!("{} {}", program.display(), args.join(" "));
        let cstr = |s: &str| CString::new(s).map_err(|_| format!("{s:?} holds a NUL byte"));
        let prog = cstr(&program.to_string_lossy())?;
        let mut argv = vec![prog.clone()];
        for a in args {
            argv.push(cstr(a)?);
        }
        let (go_rd, go_wr) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        let (err_rd, err_wr) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        match super::sys::fork_single_threaded().map_err(|e| format!("fork: {e}"))? {
            nix::unistd::ForkResult::Child => {
                // Without the write end here, the parent's death (its end closed) is EOF.
                drop(go_wr);
                drop(err_rd);
                let mut b = [0u8];
                if nix::unistd::read(go_rd.as_fd(), &mut b) != Ok(1)
                    || nix::unistd::dup2_stdout(err_wr.as_fd()).is_err()
                    || nix::unistd::dup2_stderr(err_wr.as_fd()).is_err()
                {
                    super::sys::exit_now(127);
                }
                let _ = nix::unistd::execv(&prog, &argv);
                super::sys::exit_now(127)
            }
            nix::unistd::ForkResult::Parent { child } => Ok(Helper {
                pid: child,
                go: go_wr,
                errors: err_rd,
                what,
            }),
        }
    }

    /// Lets the helper run, waits for it; on failure what it said.
    pub fn release(self) -> Result<(), String> {
        use nix::sys::wait::{waitpid, WaitStatus};
        let sent = nix::unistd::write(&self.go, &[1u8]);
        drop(self.go);
        let status = waitpid(self.pid, None);
        let mut said = Vec::new();
        let mut file = std::fs::File::from(self.errors);
        let _ = std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, 4096), &mut said);
        let said = String::from_utf8_lossy(&said).trim().to_string();
        match (sent, status) {
            (Ok(1), Ok(WaitStatus::Exited(_, 0))) => Ok(()),
            (_, Ok(WaitStatus::Exited(_, 127))) if said.is_empty() => {
                Err(format!("{} could not be started", self.what))
            }
            (_, st) => Err(format!(
                "{} failed ({}){}",
                self.what,
                match st {
                    Ok(WaitStatus::Exited(_, c)) => format!("exit {c}"),
                    Ok(other) => format!("{other:?}"),
                    Err(e) => e.to_string(),
                },
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {said}")
                }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_found_by_name_or_id_and_must_be_large_enough_and_apart() {
        let text = "alice:100000:65536\n1234:300000:70000\nbob:200000:100\n";
        let r = |n, id, own| find_range(text, n, id, own);
        assert_eq!(
            r("alice", 1000, 1000),
            Some(Range {
                start: 100000,
                count: 65536
            })
        );
        assert_eq!(r("carol", 1234, 1234).unwrap().start, 300000);
        assert_eq!(r("bob", 1001, 1001), None, "too few ids");
        assert_eq!(r("alice", 1000, 100005), None, "holds the user's own id");
        assert_eq!(r("dave", 1, 1), None);
    }

    #[test]
    fn drawn_ids_stay_inside_both_ranges_and_vary() {
        let rs = Ranges {
            uid: Range {
                start: 100000,
                count: 65536,
            },
            gid: Range {
                start: 500000,
                count: 70000,
            },
        };
        let drawn: std::collections::BTreeSet<(u32, u32)> = (0..64).map(|_| rs.draw()).collect();
        assert!(drawn.len() > 1);
        for (u, g) in drawn {
            assert!((100000..165536).contains(&u), "{u}");
            assert_eq!(g - 500000, u - 100000);
        }
    }
}
