//! The build id shared by the `fork` and `fork-init` binaries of one build: a hash of the
//! sources, the manifest, the lock file, the profile and the target. The supervisor runs a
//! `fork-init` only if it carries the same id (see `src/sandbox/init_exe.rs`), so an init
//! left from another build is refused instead of being run.

use std::hash::{Hash, Hasher};
use std::path::Path;

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, files),
            Ok(t) if t.is_file() => files.push(p),
            _ => {}
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-changed=build.rs");
    let mut files = Vec::new();
    walk(Path::new("src"), &mut files);
    files.extend(["Cargo.toml", "Cargo.lock", "build.rs"].map(Into::into));
    files.sort();
    // Two SipHash states with different prefixes: a 128-bit id.
    let mut ids = [0u64; 2];
    for (i, id) in ids.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        i.hash(&mut h);
        for f in &files {
            f.hash(&mut h);
            std::fs::read(f).unwrap_or_default().hash(&mut h);
        }
        for v in [
            "PROFILE",
            "TARGET",
            "OPT_LEVEL",
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTC",
        ] {
            std::env::var(v).unwrap_or_default().hash(&mut h);
        }
        *id = h.finish();
    }
    println!(
        "cargo:rustc-env=FORK_BUILD_ID={:016x}{:016x}",
        ids[0], ids[1]
    );
    // What decides the programs a seccomp profile compiles to: the compiler's sources and
    // the seccompiler release (see src/sandbox/seccomp/shipped.rs).
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in ["src/sandbox/seccomp.rs", "src/sandbox/seccomp/tree.rs"] {
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let seccompiler = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"seccompiler\""))
        .unwrap_or_default();
    seccompiler.hash(&mut h);
    println!("cargo:rustc-env=FORK_SECCOMP_COMPILER={:016x}", h.finish());
}
