//! Identities: the node's long-term ed25519 key and the per-run ephemeral keys.
//!
//! * The **node key** is the node's long-term identity (`fork keygen`). It stays on the
//!   host, outside every sandbox, and endorses each run's ephemeral key. It lives in
//!   `$XDG_CONFIG_HOME/fork/node.key` (else `$HOME/.config/fork/node.key`), mode 0600,
//!   in a directory created 0700, with the public half beside it in `node.pub`.
//! * An **ephemeral key** is generated for one run (lifecycle step 2), signs that run's
//!   verdict, and is destroyed (zeroized) as soon as the verdict is signed.
//!
//! Secrets only ever sit in zeroizing memory: `ed25519_dalek::SigningKey` zeroizes itself
//! on drop (the `zeroize` feature), and every buffer that holds the seed or its encoding
//! is a [`zeroize::Zeroizing`].
//!
//! # Public keys
//! Public keys are spelled `ed25519:<base64>` everywhere (standard alphabet, padded, 32
//! bytes), see [`PublicKey::parse`] and its `Display`. A key id is the first 16 hex
//! characters of the sha256 of the 32 public key bytes ([`PublicKey::key_id`]).
//!
//! # Node key file format
//! Written as PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`, RFC 8410), with the public half
//! beside it as SubjectPublicKeyInfo PEM; read also from unencrypted OpenSSH private keys
//! (see [`crate::keyformat`]) and from fork's own earlier format, a small PEM-like file:
//! ```text
//! -----BEGIN FORK NODE KEY-----
//! Key-Type: ed25519
//! Public-Key: ed25519:<base64 of the 32-byte public key>
//!
//! <base64 of the 32-byte ed25519 seed (the secret key)>
//! -----END FORK NODE KEY-----
//! ```
//! Headers come first, then one empty line, then the base64 seed. `Key-Type` is required;
//! `Public-Key` is optional on load, but when present it must match the seed (this catches
//! a damaged or hand-edited file). Earlier `node.pub` files hold the single line
//! `ed25519:<base64>`; [`read_public_key`] reads every format.

use crate::ioerr::{IoContext, IoError};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use thiserror::Error;
use zeroize::Zeroizing;

mod keygen;
pub use keygen::generate_node_key;

/// The prefix of every public key spelling.
pub const PUBLIC_KEY_PREFIX: &str = "ed25519:";
/// The first line of a node key file.
pub const NODE_KEY_BEGIN: &str = "-----BEGIN FORK NODE KEY-----";
/// The last line of a node key file.
pub const NODE_KEY_END: &str = "-----END FORK NODE KEY-----";
/// Largest node key file accepted (a real one is about 200 bytes).
const MAX_KEY_FILE_BYTES: u64 = 4096;

/// Errors of key generation, loading, parsing and signature checks.
#[derive(Debug, Error)]
pub enum IdentityError {
    #[error("a node key already exists at {path}: pass --force to replace it (the old identity is then lost for good)")]
    KeyExists { path: PathBuf },
    #[error("{public} is not the public half of the key {key} ({reason}), so it is not replaced, even with --force (the key it belongs to would be left without it): give the new key another name (its public half goes to NAME.pub), or remove {public} yourself if no key needs it")]
    PublicOfAnotherKey {
        key: PathBuf,
        public: PathBuf,
        reason: String,
    },
    #[error("{path} ends in .pub, where its public half would be written: give the key another name (the public half goes to NAME.pub)")]
    KeyIsPublicPath { path: PathBuf },
    #[error("no node key at {path}: create one with `fork keygen` (or pass --key FILE)")]
    KeyMissing { path: PathBuf },
    #[error("node key {path} is accessible by group or others (mode {mode:04o}): run `chmod 600 {path}`")]
    InsecurePermissions { path: PathBuf, mode: u32 },
    #[error("node key {path} is not a regular file: point --key at the key file itself")]
    NotAFile { path: PathBuf },
    #[error("node key {path} is malformed: {reason}; restore it from a backup or create a new one with `fork keygen --force`")]
    Malformed { path: PathBuf, reason: String },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("`{input}` is not a public key: {reason} (expected ed25519:<base64 of 32 bytes>, a SubjectPublicKeyInfo PEM key or an OpenSSH `ssh-ed25519` line, or a file holding one)")]
    BadPublicKey { input: String, reason: String },
    #[error("`{input}` is neither a file nor a public key: no such file, and a key starts with `ed25519:`, `-----BEGIN PUBLIC KEY-----` or `ssh-ed25519` (check the path)")]
    NoKeyFile { input: String },
    #[error("`{input}` is not a regular file: name the key file itself, or give the key")]
    NotAKeyFile { input: String },
    #[error("the signature does not verify with key {key}")]
    BadSignature { key: String },
    #[error("{path} is a directory: name the key file itself (its public half goes beside it, NAME.pub), e.g. {path}/node.key")]
    KeyPathIsDirectory { path: PathBuf },
}

