//! The supply-chain checks hold what they claim: the RustSec scan of `make lint` fails on a
//! dependency with a known advisory, and the image's SBOM lists what its binary is built from.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The snapshot `hack/advisories.sh` installs from, where this checkout's `../shared` has it.
fn snapshot() -> Option<PathBuf> {
    let path = std::env::var_os("HCP_FLEET_RUSTSEC").map_or_else(
        || repo().join("../shared/rustsec/advisory-db.tar.xz"),
        PathBuf::from,
    );
    path.is_file().then_some(path)
}

fn scan(manifest: &Path) -> (bool, String) {
    crate::support::run_to_text(
        Command::new("bash")
            .arg(repo().join("hack/advisories.sh"))
            .arg("scan")
            .arg(manifest),
    )
}

/// A crate whose one dependency is smallvec 0.6.13 (RUSTSEC-2021-0003, a buffer overflow in
/// `insert_many`), resolved and fetched so the offline scan can read it.
fn crate_with_a_known_advisory(dir: &Path) {
    std::fs::create_dir_all(dir.join("src")).expect("temp crate");
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"advisory-probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
         license = \"Apache-2.0\"\npublish = false\n\n[dependencies]\nsmallvec = \"=0.6.13\"\n\n\
         [workspace]\n",
    )
    .expect("Cargo.toml");
    std::fs::write(dir.join("src/lib.rs"), "").expect("lib.rs");
    for step in ["generate-lockfile", "fetch"] {
        let ok = Command::new(env!("CARGO"))
            .arg(step)
            .arg("--quiet")
            .current_dir(dir)
            .status()
            .expect("cargo runs");
        assert!(ok.success(), "cargo {step} for the probe crate failed");
    }
}

/// `make lint`'s advisory scan, with the project's deny.toml and the RustSec snapshot: this
/// repository's Cargo.lock passes and says how many advisories it was held to, and a crate
/// depending on smallvec 0.6.13 fails naming RUSTSEC-2021-0003.
#[test]
fn a_dependency_with_a_known_advisory_fails_the_advisory_scan() {
    let Some(snapshot) = snapshot() else {
        eprintln!("skipped: the RustSec scan's test (no ../shared/rustsec/advisory-db.tar.xz)");
        return;
    };
    let (ok, text) = scan(&repo().join("Cargo.toml"));
    assert!(ok, "this repository's own scan failed:\n{text}");
    let loaded = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("[advisories] RustSec database: ")?
                .split_whitespace()
                .next()?
                .parse::<usize>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no count of loaded advisories:\n{text}"));
    assert!(
        loaded > 1000,
        "{loaded} advisories loaded from {}",
        snapshot.display()
    );
    assert!(
        text.contains(&format!("none of the {loaded} applies")),
        "{text}"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    crate_with_a_known_advisory(dir.path());
    let (ok, text) = scan(&dir.path().join("Cargo.toml"));
    assert!(!ok, "smallvec 0.6.13 passed the scan:\n{text}");
    assert!(text.contains("RUSTSEC-2021-0003"), "{text}");
    assert!(!text.contains("none of the"), "{text}");
}
