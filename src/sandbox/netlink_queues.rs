//! The sandbox's netlink receive queues, counted by the supervisor against the memory
//! budget (no cgroup charges them).

/// The receive queues of the netlink sockets in the sandbox's network namespace. No cgroup
/// charges netlink memory (neither v1's memory counter nor its tcp one): a NETLINK_ROUTE
/// socket holds the kernel's unread replies to its requests up to its receive buffer (up
/// to twice the host's `net.core.rmem_max` with SO_RCVBUF, which a child network namespace
/// cannot lower), so the supervisor counts them itself, every tick, against the memory
/// budget. Read from `/proc/<init>/net/netlink`, opened while the init is our child and
/// not yet released: the open file keeps naming that namespace.
pub(super) struct NetlinkQueues {
    file: std::fs::File,
    buf: Vec<u8>,
}

impl NetlinkQueues {
    /// Opens the netlink table of `pid`'s network namespace.
    pub(super) fn open(pid: i32) -> std::io::Result<Self> {
        Ok(NetlinkQueues {
            file: std::fs::File::open(format!("/proc/{pid}/net/netlink"))?,
            buf: Vec::with_capacity(NETLINK_TABLE_MAX + CHUNK),
        })
    }

    /// The bytes queued for reading on every netlink socket of the namespace (the table's
    /// `Rmem` column, the sockets' `sk_rmem_alloc`: the buffers' true size). A table that
    /// cannot be read, or is longer than [`NETLINK_TABLE_MAX`] (more sockets than any
    /// ordinary program holds), counts as `None`.
    pub(super) fn queued(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        self.buf.clear();
        let mut chunk = [0u8; CHUNK];
        loop {
            if self.buf.len() > NETLINK_TABLE_MAX {
                return None;
            }
            match self.file.read_at(&mut chunk, self.buf.len() as u64) {
                Ok(0) => break,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(netlink_rmem(&String::from_utf8_lossy(&self.buf)))
    }
}

/// One read of the table.
const CHUNK: usize = 16 << 10;

/// The longest netlink table read (about 740 sockets at about 88 bytes a line; a program
/// holds a few): a sandbox with more is stopped as over its memory budget, since its
/// netlink memory can no longer be counted at a cost bounded per look. The bound is what
/// keeps every look cheap: the kernel makes the table by walking its global netlink hash,
/// every namespace's sockets, so one sandbox's sockets slow every supervisor's look (and
/// every reader of a netlink table on the host). 40,000 sockets under the former 4 MiB
/// bound cost their supervisor 4.1 s of system CPU in 8.4 s; 700 cost about 1 ms a look.
pub(super) const NETLINK_TABLE_MAX: usize = 64 << 10;

/// The sum of the `Rmem` column of a `/proc/net/netlink` table.
fn netlink_rmem(table: &str) -> u64 {
    let mut lines = table.lines();
    let col = lines
        .next()
        .and_then(|h| h.split_whitespace().position(|c| c == "Rmem"))
        .unwrap_or(4);
    lines
        .filter_map(|l| l.split_whitespace().nth(col)?.parse::<u64>().ok())
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::{NetlinkQueues, NETLINK_TABLE_MAX};

    const HEADER: &str = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n";
    const LINE: &str =
        "00000000aa11bb22 0   813        00000000 4096     0        0     2        0        1508\n";

    fn open(path: &std::path::Path, text: &str) -> NetlinkQueues {
        std::fs::write(path, text).unwrap();
        NetlinkQueues {
            file: std::fs::File::open(path).unwrap(),
            buf: Vec::new(),
        }
    }

    #[test]
    fn netlink_rmem_sums_the_rmem_column() {
        let table = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
                     00000000f362d450 0   0          00000000 0        0        0     2        0        4\n\
                     000000003eefd69d 0   812        00000000 2304     0        0     2        0        1507\n\
                     00000000aa11bb22 0   813        00000000 8392704  0        0     2        0        1508\n";
        assert_eq!(super::netlink_rmem(table), 2304 + 8392704);
        assert_eq!(super::netlink_rmem(""), 0);
    }

    /// A table up to the bound is read and summed, each look from its start; a longer one
    /// is not read to its end: it counts as unreadable, and the run is stopped as over
    /// memory (fail closed), whatever it holds.
    #[test]
    fn a_netlink_table_past_its_bound_is_not_read_to_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("netlink");
        let mut small = open(&path, &format!("{HEADER}{}", LINE.repeat(3)));
        assert_eq!(small.queued(), Some(3 * 4096));
        assert_eq!(
            small.queued(),
            Some(3 * 4096),
            "a second look reads it again"
        );
        let at_bound = (NETLINK_TABLE_MAX - HEADER.len()) / LINE.len();
        let mut full = open(&path, &format!("{HEADER}{}", LINE.repeat(at_bound)));
        assert_eq!(full.queued(), Some(at_bound as u64 * 4096));
        let mut over = open(&path, &format!("{HEADER}{}", LINE.repeat(at_bound + 100)));
        assert_eq!(over.queued(), None);
    }

    /// The bound is what ordinary programs need, not what a look can afford: a thousand
    /// sockets (a few hundred KiB of table, about 1.5 ms of the kernel's time a look, and
    /// as much for every other reader on the host) are past it.
    #[test]
    fn a_thousand_netlink_sockets_are_past_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let mut many = open(
            &dir.path().join("netlink"),
            &format!("{HEADER}{}", LINE.repeat(1000)),
        );
        assert_eq!(many.queued(), None);
    }
}
