//! The one way xtask and the kernel-ffi binaries read an input file and replace
//! an output file. Reads are bounded and take regular files only (a FIFO would
//! hang the reader, `/dev/zero` would fill memory); writes go through a
//! temporary file renamed over the target, and refuse a target that is not a
//! regular file (renaming over `/dev/null` would replace the device node).

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The largest input file read whole: manifests, reports, ledgers, case lists,
/// tool logs and fatbins are far below it.
pub const MAX_INPUT: u64 = 256 << 20;

/// Opens `path` for reading if it is a regular file, with its length. The open
/// does not block (`O_NONBLOCK`: a FIFO with no writer would wait forever) and
/// the type is taken from the opened file, so a swap after a check cannot slip
/// a device in.
pub fn open_regular(path: &Path) -> Result<(std::fs::File, u64)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let meta = file.metadata().with_context(|| format!("reading the metadata of {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is {}, not a regular file; name a file", path.display(), kind(&meta.file_type()));
    }
    Ok((file, meta.len()))
}

/// The whole of a regular file of at most `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let (file, len) = open_regular(path)?;
    if len > limit {
        bail!("{} is {len} bytes, more than the {limit} this reader takes", path.display());
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // One byte past the limit tells a file that grew while it was read.
    file.take(limit + 1).read_to_end(&mut bytes).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > limit {
        bail!("{} grew past {limit} bytes while it was read", path.display());
    }
    Ok(bytes)
}

/// The whole of a regular file of at most [`MAX_INPUT`] bytes.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    read_bounded(path, MAX_INPUT)
}

/// A regular UTF-8 text file of at most [`MAX_INPUT`] bytes.
pub fn read_text(path: &Path) -> Result<String> {
    String::from_utf8(read(path)?).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// `read_text`, or `None` where `path` does not exist.
pub fn read_text_if_exists(path: &Path) -> Result<Option<String>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_text(path).map(Some),
    }
}

/// Refuses an output path whose current occupant is not a regular file or a
/// symlink (which is replaced, not followed). Callers check before long work,
/// so a bad `--json`/`--output` fails before the GPU runs, not after.
pub fn check_target(path: &Path) -> Result<()> {
    if path.file_name().is_none() {
        bail!("{} names no file", path.display());
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() && !meta.file_type().is_symlink() => bail!(
            "{} is {}; an output is written to a new file and renamed over its target, so it must name \
             a regular file (or none yet)",
            path.display(),
            kind(&meta.file_type())
        ),
        _ => Ok(()),
    }
}

/// Replaces a file atomically, creating its parent directories: a reader, or a
/// run killed half-way, sees the old file or the new one, never half of either.
/// The error names the path.
pub fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_atomic(path, contents.as_ref(), false)
}

/// Replaces `path` with `bytes` atomically: a uniquely named file in the same
/// folder, written, synced and renamed over it, so a reader (or a run killed
/// half-way) sees the old file or the new one, never half of either.
pub fn write_atomic(path: &Path, bytes: &[u8], executable: bool) -> Result<()> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    check_target(path)?;
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}-{n}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(if executable { 0o755 } else { 0o644 })))
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

fn kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_and_folders_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for (path, what) in
            [(fifo.as_path(), "a FIFO"), (Path::new("/dev/zero"), "a character device"), (dir.path(), "a directory")]
        {
            let err = format!("{:#}", read_bounded(path, MAX_INPUT).unwrap_err());
            assert!(err.contains(what) && err.contains("not a regular file"), "{err}");
            let err = format!("{:#}", write_atomic(path, b"x", false).unwrap_err());
            assert!(err.contains(what) && err.contains("regular file"), "{err}");
        }
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is left as it was");
    }

    #[test]
    fn reads_stop_at_the_limit_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("big");
        std::fs::write(&f, vec![b'a'; 100]).unwrap();
        assert_eq!(read_bounded(&f, 100).unwrap().len(), 100);
        let err = format!("{:#}", read_bounded(&f, 99).unwrap_err());
        assert!(err.contains("100 bytes, more than the 99"), "{err}");
        assert!(read_text_if_exists(&dir.path().join("none")).unwrap().is_none());
    }

    #[test]
    fn writes_replace_files_and_symlinks_only() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("out.json");
        write_atomic(&f, b"old", false).unwrap();
        write_atomic(&f, b"new", false).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        let witness = dir.path().join("witness");
        std::fs::write(&witness, "kept").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&witness, &link).unwrap();
        write_atomic(&link, b"replaced", false).unwrap();
        assert_eq!(std::fs::read_to_string(&witness).unwrap(), "kept");
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "replaced");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3, "no temporary file is left");
    }
}
