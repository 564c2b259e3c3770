//! Standard key file formats, beside fork's own (see [`crate::identity`]):
//!
//! * private keys: **PKCS#8 PEM** (`-----BEGIN PRIVATE KEY-----`, RFC 8410; what `openssl
//!   genpkey -algorithm ed25519` writes and what fork writes now) and unencrypted
//!   **OpenSSH** (`-----BEGIN OPENSSH PRIVATE KEY-----`, `ssh-keygen -t ed25519`), read;
//! * public keys: **SubjectPublicKeyInfo PEM** (`-----BEGIN PUBLIC KEY-----`, `openssl pkey
//!   -pubout`; what fork writes now) and **OpenSSH** (`ssh-ed25519 AAAA... comment`), read
//!   and written.
//!
//! Encoding and decoding are the `pkcs8`/`spki` support of ed25519-dalek and the
//! `ssh-key` crate; this module only recognises which format a text is in.

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use zeroize::Zeroizing;

/// The first line of a PKCS#8 PEM private key.
pub const PKCS8_BEGIN: &str = "-----BEGIN PRIVATE KEY-----";
/// The first line of an OpenSSH private key.
pub const OPENSSH_PRIVATE_BEGIN: &str = "-----BEGIN OPENSSH PRIVATE KEY-----";
/// The first line of a SubjectPublicKeyInfo PEM public key.
pub const SPKI_BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
/// The algorithm name of an OpenSSH ed25519 public key line.
pub const OPENSSH_ED25519: &str = "ssh-ed25519";

/// Which private key format `text` is in, by its first line (`None`: not a standard one).
pub fn private_format(text: &str) -> Option<&'static str> {
    let first = text.trim_start().lines().next()?.trim_end();
    match first {
        PKCS8_BEGIN => Some("PKCS#8"),
        OPENSSH_PRIVATE_BEGIN => Some("OpenSSH"),
        _ => None,
    }
}

/// Decodes a PKCS#8 PEM or OpenSSH private ed25519 key.
pub fn decode_private(text: &str) -> Result<SigningKey, String> {
    match private_format(text) {
        Some("PKCS#8") => SigningKey::from_pkcs8_pem(text.trim())
            .map_err(|e| format!("not an ed25519 PKCS#8 private key ({e})")),
        Some(_) => {
            let k = ssh_key::PrivateKey::from_openssh(text.trim())
                .map_err(|e| format!("not an OpenSSH private key ({e})"))?;
            if k.is_encrypted() {
                return Err(
                    "the OpenSSH key is encrypted: remove its passphrase (`ssh-keygen -p -N ''`) or convert it to PKCS#8"
                        .into(),
                );
            }
            let pair = k
                .key_data()
                .ed25519()
                .ok_or_else(|| format!("an OpenSSH {} key, not ed25519", k.algorithm()))?;
            let seed = Zeroizing::new(pair.private.to_bytes());
            Ok(SigningKey::from_bytes(&seed))
        }
        None => Err("not a PKCS#8 or OpenSSH private key".into()),
    }
}

/// A private key as PKCS#8 PEM (RFC 8410), in zeroizing memory: version 1, the seed only
/// (OpenSSL reads it; the optional public key of version 2 is left out).
pub fn encode_private_pkcs8(k: &SigningKey) -> Result<Zeroizing<String>, String> {
    let pair = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: k.to_bytes(),
        public_key: None,
    };
    pair.to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| format!("encoding the key as PKCS#8: {e}"))
}

/// A public key as SubjectPublicKeyInfo PEM.
pub fn encode_public_spki(k: &VerifyingKey) -> Result<String, String> {
    k.to_public_key_pem(LineEnding::LF)
        .map_err(|e| format!("encoding the public key as SubjectPublicKeyInfo: {e}"))
}

