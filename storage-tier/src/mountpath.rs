//! Mountpaths: one folder per disk, each with a bucket per subfolder. Objects are opened with
//! `openat2(RESOLVE_BENEATH)` relative to the mountpath's directory handle, so no name, `..`
//! or symlink can reach outside it (a string check alone cannot promise that), and each disk
//! has its own stream limit: a spindle reads ~200 MB/s sequentially and ~20 MB/s when many
//! streams seek between each other, so a few large sequential streams per disk beat many.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Semaphore;

/// A disk's folder and its stream scheduler.
pub struct Mountpath {
    pub path: PathBuf,
    /// (device, inode) of the directory opened at start.
    identity: (u64, u64),
    /// Why the mountpath cannot serve now (`None`: it can), from the last [`Mountpath::check`].
    trouble: std::sync::Mutex<Option<String>>,
    /// Metric label.
    pub label: String,
    pub rotational: bool,
    /// Permits for concurrent disk reads; waiters are served in arrival order.
    pub streams: Arc<Semaphore>,
    pub stream_limit: usize,
    dir: OwnedFd,
}

impl Mountpath {
    /// Opens a mountpath; `streams` 0 picks a default from the disk type.
    pub fn open(path: &Path, streams: usize) -> io::Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        // SAFETY: a valid C string; the returned descriptor is checked and owned.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        let identity = {
            let f = File::from(dir.try_clone()?);
            let m = f.metadata()?;
            (m.dev(), m.ino())
        };
        let rotational = is_rotational(path);
        let limit = if streams > 0 {
            streams
        } else if rotational {
            2
        } else {
            16
        };
        Ok(Mountpath {
            label: path.display().to_string(),
            path: path.to_path_buf(),
            identity,
            trouble: std::sync::Mutex::new(None),
            rotational,
            streams: Arc::new(Semaphore::new(limit)),
            stream_limit: limit,
            dir,
        })
    }

    /// Whether the path still names the directory opened at start and can be read: a disk
    /// mounted over it (or unmounted from it), the folder removed or replaced, or made
    /// unreadable all mean the objects it held are not what this node would serve. Blocking.
    pub fn probe(&self) -> Result<(), String> {
        let m = std::fs::metadata(&self.path).map_err(|e| format!("cannot stat it: {e}"))?;
        if (m.dev(), m.ino()) != self.identity {
            return Err(
                "it is no longer the directory opened at start (a disk mounted over \
                        it or unmounted, or the folder replaced)"
                    .into(),
            );
        }
        std::fs::read_dir(&self.path)
            .and_then(|mut d| d.next().transpose())
            .map(|_| ())
            .map_err(|e| format!("cannot read it: {e}"))
    }

    /// Runs [`Mountpath::probe`] and records the result; returns a change of state, if any
    /// (`Some(None)`: healthy again, `Some(Some(why))`: newly unavailable).
    pub fn check(&self) -> Option<Option<String>> {
        let now = self.probe().err();
        let mut t = self.trouble.lock().ok()?;
        (*t != now).then(|| {
            *t = now.clone();
            now
        })
    }

    /// Bytes an unprivileged writer may still write on the mountpath's file system.
    pub fn available_bytes(&self) -> io::Result<u64> {
        // SAFETY: statvfs is plain data; all-zero is a valid value for the call to fill.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor (fstatfs works on O_PATH ones) and a statvfs to fill.
        if unsafe { libc::fstatvfs(self.dir.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // fsblkcnt_t and c_ulong are u64 here, not on every target.
        #[allow(clippy::useless_conversion)]
        Ok(u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
    }

    /// Why the mountpath cannot serve now, or `None`.
    pub fn trouble(&self) -> Option<String> {
        self.trouble.lock().ok().and_then(|t| t.clone())
    }

    /// Opens `rel` (already validated: no empty, `.` or `..` components, not absolute)
    /// beneath the mountpath. An escape through a symlink fails with `EXDEV`.
    pub fn open_beneath(&self, rel: &str, flags: i32, mode: u32) -> io::Result<File> {
        let c = CString::new(rel).map_err(io::Error::other)?;
        // SAFETY: open_how is plain data; all-zero is its documented default.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.mode = u64::from(mode);
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: valid directory descriptor, C string and open_how of the size we pass.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.dir.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENOSYS) {
                return self.open_checked(rel, flags, mode);
            }
            return Err(err);
        }
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { File::from_raw_fd(fd as i32) })
    }

    /// Fallback for kernels without openat2 (before 5.6): resolve, then insist the result is
    /// beneath the mountpath.
    fn open_checked(&self, rel: &str, flags: i32, mode: u32) -> io::Result<File> {
        let full = self.path.join(rel);
        let root = std::fs::canonicalize(&self.path)?;
        let parent = full.parent().map(std::fs::canonicalize).transpose()?;
        if parent.is_none_or(|p| !p.starts_with(&root)) {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        if full.exists() && !std::fs::canonicalize(&full)?.starts_with(&root) {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        let mut opts = std::fs::OpenOptions::new();
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(flags & !(libc::O_ACCMODE)).mode(mode);
        match flags & libc::O_ACCMODE {
            libc::O_WRONLY => opts.write(true),
            libc::O_RDWR => opts.read(true).write(true),
            _ => opts.read(true),
        };
        if flags & libc::O_CREAT != 0 {
            opts.create(true);
        }
        opts.open(full)
    }
}

/// Whether the block device under `path` is rotational (from sysfs; false when unknown).
fn is_rotational(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    for candidate in [
        format!("{base}/queue/rotational"),
        format!("{base}/../queue/rotational"),
    ] {
        if let Ok(v) = std::fs::read_to_string(candidate) {
            return v.trim() == "1";
        }
    }
    false
}

/// Tells the kernel a file will be read sequentially (bigger read-ahead).
pub fn advise_sequential(file: &File, offset: u64, len: u64) {
    // SAFETY: advisory call on a valid descriptor; errors are harmless.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as i64,
            len as i64,
            libc::POSIX_FADV_SEQUENTIAL,
        );
    }
}

/// Validates an object key: relative, no empty, `.` or `..` components, no NUL or backslash.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 1024
        && !key.starts_with('/')
        && !key.contains(['\0', '\\'])
        && key
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Validates a bucket name: 1–63 of `a-z 0-9 . _ -`, not starting with `.`.
pub fn valid_bucket(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_buckets_are_validated() {
        for good in ["a.tar", "dir/train-000001.tar", "a..b/c"] {
            assert!(valid_key(good), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a/.",
            "a\\b",
            "a\0b",
        ] {
            assert!(!valid_key(bad), "{bad:?}");
        }
        assert!(valid_bucket("imagenet-train_1.v2"));
        for bad in ["", ".hidden", "Upper", "a/b", &"x".repeat(64)] {
            assert!(!valid_bucket(bad), "{bad:?}");
        }
    }

    #[test]
    fn symlinks_cannot_escape_a_mountpath() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("disk");
        std::fs::create_dir_all(root.join("b")).unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::fs::write(root.join("b/ok.tar"), b"ok").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("b/escape.tar")).unwrap();
        std::os::unix::fs::symlink("ok.tar", root.join("b/inside.tar")).unwrap();
        let m = Mountpath::open(&root, 0).unwrap();
        assert!(m.open_beneath("b/ok.tar", libc::O_RDONLY, 0).is_ok());
        assert!(m.open_beneath("b/inside.tar", libc::O_RDONLY, 0).is_ok());
        let err = m
            .open_beneath("b/escape.tar", libc::O_RDONLY, 0)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{err}");
    }
}
