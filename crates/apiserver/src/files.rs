//! Writing files that hold secrets safely: private directories (0700) and files written through a temporary file
//! and a rename with their final mode from the start. The server's PKI and `mcm node-agent`'s credentials use them.

use std::{
    fs,
    io::{self, Write as _},
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

/// Creates a directory (and its parents) with mode 0700 when missing; an existing one keeps its mode.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Writes a file through a temporary file created with `mode` beside it and a rename, so that readers see the
/// old content or the new one, never a part, and a secret is never readable by others, not even briefly.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let Some(file_name) = path.file_name() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a file path"));
    };
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(file_name);
    temp_name.push(format!(
        ".tmp.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let temp_path = path.with_file_name(temp_name);

    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let result = options.open(&temp_path).and_then(|mut file| {
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&temp_path, path)
    });
    if result.is_err() {
        let _ = fs::remove_file(&temp_path);
    }
    result
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_file_is_replaced_whole_with_its_mode_and_no_temporary_stays() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("a/b");
        create_private_dir(&private).unwrap();
        assert_eq!(mode(&private), 0o700);
        let path = private.join("key.pem");
        write_atomic(&path, b"old", 0o600).unwrap();
        write_atomic(&path, b"new", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(mode(&path), 0o600);
        let names: Vec<_> = fs::read_dir(&private)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["key.pem"]);
    }

    #[test]
    fn a_failed_write_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("taken");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), "x").unwrap();
        assert!(write_atomic(&target, b"data", 0o600).is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(write_atomic(Path::new("/"), b"data", 0o600).is_err());
    }
}
