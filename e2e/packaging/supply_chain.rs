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

/// A checkout of a few files, as `hack/image-inputs.py` reads one: a git repository with a
/// manifest, a lock file and a source file, and the dep-info file cargo would write for a
/// binary compiled from them (the source, one registry file, one environment variable naming
/// the checkout).
fn fingerprinted_checkout(root: &Path, cargo_home: &Path, source: &str) -> PathBuf {
    std::fs::create_dir_all(root.join("src")).expect("checkout");
    std::fs::write(root.join("Cargo.toml"), "[package]\nname = \"probe\"\n").expect("manifest");
    std::fs::write(root.join("Cargo.lock"), "version = 4\n").expect("lock");
    std::fs::write(root.join("src/main.rs"), source).expect("source");
    for step in [&["init", "-q"][..], &["add", "Cargo.toml"]] {
        let ok = Command::new("git")
            .args(step)
            .current_dir(root)
            .status()
            .expect("git runs");
        assert!(ok.success(), "git {step:?}");
    }
    let registry = cargo_home.join("registry/src/index/serde-1.0.0/src/lib.rs");
    let depinfo = root.join("probe.d");
    std::fs::write(
        &depinfo,
        format!(
            "{bin}: {main} {registry}\n\n{main}:\n{registry}:\n\n# env-dep:CARGO_MANIFEST_DIR={root}\n",
            bin = root.join("target/probe").display(),
            main = root.join("src/main.rs").display(),
            registry = registry.display(),
            root = root.display(),
        ),
    )
    .expect("dep-info");
    depinfo
}

/// The build's command line, one argument of the script (hack/image.sh passes it so).
const BUILD_DESCRIPTION: &str = "--release --features ring";

fn fingerprint(root: &Path, depinfo: &Path, cargo_home: &Path) -> (bool, String) {
    let (ok, text) = crate::support::run_to_text(
        Command::new("python3")
            .arg(repo().join("hack/image-inputs.py"))
            .arg(depinfo)
            .arg(cargo_home)
            .arg(BUILD_DESCRIPTION)
            .current_dir(root),
    );
    (ok, text.trim().to_string())
}

/// The record `hack/image.sh reproduce` holds the image's binary to is keyed by what the
/// compile read, not by where: the same sources in another checkout under another CARGO_HOME
/// give the same fingerprint, and one byte of a source file changed gives another (a record
/// that looked current for changed sources would fail a reproducible build, or pass a binary
/// nobody compiled twice). A dep-info naming a file outside both is refused, not skipped.
#[test]
fn the_image_record_is_keyed_by_what_the_compile_read_wherever_it_ran() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (one, two) = (
        dir.path().join("one/checkout"),
        dir.path().join("two/clone"),
    );
    let (home_one, home_two) = (dir.path().join("one/cargo"), dir.path().join("two/.cargo"));
    let source = "fn main() {}\n";
    let d1 = fingerprinted_checkout(&one, &home_one, source);
    let d2 = fingerprinted_checkout(&two, &home_two, source);
    let (ok1, f1) = fingerprint(&one, &d1, &home_one);
    let (ok2, f2) = fingerprint(&two, &d2, &home_two);
    assert!(ok1 && ok2, "{f1}\n{f2}");
    assert_eq!(f1.len(), 64, "a SHA-256: {f1}");
    assert_eq!(
        f1, f2,
        "the same inputs in two places gave two fingerprints"
    );

    std::fs::write(two.join("src/main.rs"), "fn main() { }\n").expect("edit");
    let (ok, changed) = fingerprint(&two, &d2, &home_two);
    assert!(ok, "{changed}");
    assert_ne!(
        f1, changed,
        "a changed source file left the fingerprint as it was"
    );

    std::fs::write(
        &d2,
        format!("x: {}\n", dir.path().join("elsewhere/lib.rs").display()),
    )
    .expect("dep-info");
    let (ok, text) = fingerprint(&two, &d2, &home_two);
    assert!(
        !ok,
        "a file outside the checkout and CARGO_HOME was accepted: {text}"
    );
    assert!(
        text.contains("neither in the checkout nor in CARGO_HOME"),
        "{text}"
    );
}