impl IdentityError {
    /// Whether a key file named on the command line is not what a key file must be (a
    /// directory, a FIFO, a device): bad input (exit 65), as any input that is not a
    /// regular file; the other failures to load a key are the flag's (64) or fork's.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, IdentityError::NotAFile { .. })
    }
}

/// An ed25519 public key, spelled `ed25519:<base64>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// Builds a key from its 32 bytes; refuses points that are not on the curve and the
    /// weak (small-order) keys for which a signature proves nothing.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PublicKey, IdentityError> {
        let bad = |reason: &str| IdentityError::BadPublicKey {
            input: format!("{PUBLIC_KEY_PREFIX}{}", STANDARD.encode(bytes)),
            reason: reason.to_string(),
        };
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| bad("not a point on the curve"))?;
        if key.is_weak() {
            return Err(bad("a weak (small-order) key"));
        }
        Ok(PublicKey(key))
    }

    /// Parses `ed25519:<base64>` (standard alphabet, padded, 32 bytes).
    pub fn parse(s: &str) -> Result<PublicKey, IdentityError> {
        let shown: String = s.chars().take(80).collect();
        let bad = |reason: &str| IdentityError::BadPublicKey {
            input: shown.clone(),
            reason: reason.to_string(),
        };
        let b64 = s
            .strip_prefix(PUBLIC_KEY_PREFIX)
            .ok_or_else(|| bad("it does not start with `ed25519:`"))?;
        let raw = STANDARD
            .decode(b64)
            .map_err(|e| bad(&format!("bad base64 ({e})")))?;
        let bytes: [u8; 32] = raw
            .as_slice()
            .try_into()
            .map_err(|_| bad(&format!("{} bytes instead of 32", raw.len())))?;
        PublicKey::from_bytes(&bytes).map_err(|e| match e {
            IdentityError::BadPublicKey { reason, .. } => bad(&reason),
            other => other,
        })
    }

    /// Parses a public key in any format a user may hold it in: fork's `ed25519:<base64>`,
    /// SubjectPublicKeyInfo PEM (`-----BEGIN PUBLIC KEY-----`) or an OpenSSH line
    /// (`ssh-ed25519 AAAA... comment`). Documents fork writes keep [`PublicKey::parse`].
    pub fn parse_any(text: &str) -> Result<PublicKey, IdentityError> {
        let t = text.trim();
        match crate::keyformat::decode_public(t) {
            None => PublicKey::parse(t),
            Some(decoded) => {
                let shown: String = t.chars().take(80).collect();
                let bytes = decoded.map_err(|reason| IdentityError::BadPublicKey {
                    input: shown.clone(),
                    reason,
                })?;
                PublicKey::from_bytes(&bytes).map_err(|e| match e {
                    IdentityError::BadPublicKey { reason, .. } => IdentityError::BadPublicKey {
                        input: shown,
                        reason,
                    },
                    other => other,
                })
            }
        }
    }

    /// SubjectPublicKeyInfo PEM (what `openssl pkey -pubin` reads).
    pub fn to_spki_pem(&self) -> String {
        // Invariant: encoding a valid ed25519 point into memory cannot fail.
        crate::keyformat::encode_public_spki(&self.0).unwrap_or_default()
    }

    /// One OpenSSH `authorized_keys`-style line with `comment`.
    pub fn to_openssh(&self, comment: &str) -> String {
        crate::keyformat::encode_public_openssh(&self.0, comment).unwrap_or_default()
    }

    /// The 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }

    /// The first 16 hex characters of sha256(public key bytes).
    pub fn key_id(&self) -> String {
        let digest = Sha256::digest(self.as_bytes());
        let mut id = hex::encode(digest);
        id.truncate(16);
        id
    }

    /// Verifies an ed25519 signature (strict verification: rejects malleable signatures).
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), IdentityError> {
        let bad = || IdentityError::BadSignature {
            key: self.to_string(),
        };
        let sig = Signature::from_slice(signature).map_err(|_| bad())?;
        self.0.verify_strict(message, &sig).map_err(|_| bad())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PUBLIC_KEY_PREFIX}{}", STANDARD.encode(self.as_bytes()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl FromStr for PublicKey {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PublicKey::parse(s)
    }
}