/// A public key as one OpenSSH line (`ssh-ed25519 AAAA... comment`).
pub fn encode_public_openssh(k: &VerifyingKey, comment: &str) -> Result<String, String> {
    let data = ssh_key::public::KeyData::Ed25519(ssh_key::public::Ed25519PublicKey(k.to_bytes()));
    ssh_key::PublicKey::new(data, comment)
        .to_openssh()
        .map_err(|e| format!("encoding the public key for OpenSSH: {e}"))
}

/// The 32 bytes of a public key given as SubjectPublicKeyInfo PEM or an OpenSSH line
/// (`None`: `text` is in neither format; `Some(Err)`: it is, but broken).
pub fn decode_public(text: &str) -> Option<Result<[u8; 32], String>> {
    let t = text.trim();
    if t.starts_with(SPKI_BEGIN) {
        return Some(
            VerifyingKey::from_public_key_pem(t)
                .map(|k| k.to_bytes())
                .map_err(|e| format!("not an ed25519 SubjectPublicKeyInfo PEM key ({e})")),
        );
    }
    if t.starts_with("ssh-") || t.starts_with("ecdsa-") {
        return Some(
            ssh_key::PublicKey::from_openssh(t)
                .map_err(|e| format!("not an OpenSSH public key ({e})"))
                .and_then(|k| {
                    k.key_data()
                        .ed25519()
                        .map(|p| p.0)
                        .ok_or_else(|| format!("an OpenSSH {} key, not ed25519", k.algorithm()))
                }),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_standard_format() {
        let k = SigningKey::generate(&mut rand::rngs::OsRng);
        let pem = encode_private_pkcs8(&k).unwrap();
        assert!(pem.starts_with(PKCS8_BEGIN), "{}", pem.as_str());
        assert_eq!(decode_private(&pem).unwrap().to_bytes(), k.to_bytes());
        let spki = encode_public_spki(&k.verifying_key()).unwrap();
        assert!(spki.starts_with(SPKI_BEGIN));
        assert_eq!(
            decode_public(&spki).unwrap().unwrap(),
            k.verifying_key().to_bytes()
        );
        let ssh = encode_public_openssh(&k.verifying_key(), "node").unwrap();
        assert!(
            ssh.starts_with("ssh-ed25519 AAAA") && ssh.ends_with(" node"),
            "{ssh}"
        );
        assert_eq!(
            decode_public(&ssh).unwrap().unwrap(),
            k.verifying_key().to_bytes()
        );
        assert!(decode_public("ed25519:AAAA").is_none());
        assert!(decode_public("ssh-ed25519 garbage").unwrap().is_err());
        assert!(
            decode_private("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
                .is_err()
        );
    }

    /// Keys written by OpenSSL and ssh-keygen themselves, when those tools are installed.
    #[test]
    fn reads_keys_that_openssl_and_ssh_keygen_write() {
        let d = tempfile::tempdir().unwrap();
        let run = |cmd: &str, args: &[&str]| {
            std::process::Command::new(cmd)
                .args(args)
                .current_dir(d.path())
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        if run(
            "openssl",
            &["genpkey", "-algorithm", "ed25519", "-out", "o.key"],
        ) {
            assert!(run(
                "openssl",
                &["pkey", "-in", "o.key", "-pubout", "-out", "o.pub"]
            ));
            let k =
                decode_private(&std::fs::read_to_string(d.path().join("o.key")).unwrap()).unwrap();
            let p = decode_public(&std::fs::read_to_string(d.path().join("o.pub")).unwrap())
                .unwrap()
                .unwrap();
            assert_eq!(k.verifying_key().to_bytes(), p);
        }
        if run("ssh-keygen", &["-q", "-t", "ed25519", "-N", "", "-f", "s"]) {
            let k = decode_private(&std::fs::read_to_string(d.path().join("s")).unwrap()).unwrap();
            let p = decode_public(&std::fs::read_to_string(d.path().join("s.pub")).unwrap())
                .unwrap()
                .unwrap();
            assert_eq!(k.verifying_key().to_bytes(), p);
        }
    }
}
