//! The shard cache's directory, as a worker that may run as root beside other users must
//! treat it (`systemd-tmpfiles` and OpenSSH's `StrictModes` are the models): the directory is
//! opened once, refused if it is a link, owned by another user or writable by others, and
//! every file in it is opened relative to that descriptor with no link followed
//! (`O_NOFOLLOW`) and checked after opening: a regular file, owned by this worker's user,
//! with one name. Anything else under an entry's name (a link, a FIFO, another user's file, a
//! hard link to a file elsewhere) is never read, written or removed; it is said once and left
//! alone.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// The cache directory, held open.
pub(super) struct CacheDir {
    path: PathBuf,
    fd: OwnedFd,
    uid: u32,
    /// Names already said to be someone else's (said once each).
    foreign: Mutex<HashSet<String>>,
}

/// Why a file under an entry's name is not used.
fn not_ours(what: &str) -> io::Error {
    io::Error::other(format!("{what}, not a file this worker made; left alone"))
}

impl CacheDir {
    /// Opens (making it, owner-only, if missing) the directory `path`; refused by name when
    /// it is a link, another user's, or writable by others.
    pub(super) fn open(path: &Path) -> io::Result<CacheDir> {
        let uid = rustix::process::geteuid().as_raw();
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().recursive(true).create(path)?;
                let _ = std::fs::set_permissions(
                    path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o700),
                );
            }
            Err(e) => return Err(e),
            Ok(m) if m.file_type().is_symlink() => {
                return Err(io::Error::other(
                    "it is a symbolic link: give the real directory",
                ))
            }
            Ok(_) => {}
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, flags, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd)?;
        if stat.st_uid != uid && stat.st_uid != 0 {
            return Err(io::Error::other(format!(
                "it belongs to uid {}, not this worker's uid {uid} (or root)",
                stat.st_uid
            )));
        }
        let mode = stat.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(io::Error::other(format!(
                "other users can write it (mode {mode:o}): make it 0700 or 0755"
            )));
        }
        Ok(CacheDir {
            path: path.to_path_buf(),
            fd,
            uid,
            foreign: Mutex::new(HashSet::new()),
        })
    }

    /// The directory itself, for logs.
    pub(super) fn root(&self) -> &Path {
        &self.path
    }

    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The names in the directory.
    pub(super) fn names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd)? {
            let entry = entry?;
            if let Ok(name) = entry.file_name().to_str() {
                if name != "." && name != ".." {
                    names.push(name.to_string());
                }
            }
        }
        Ok(names)
    }

    /// `name`, opened to read, if it is this worker's regular file.
    pub(super) fn read(&self, name: &str) -> io::Result<File> {
        self.open_file(name, OFlags::RDONLY, false)
    }

    /// `name`, opened to write (made, owner-only, if missing), if it is this worker's.
    pub(super) fn write(&self, name: &str) -> io::Result<File> {
        self.open_file(name, OFlags::WRONLY | OFlags::CREATE, false)
    }

    /// `name`, made anew (it must not exist), to write.
    pub(super) fn create_new(&self, name: &str) -> io::Result<File> {
        self.open_file(name, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL, true)
    }

    fn open_file(&self, name: &str, flags: OFlags, new: bool) -> io::Result<File> {
        // NONBLOCK: a FIFO put in an entry's place must not hang the open.
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::LOOP) => {
                let e = not_ours("a symbolic link");
                self.said(name, &e);
                return Err(e);
            }
            Err(e) => return Err(e.into()),
        };
        let stat = rustix::fs::fstat(&fd)?;
        if let Err(e) = self.check(&stat, new) {
            self.said(name, &e);
            return Err(e);
        }
        // Back to blocking reads and writes.
        rustix::fs::fcntl_setfl(&fd, rustix::fs::fcntl_getfl(&fd)? - OFlags::NONBLOCK)?;
        Ok(File::from(fd))
    }

    fn check(&self, stat: &rustix::fs::Stat, new: bool) -> io::Result<()> {
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(not_ours("not a regular file"));
        }
        if stat.st_uid != self.uid {
            return Err(not_ours(&format!("owned by uid {}", stat.st_uid)));
        }
        if stat.st_nlink != 1 && !new {
            return Err(not_ours("a file with other names (a hard link)"));
        }
        Ok(())
    }

    /// Removes `name` if it is this worker's regular file; anything else stays.
    pub(super) fn remove(&self, name: &str) {
        let Ok(stat) = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) else {
            return;
        };
        match self.check(&stat, false) {
            Ok(()) => {
                let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
            }
            Err(e) => self.said(name, &e),
        }
    }

    /// Renames `from` to `to` (over a file of this worker's, or none).
    pub(super) fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        if let Ok(stat) = rustix::fs::statat(&self.fd, to, AtFlags::SYMLINK_NOFOLLOW) {
            self.check(&stat, false).inspect_err(|e| self.said(to, e))?;
        }
        rustix::fs::renameat(&self.fd, from, &self.fd, to)?;
        Ok(())
    }

    /// Says once per name that the file under it is not the cache's.
    fn said(&self, name: &str, e: &io::Error) {
        let first = self
            .foreign
            .lock()
            .map(|mut f| f.insert(name.to_string()))
            .unwrap_or(false);
        if first {
            metrics::counter!("sluice_cpu_cache_foreign_files_total").increment(1);
            tracing::warn!(file = %self.path(name).display(), "shard cache: {e}");
        }
    }
}