impl serde::Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PublicKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Parses `ed25519:<base64>`; same as [`PublicKey::parse`].
pub fn parse_public_key(s: &str) -> Result<PublicKey, IdentityError> {
    PublicKey::parse(s)
}

/// Spells a key `ed25519:<base64>`; same as its `Display`.
pub fn format_public_key(key: &PublicKey) -> String {
    key.to_string()
}

/// Anything that can sign with an ed25519 key: the node key and ephemeral keys.
pub trait SigningIdentity {
    /// The public half.
    fn public_key(&self) -> PublicKey;
    /// An ed25519 signature over `message`.
    fn sign_message(&self, message: &[u8]) -> [u8; 64];
}

/// The node's long-term identity key, loaded from its file (or generated in memory).
/// The secret is zeroized when this value is dropped.
pub struct NodeKey {
    signing: SigningKey,
    public: PublicKey,
    path: Option<PathBuf>,
}

impl NodeKey {
    /// A fresh node key that lives only in memory (tests, tools); use
    /// [`generate_node_key`] for the persistent one.
    pub fn generate() -> NodeKey {
        NodeKey::from_signing(SigningKey::generate(&mut rand::rngs::OsRng), None)
    }

    fn from_signing(signing: SigningKey, path: Option<PathBuf>) -> NodeKey {
        // A key derived from a uniformly random or stored seed; its public half is a valid
        // curve point by construction, so no check is needed here.
        let public = PublicKey(signing.verifying_key());
        NodeKey {
            signing,
            public,
            path,
        }
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// The file this key was loaded from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Signs `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }
}

impl SigningIdentity for NodeKey {
    fn public_key(&self) -> PublicKey {
        self.public
    }
    fn sign_message(&self, message: &[u8]) -> [u8; 64] {
        self.sign(message)
    }
}

impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeKey")
            .field("public", &self.public)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A per-run key: generated at FORK, signs the verdict, destroyed right after.
/// The secret lives in zeroizing memory and is wiped on drop or [`EphemeralKey::destroy`].
pub struct EphemeralKey {
    signing: SigningKey,
    public: PublicKey,
}

impl EphemeralKey {
    /// A fresh keypair from the operating system's random source.
    pub fn generate() -> EphemeralKey {
        let signing = SigningKey::generate(&mut rand::rngs::OsRng);
        let public = PublicKey(signing.verifying_key());
        EphemeralKey { signing, public }
    }

    /// The public half (it goes into the verdict as `successor_key`).
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// Signs `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }

    /// Wipes the secret now. (Dropping does the same; this makes the moment explicit.)
    pub fn destroy(self) {
        drop(self);
    }
}

impl SigningIdentity for EphemeralKey {
    fn public_key(&self) -> PublicKey {
        self.public
    }
    fn sign_message(&self, message: &[u8]) -> [u8; 64] {
        self.sign(message)
    }
}

impl fmt::Debug for EphemeralKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EphemeralKey")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

/// The directory holding the node key: `$XDG_CONFIG_HOME/fork`, else `$HOME/.config/fork`
/// (else the home directory from the password database). The sandbox masks it.
pub fn node_key_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME") {
        let x = PathBuf::from(x);
        if x.is_absolute() {
            return x.join("fork");
        }
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.dir)
        })
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".config").join("fork")
}

/// `node_key_dir()/node.key`.
pub fn default_node_key_path() -> PathBuf {
    node_key_dir().join("node.key")
}

/// Where the public half of the key at `key_path` is written: the same name with the
/// extension `.pub` (`node.key` → `node.pub`).
pub fn public_key_path(key_path: &Path) -> PathBuf {
    key_path.with_extension("pub")
}

