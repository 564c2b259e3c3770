//! `fork keygen`: creating a key file and its public half beside it, one generation at a
//! time per directory, never replacing another key's public half.

use super::{public_key_path, read_public_key, IdentityError, PublicKey};
use crate::ioerr::{IoContext, IoError};
use ed25519_dalek::SigningKey;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a key generation waits for another one in the same directory to finish.
const LOCK_WAIT: Duration = Duration::from_secs(30);

fn sync_dir(dir: &Path) -> Result<(), IdentityError> {
    Ok(fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("sync directory", dir)?)
}

/// Creates the node key at `path` (mode 0600; parent directories created 0700) and its
/// public half beside it ([`public_key_path`], mode 0644). Both are written whole to
/// temporary names and synced first; then the key takes its name, then the public half
/// (without `force`, a failure there removes the key again), so another process that finds
/// the key finds all of it. Without `force` neither may exist (the moves refuse to replace
/// one, atomically, like `O_EXCL`); a key path that is its own public path (`X.pub`) is
/// refused, since the public half would replace the key.
///
/// Generations in one directory take turns: each holds an exclusive `flock` on the
/// directory itself from its checks to its last rename, so two `--force` runs can never
/// leave one's key beside the other's public half. And a public file that is not the
/// public half of the key at `path` (there is no key there, or its public half differs,
/// or either cannot be read) is never replaced, even with `force`
/// ([`IdentityError::PublicOfAnotherKey`]): `keygen --out node.steward` beside `node.key`
/// would otherwise replace the node's `node.pub`.
pub fn generate_node_key(path: &Path, force: bool) -> Result<PublicKey, IdentityError> {
    // A directory is never a key path, with or without `force` (the rename onto it failed
    // late, `Is a directory`, exit 70): refused before anything is made.
    if fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(IdentityError::KeyPathIsDirectory {
            path: path.to_path_buf(),
        });
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let pub_path = public_key_path(path);
    if pub_path == path {
        return Err(IdentityError::KeyIsPublicPath {
            path: path.to_path_buf(),
        });
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&parent)
        .ctx("create directory", &parent)?;
    // Held until both files are in place (dropped on return).
    let _turn = lock_key_dir(&parent)?;
    check_replaceable(path, &pub_path, force)?;

    let signing = SigningKey::generate(&mut rand::rngs::OsRng);
    let public = PublicKey(signing.verifying_key());
    let text = crate::keyformat::encode_private_pkcs8(&signing)
        .map_err(|e| IoError::new("encode", path, io::Error::other(e)))?;

    let mut key_tmp = tempfile::Builder::new()
        .prefix(".node-key-")
        .permissions(fs::Permissions::from_mode(0o600))
        .tempfile_in(&parent)
        .ctx("create a temporary file in", &parent)?;
    key_tmp
        .write_all(text.as_bytes())
        .and_then(|_| key_tmp.as_file().sync_all())
        .ctx("write", key_tmp.path())?;
    let mut pub_tmp = tempfile::Builder::new()
        .prefix(".node-pub-")
        .permissions(fs::Permissions::from_mode(0o644))
        .tempfile_in(&parent)
        .ctx("create a temporary file in", &parent)?;
    write!(pub_tmp, "{}", public.to_spki_pem())
        .and_then(|_| pub_tmp.as_file().sync_all())
        .ctx("write", pub_tmp.path())?;

    let placed = |r: Result<fs::File, tempfile::PersistError>, to: &Path| {
        r.map(drop).map_err(|e| {
            if e.error.kind() == io::ErrorKind::AlreadyExists {
                IdentityError::KeyExists {
                    path: to.to_path_buf(),
                }
            } else {
                IoError::new("write", to, e.error).into()
            }
        })
    };
    if force {
        placed(key_tmp.persist(path), path)?;
        placed(pub_tmp.persist(&pub_path), &pub_path)?;
    } else {
        placed(key_tmp.persist_noclobber(path), path)?;
        if let Err(e) = placed(pub_tmp.persist_noclobber(&pub_path), &pub_path) {
            // Ours, made just now: no key is left without its public half.
            let _ = fs::remove_file(path);
            return Err(e);
        }
    }
    sync_dir(&parent)?;
    Ok(public)
}

/// An exclusive `flock` on the key directory: other generations there wait their turn (at
/// most [`LOCK_WAIT`]). No lock file is left behind: the directory itself is locked.
fn lock_key_dir(dir: &Path) -> Result<Flock<fs::File>, IdentityError> {
    let deadline = Instant::now() + LOCK_WAIT;
    let mut file = fs::File::open(dir).ctx("open the key directory", dir)?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                file = f;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(IoError::new(
                    "lock the key directory",
                    dir,
                    io::Error::other(format!(
                        "another key generation there has held it for {} s; try again once \
                         it has finished",
                        LOCK_WAIT.as_secs()
                    )),
                )
                .into())
            }
            Err((_, e)) => return Err(IoError::new("lock the key directory", dir, e.into()).into()),
        }
    }
}

/// What may be replaced (under the directory's lock): without `force`, nothing; with it,
/// the key at `path` and a public file that is that key's own public half. A public file
/// with no key beside it, or whose key cannot be read or has another public half, belongs
/// to another key (or to no known one) and is refused either way.
fn check_replaceable(path: &Path, pub_path: &Path, force: bool) -> Result<(), IdentityError> {
    let key_exists = fs::symlink_metadata(path).is_ok();
    let pub_exists = fs::symlink_metadata(pub_path).is_ok();
    let another = |reason: String| IdentityError::PublicOfAnotherKey {
        key: path.to_path_buf(),
        public: pub_path.to_path_buf(),
        reason,
    };
    if pub_exists && !key_exists {
        return Err(another(format!("there is no key at {}", path.display())));
    }
    if !force {
        for p in [path, pub_path] {
            if fs::symlink_metadata(p).is_ok() {
                return Err(IdentityError::KeyExists {
                    path: p.to_path_buf(),
                });
            }
        }
        return Ok(());
    }
    if !pub_exists {
        return Ok(());
    }
    let key_public = public_of_key_file(path)
        .map_err(|e| another(format!("the key there cannot be read: {e}")))?;
    match read_public_key(pub_path) {
        Ok(p) if p == key_public => Ok(()),
        Ok(p) => Err(another(format!(
            "it holds {p}, the key there is {key_public}"
        ))),
        Err(e) => Err(another(format!("it cannot be read as a public key: {e}"))),
    }
}

/// The public half of the key file at `path`, whatever its mode (a key about to be
/// replaced); opened without waiting for a FIFO's writer, a regular file only, bounded.
fn public_of_key_file(path: &Path) -> Result<PublicKey, IdentityError> {
    let file = crate::fsx::open_input(path).ctx("open", path)?;
    let signing = super::read_signing_key(file, path)?;
    Ok(PublicKey(signing.verifying_key()))
}
