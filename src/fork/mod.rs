//! Lifecycle step 2, FORK: clone the runtime without disturbing it.
//!
//! * [`snapshot`]: the runtime's SQLite state, copied through SQLite (one image in one read
//!   transaction, or the online backup API for a large database) while the parent keeps
//!   running and writing; `image.rs` holds the one-image copy (`raw.rs`: a rollback-journal
//!   database's image copied as the file's bytes by the kernel under the shared lock,
//!   hashed while copied; `precopy.rs`: a large one's copied first with no lock held, then
//!   made the committed state under the lock; `walcopy.rs`: a live WAL-mode parent's database file and `-wal`
//!   copied by the kernel under a held read transaction, the WAL then replayed into the
//!   copy by SQLite; `pieces.rs`: its BLAKE3 kept piece by piece, so that only what the
//!   replay rewrote is hashed again), `sqlite.rs` what both copies share (options,
//!   statistics, errors, opening, checking and hashing), `digest.rs` the digest that names
//!   a copy (BLAKE3 by default, or SHA-256), `parent.rs` how a WAL-mode parent is read
//!   without creating a file beside it, `header.rs` the journal mode read from the
//!   parent's header under SQLite's SHARED lock (every read of a rollback-journal parent
//!   runs under it).
//! * [`workspace`]: the run's workspace layout (`src/ state/ tools/ reports/ home/`), the
//!   copy of the source tree and tool registry, and cleanup; `hashes.rs` the tree hashes
//!   (the source hash and listing every copy is checked by, the deployment hash a verdict
//!   signs), re-exported there.
//! * [`owner`]: what a root-run fork reads of a tree another user owns (only the files that
//!   user could read, in directories it could list and search: `acl.rs` holds a file's
//!   POSIX access ACL and the kernel's access check), and how it opens such a runtime's
//!   state stores as that user.

pub(crate) mod acl;
pub mod copyback;
pub mod digest;
pub mod error;
mod hashes;
mod header;
mod image;
pub mod owner;
pub mod parent;
mod pieces;
mod precopy;
mod raw;
pub mod snapshot;
#[cfg(test)]
mod snapshot_wal_tests;
mod sqlite;
pub mod tree;
mod walcopy;
pub mod workspace;

pub use snapshot::{
    check_copy, snapshot, IntegrityCheck, SnapshotError, SnapshotMethod, SnapshotOptions,
    SnapshotStats, StateDigest,
};
pub use workspace::{
    copy_tree, deploy_tree_hash, remove_tree, tree_and_deploy_hashes, tree_hash, CopyStats,
    TreeListing, Workspace, WorkspaceError,
};