/// The fork format's text (read for keys written before PKCS#8; kept for the tests).
#[cfg(test)]
fn encode_legacy_key_file(signing: &SigningKey) -> Zeroizing<String> {
    let seed = Zeroizing::new(signing.to_bytes());
    let seed_b64 = Zeroizing::new(STANDARD.encode(seed.as_slice()));
    let public = PublicKey(signing.verifying_key());
    // Large enough that it never reallocates (which would leave a copy of the seed behind).
    let mut out = Zeroizing::new(String::with_capacity(1024));
    out.push_str(NODE_KEY_BEGIN);
    out.push_str("\nKey-Type: ed25519\nPublic-Key: ");
    out.push_str(&public.to_string());
    out.push_str("\n\n");
    out.push_str(&seed_b64);
    out.push('\n');
    out.push_str(NODE_KEY_END);
    out.push('\n');
    out
}

/// The signing key in the key file opened as `file` (at `path`): read bounded, into a
/// buffer that never reallocates (a reallocation would leave a copy of the secret behind
/// in freed memory) and is zeroized when dropped.
pub(crate) fn read_signing_key(file: fs::File, path: &Path) -> Result<SigningKey, IdentityError> {
    let mut raw = Zeroizing::new(Vec::with_capacity(MAX_KEY_FILE_BYTES as usize + 64));
    file.take(MAX_KEY_FILE_BYTES)
        .read_to_end(&mut raw)
        .ctx("read", path)?;
    let text = std::str::from_utf8(&raw).map_err(|_| IdentityError::Malformed {
        path: path.to_path_buf(),
        reason: "it is not text".to_string(),
    })?;
    decode_key_file(path, text)
}

fn decode_key_file(path: &Path, text: &str) -> Result<SigningKey, IdentityError> {
    let bad = |reason: &str| IdentityError::Malformed {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if crate::keyformat::private_format(text).is_some() {
        return crate::keyformat::decode_private(text).map_err(|e| bad(&e));
    }
    let mut lines = text.lines().map(str::trim_end);
    if lines.next() != Some(NODE_KEY_BEGIN) {
        return Err(bad(&format!(
            "the first line is not `{}`, `{}` or `{NODE_KEY_BEGIN}`",
            crate::keyformat::PKCS8_BEGIN,
            crate::keyformat::OPENSSH_PRIVATE_BEGIN
        )));
    }
    let mut key_type = None;
    let mut claimed_public = None;
    for line in lines.by_ref() {
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad("a header line without `Name: value`"))?;
        match name.trim() {
            "Key-Type" => key_type = Some(value.trim().to_string()),
            "Public-Key" => claimed_public = Some(value.trim().to_string()),
            other => return Err(bad(&format!("unknown header `{other}`"))),
        }
    }
    if key_type.as_deref() != Some("ed25519") {
        return Err(bad("the `Key-Type: ed25519` header is missing"));
    }
    let mut b64 = Zeroizing::new(String::with_capacity(text.len()));
    let mut ended = false;
    for line in lines.by_ref() {
        if line == NODE_KEY_END {
            ended = true;
            break;
        }
        b64.push_str(line.trim());
    }
    if !ended {
        return Err(bad(&format!("the `{NODE_KEY_END}` line is missing")));
    }
    if lines.any(|l| !l.trim().is_empty()) {
        return Err(bad("text after the end line"));
    }
    let raw = Zeroizing::new(
        STANDARD
            .decode(b64.as_bytes())
            .map_err(|_| bad("the secret is not valid base64"))?,
    );
    if raw.len() != 32 {
        return Err(bad(&format!(
            "the secret is {} bytes instead of 32",
            raw.len()
        )));
    }
    let mut seed = Zeroizing::new([0u8; 32]);
    seed.copy_from_slice(&raw);
    let signing = SigningKey::from_bytes(&seed);
    if let Some(claimed) = claimed_public {
        let derived = PublicKey(signing.verifying_key()).to_string();
        if claimed != derived {
            return Err(bad(&format!(
                "its Public-Key header ({claimed}) does not match its secret ({derived})"
            )));
        }
    }
    Ok(signing)
}

