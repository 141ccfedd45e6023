//! Test support shared by the workspace's suites. Only ever a dev-dependency.
//!
//! The project's specification and example manifests live in the `shared/` folder beside the checkout (CI clones
//! the repository with `shared/` next to it). Tests read them from there, so that what is tested is the text the
//! project is held to, not a copy that could drift.

use std::path::{Path, PathBuf};

/// The `shared/` folder: `$MCM_SHARED_DIR` when set, else the first `shared/` with a `spec/` folder found in the
/// workspace's ancestors.
///
/// # Panics
/// When neither is found: a test that needs the spec must fail loudly rather than pass without it.
pub fn shared_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MCM_SHARED_DIR") {
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("spec").is_dir(),
            "MCM_SHARED_DIR={} has no spec/ folder",
            dir.display()
        );
        return dir;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    workspace
        .ancestors()
        .map(|dir| dir.join("shared"))
        .find(|dir| dir.join("spec").is_dir())
        .unwrap_or_else(|| {
            panic!(
                "no shared/ folder with spec/ found above {}; clone the project with shared/ beside it or set \
                 MCM_SHARED_DIR",
                workspace.display()
            )
        })
}

/// The text of the spec file whose name starts with `prefix` (for example `"000_"`).
///
/// # Panics
/// When the file is missing or unreadable.
pub fn spec_text(prefix: &str) -> String {
    let dir = shared_dir().join("spec");
    let entry = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("cannot list {}: {err}", dir.display()))
        .filter_map(Result::ok)
        .find(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .unwrap_or_else(|| panic!("no spec file {prefix}* in {}", dir.display()));
    std::fs::read_to_string(entry.path())
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", entry.path().display()))
}

/// Every YAML manifest under `shared/examples/`, as (path, text), sorted by path.
///
/// # Panics
/// When the examples cannot be read.
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
    walk(&shared_dir().join("examples"), &mut out);
    out.sort();
    assert!(!out.is_empty(), "no example manifests found");
    out
}
