//! Test support shared by the workspace's suites. Only ever a dev-dependency.
//!
//! The project's example manifests live in the repository's own `examples/` folder (one folder per provider:
//! `examples/local`, `examples/sim`). They are the fixtures of the end-to-end tests and what users apply, so the
//! tests read them from there and a plain clone of the repository is all that is needed to run them.

use std::path::{Path, PathBuf};

/// The repository's `examples/` folder (found from this crate's `CARGO_MANIFEST_DIR`, so from any working
/// directory).
///
/// # Panics
/// When the folder is missing: the checkout is incomplete.
pub fn examples_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let dir = dir.canonicalize().unwrap_or(dir);
    assert!(
        dir.is_dir(),
        "the repository's examples/ folder is missing at {}",
        dir.display()
    );
    dir
}

/// The path of one example manifest, `examples/<provider>/<file>` (for example `("local", "00-secret.yaml")`).
///
/// # Panics
/// When the file does not exist.
pub fn example(provider: &str, file: &str) -> PathBuf {
    let path = examples_dir().join(provider).join(file);
    assert!(path.is_file(), "no example {}", path.display());
    path
}

/// Every YAML manifest under `examples/`, as (path, text), sorted by path.
///
/// # Panics
/// When the examples cannot be read, or there are none.
pub fn example_manifests() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|err| panic!("cannot list {}: {err}", dir.display()));
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(&examples_dir(), &mut out);
    out.sort();
    assert!(!out.is_empty(), "no example manifests found");
    out
}