/// Opens a key file without waiting for a FIFO's writer (`O_NONBLOCK`; a regular file reads
/// as usual).
fn open_key(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Loads the node key at `path`. Refuses a key file that group or others may access
/// (the error names the `chmod 600` fix) and anything that is not a regular file.
pub fn load_node_key(path: &Path) -> Result<NodeKey, IdentityError> {
    // Never waits on a FIFO; anything but a regular file is refused just below.
    let file = match open_key(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(IdentityError::KeyMissing {
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(IoError::new("open", path, e).into()),
    };
    // Check the file we opened, not the path, so a swap between check and read is harmless.
    let meta = file.metadata().ctx("stat", path)?;
    if !meta.file_type().is_file() {
        return Err(IdentityError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(IdentityError::InsecurePermissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    if meta.len() > MAX_KEY_FILE_BYTES {
        return Err(IdentityError::Malformed {
            path: path.to_path_buf(),
            reason: format!("{} bytes, far more than a key file holds", meta.len()),
        });
    }
    let signing = read_signing_key(file, path)?;
    Ok(NodeKey::from_signing(signing, Some(path.to_path_buf())))
}

/// Reads a public key file in any format [`PublicKey::parse_any`] takes (`node.pub` is
/// SubjectPublicKeyInfo PEM; older ones hold the line `ed25519:<base64>`).
pub fn read_public_key(path: &Path) -> Result<PublicKey, IdentityError> {
    let mut text = String::new();
    crate::fsx::open_input(path)
        .and_then(|f| f.take(MAX_KEY_FILE_BYTES).read_to_string(&mut text))
        .ctx("read", path)?;
    PublicKey::parse_any(&text)
}

/// A public key as a command line or a configuration names one: the key itself
/// (`ed25519:<base64>`, SubjectPublicKeyInfo PEM or an OpenSSH line) or a regular file
/// holding one. A one-line argument that is no key and names nothing is refused as a
/// missing file ([`IdentityError::NoKeyFile`]), one that names something other than a
/// regular file as not a file; key text (anything multi-line or PEM-armoured, or spelled
/// like a key) keeps the key's own error, and a path that cannot be looked up its I/O
/// error.
pub fn public_key_arg(s: &str) -> Result<PublicKey, IdentityError> {
    let path = Path::new(s);
    if path.is_file() {
        return read_public_key(path);
    }
    let t = s.trim();
    let err = match PublicKey::parse_any(t) {
        Ok(k) => return Ok(k),
        Err(e) => e,
    };
    // An OpenSSH key line is `TYPE BASE64 [COMMENT]`: text that starts like one but has no
    // blank in it (`ssh-node.pub`) is a path, and a missing one is said as such.
    let keyish = t.starts_with("ed25519:")
        || t.starts_with("-----BEGIN")
        || t.contains('\n')
        || (crate::keyformat::decode_public(t).is_some() && t.contains(char::is_whitespace));
    if keyish {
        return Err(err);
    }
    let shown: String = s.chars().take(80).collect();
    match path.symlink_metadata() {
        Ok(_) => Err(IdentityError::NotAKeyFile { input: shown }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(IdentityError::NoKeyFile { input: shown })
        }
        Err(e) => Err(e).ctx("look up", path).map_err(IdentityError::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_argument_names_the_key_or_a_file_holding_it() {
        let dir = tempfile::tempdir().unwrap();
        let k = EphemeralKey::generate().public();
        let file = dir.path().join("node.pub");
        std::fs::write(&file, format!("{k}\n")).unwrap();
        let arg = |p: &Path| public_key_arg(p.to_str().unwrap());
        assert_eq!(public_key_arg(&k.to_string()).unwrap(), k);
        assert_eq!(public_key_arg(&k.to_spki_pem()).unwrap(), k);
        assert_eq!(arg(&file).unwrap(), k);
        // A path that names nothing: said as a missing file, not as a bad key.
        let missing = dir.path().join("missing.pub");
        let e = arg(&missing).unwrap_err();
        assert!(matches!(e, IdentityError::NoKeyFile { .. }), "{e}");
        assert!(e.to_string().contains("no such file"), "{e}");
        // So is a missing relative path that starts as an OpenSSH key's type does.
        for name in ["ssh-node.pub", "ecdsa-steward.pub"] {
            assert!(!Path::new(name).exists());
            let e = public_key_arg(name).unwrap_err();
            assert!(matches!(e, IdentityError::NoKeyFile { .. }), "{name}: {e}");
        }
        // A directory or a FIFO is not a key file.
        let fifo = dir.path().join("fifo.pub");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for p in [dir.path(), fifo.as_path()] {
            let e = arg(p).unwrap_err();
            assert!(matches!(e, IdentityError::NotAKeyFile { .. }), "{e}");
        }
        // Text that is meant as a key and is not one keeps the key's own error.
        for text in [
            "ed25519:AAAA",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----",
            "-----BEGIN RSA PUBLIC KEY-----",
            "ssh-rsa AAAAB3NzaC1yc2E= someone",
        ] {
            let e = public_key_arg(text).unwrap_err();
            assert!(
                matches!(e, IdentityError::BadPublicKey { .. }),
                "{text}: {e}"
            );
        }
        // A path that cannot be looked up (a file in its way) is an I/O error, not missing.
        let e = arg(&file.join("below")).unwrap_err();
        assert!(matches!(e, IdentityError::Io(_)), "{e}");
        // A file that holds no key says what is wrong with its content.
        std::fs::write(&file, "hello\n").unwrap();
        let e = arg(&file).unwrap_err();
        assert!(matches!(e, IdentityError::BadPublicKey { .. }), "{e}");
    }

    #[test]
    fn public_key_round_trip_and_key_id() {
        let k = EphemeralKey::generate();
        let s = k.public().to_string();
        assert!(s.starts_with("ed25519:"));
        let back = PublicKey::parse(&s).unwrap();
        assert_eq!(back, k.public());
        let id = back.key_id();
        assert_eq!(id.len(), 16);
        assert_eq!(id, hex::encode(Sha256::digest(back.as_bytes()))[..16]);
        let json = serde_json::to_string(&back).unwrap();
        assert_eq!(json, format!("\"{s}\""));
        let from_json: PublicKey = serde_json::from_str(&json).unwrap();
        assert_eq!(from_json, back);
    }

    #[test]
    fn public_key_parse_errors() {
        assert!(PublicKey::parse("ssh-ed25519 AAAA").is_err());
        assert!(PublicKey::parse("ed25519:not base64!").is_err());
        let short = format!("ed25519:{}", STANDARD.encode([1u8; 31]));
        let msg = PublicKey::parse(&short).unwrap_err().to_string();
        assert!(msg.contains("31 bytes"), "{msg}");
        // The identity point is a weak key.
        let mut ident = [0u8; 32];
        ident[0] = 1;
        let weak = format!("ed25519:{}", STANDARD.encode(ident));
        let msg = PublicKey::parse(&weak).unwrap_err().to_string();
        assert!(msg.contains("weak"), "{msg}");
    }

    #[test]
    fn sign_and_verify() {
        let k = EphemeralKey::generate();
        let sig = k.sign(b"hello");
        k.public().verify(b"hello", &sig).unwrap();
        assert!(k.public().verify(b"hellO", &sig).is_err());
        let other = EphemeralKey::generate();
        assert!(other.public().verify(b"hello", &sig).is_err());
        assert!(k.public().verify(b"hello", &sig[..63]).is_err());
        k.destroy();
    }

    #[test]
    fn keys_in_the_earlier_fork_format_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let signing = SigningKey::generate(&mut rand::rngs::OsRng);
        let path = dir.path().join("old.key");
        fs::write(&path, encode_legacy_key_file(&signing).as_bytes()).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let public = PublicKey(signing.verifying_key());
        assert_eq!(load_node_key(&path).unwrap().public(), public);
        let old_pub = dir.path().join("old.pub");
        fs::write(&old_pub, format!("{public}\n")).unwrap();
        assert_eq!(read_public_key(&old_pub).unwrap(), public);
        // What fork writes now: PKCS#8 and SubjectPublicKeyInfo PEM.
        let new = dir.path().join("new.key");
        let p = generate_node_key(&new, false).unwrap();
        assert!(fs::read_to_string(&new)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----"));
        let spki = fs::read_to_string(public_key_path(&new)).unwrap();
        assert!(spki.starts_with("-----BEGIN PUBLIC KEY-----"), "{spki}");
        assert_eq!(PublicKey::parse_any(&spki).unwrap(), p);
        assert_eq!(PublicKey::parse_any(&p.to_openssh("n")).unwrap(), p);
        assert_eq!(PublicKey::parse_any(&p.to_string()).unwrap(), p);
        assert!(
            PublicKey::parse(&spki).is_err(),
            "documents keep ed25519:<base64>"
        );
    }

    /// Eight first uses at once (evaluations on a fresh host each creating the node key):
    /// exactly one creates it, every other is told it exists, and the key and its public
    /// half left are the one the winner returned, never a mix of two.
    #[test]
    fn concurrent_keygens_leave_one_whole_key() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0..20 {
            let path = dir.path().join(format!("r{round}")).join("node.key");
            let gate = std::sync::Barrier::new(8);
            let results: Vec<_> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..8)
                    .map(|_| {
                        s.spawn(|| {
                            gate.wait();
                            generate_node_key(&path, false)
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            assert_eq!(won.len(), 1, "round {round}: {results:?}");
            for r in &results {
                if let Err(e) = r {
                    assert!(matches!(e, IdentityError::KeyExists { .. }), "{e}");
                }
            }
            assert_eq!(load_node_key(&path).unwrap().public(), *won[0]);
            assert_eq!(read_public_key(&public_key_path(&path)).unwrap(), *won[0]);
            // No temporary file of a loser is left beside them.
            let names: Vec<_> = fs::read_dir(path.parent().unwrap())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names.len(), 2, "round {round}: {names:?}");
        }
    }

    /// `keygen --out node.steward --force` beside the node's key replaced the node's
    /// `node.pub` (the public path is the key's name with `.pub`): refused, naming both,
    /// and so is replacing a key whose public file holds another key.
    #[test]
    fn force_never_replaces_another_keys_public_half() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node.key");
        let node_pub = dir.path().join("node.pub");
        let public = generate_node_key(&node, false).unwrap();
        let before = fs::read(&node_pub).unwrap();
        let steward = dir.path().join("node.steward");
        for force in [false, true] {
            let err = generate_node_key(&steward, force).unwrap_err();
            assert!(
                matches!(err, IdentityError::PublicOfAnotherKey { .. }),
                "{err}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains("node.pub") && msg.contains("node.steward"),
                "{msg}"
            );
            assert!(!msg.contains("pass --force"), "{msg}");
            assert!(!steward.exists());
            assert_eq!(fs::read(&node_pub).unwrap(), before);
        }
        assert_eq!(read_public_key(&node_pub).unwrap(), public);

        // A key whose public file holds some other key: not replaced either.
        let stray = EphemeralKey::generate().public();
        fs::write(&node_pub, stray.to_spki_pem()).unwrap();
        let err = generate_node_key(&node, true).unwrap_err();
        assert!(err.to_string().contains("the key there is"), "{err}");
        assert_eq!(load_node_key(&node).unwrap().public(), public);
        // Its own public half (in either spelling) is replaced with it.
        fs::write(&node_pub, format!("{public}\n")).unwrap();
        let new_public = generate_node_key(&node, true).unwrap();
        assert_eq!(read_public_key(&node_pub).unwrap(), new_public);
        assert_eq!(load_node_key(&node).unwrap().public(), new_public);
    }

    /// Two `--force` generations at once, round after round: they take turns, so the key
    /// and its public half left are always one pair (without the directory's lock they
    /// interleaved: one's key beside the other's public half).
    #[test]
    fn concurrent_forced_keygens_leave_a_matching_pair() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        generate_node_key(&path, false).unwrap();
        for round in 0..20 {
            let gate = std::sync::Barrier::new(2);
            let made: Vec<_> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            gate.wait();
                            generate_node_key(&path, true)
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let key = load_node_key(&path).unwrap().public();
            let public = read_public_key(&public_key_path(&path)).unwrap();
            assert_eq!(key, public, "round {round}: {made:?}");
            assert!(made.iter().all(|m| m.is_ok()), "round {round}: {made:?}");
        }
    }

    #[test]
    fn keygen_load_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cfg").join("fork").join("node.key");
        let public = generate_node_key(&path, false).unwrap();

        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dmeta = fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(dmeta.permissions().mode() & 0o777, 0o700);
        let pub_path = dir.path().join("cfg/fork/node.pub");
        assert_eq!(read_public_key(&pub_path).unwrap(), public);

        let key = load_node_key(&path).unwrap();
        assert_eq!(key.public(), public);
        let sig = key.sign(b"m");
        public.verify(b"m", &sig).unwrap();
        assert!(!format!("{key:?}").contains(&STANDARD.encode(key.signing.to_bytes())));

        // Never overwritten without force.
        let before = fs::read(&path).unwrap();
        let err = generate_node_key(&path, false).unwrap_err();
        assert!(matches!(err, IdentityError::KeyExists { .. }), "{err}");
        assert_eq!(fs::read(&path).unwrap(), before);
        // With force: a new identity.
        let new_public = generate_node_key(&path, true).unwrap();
        assert_ne!(new_public, public);
        assert_eq!(load_node_key(&path).unwrap().public(), new_public);
        assert_eq!(read_public_key(&pub_path).unwrap(), new_public);

        // A key named like its own public half is refused before anything is written (the
        // public half replaced the key, exit 0).
        let steward = dir.path().join("steward.pub");
        let err = generate_node_key(&steward, false).unwrap_err();
        assert!(
            matches!(err, IdentityError::KeyIsPublicPath { .. }),
            "{err}"
        );
        assert!(generate_node_key(&steward, true).is_err());
        assert!(!steward.exists());
        // Someone's existing public key beside a new key's path is not replaced, with
        // force or without, and no key is left without its public half.
        let other = dir.path().join("other.key");
        fs::write(dir.path().join("other.pub"), "theirs").unwrap();
        for force in [false, true] {
            let err = generate_node_key(&other, force).unwrap_err();
            assert!(
                matches!(err, IdentityError::PublicOfAnotherKey { .. }),
                "{err}"
            );
            assert!(!other.exists());
            assert_eq!(fs::read(dir.path().join("other.pub")).unwrap(), b"theirs");
        }
        // A public path that cannot be written: no key is left behind either.
        let third = dir.path().join("third.key");
        fs::create_dir(dir.path().join("third.pub")).unwrap();
        assert!(generate_node_key(&third, false).is_err());
        assert!(!third.exists());
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.starts_with(".node-")), "{names:?}");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );

        // Group- or world-readable keys are refused, naming the fix.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let msg = load_node_key(&path).unwrap_err().to_string();
        assert!(
            msg.contains("chmod 600") && msg.contains("node.key"),
            "{msg}"
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();

        // A file (fork's earlier format) whose header does not match its secret is refused.
        let text = encode_legacy_key_file(&load_node_key(&path).unwrap().signing);
        let other = EphemeralKey::generate().public().to_string();
        let tampered = text.replace(&new_public.to_string(), &other);
        fs::write(&path, tampered).unwrap();
        let msg = load_node_key(&path).unwrap_err().to_string();
        assert!(msg.contains("does not match"), "{msg}");

        let missing = dir.path().join("nope.key");
        assert!(matches!(
            load_node_key(&missing).unwrap_err(),
            IdentityError::KeyMissing { .. }
        ));
        assert!(matches!(
            load_node_key(dir.path()).unwrap_err(),
            IdentityError::NotAFile { .. }
        ));
    }

    #[test]
    fn malformed_key_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        for text in [
            "hello",
            "-----BEGIN FORK NODE KEY-----\nKey-Type: rsa\n\nAAAA\n-----END FORK NODE KEY-----\n",
            "-----BEGIN FORK NODE KEY-----\nKey-Type: ed25519\n\nAAAA\n-----END FORK NODE KEY-----\n",
            "-----BEGIN FORK NODE KEY-----\nKey-Type: ed25519\n\nAAAA\n",
        ] {
            fs::write(&path, text).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
            let err = load_node_key(&path).unwrap_err();
            assert!(matches!(err, IdentityError::Malformed { .. }), "{err}");
        }
    }

    #[test]
    fn default_paths_follow_xdg() {
        // Only reads the environment; the expected value is derived the same documented way.
        let p = default_node_key_path();
        assert!(p.ends_with("fork/node.key"), "{}", p.display());
        assert_eq!(p.parent().unwrap(), node_key_dir());
        if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| Path::new(x).is_absolute())
        {
            assert_eq!(p, PathBuf::from(x).join("fork/node.key"));
        }
    }
}
