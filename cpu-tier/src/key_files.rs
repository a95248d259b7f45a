//! Where private keys are written and read from: the CA's (`sluice cert`), a worker's issued
//! pair, a worker's self-signed pair in its state directory.
//!
//! A key is written only into a folder that no other user can write (owned by this user or
//! root, no group or other write bit), as OpenSSH's `StrictModes` asks of `~/.ssh`: in any
//! other folder a link planted at the file's name would receive the key, or replace it once
//! written. Inside the folder every file is opened relative to the folder's descriptor, never
//! through a link (`O_NOFOLLOW`), created new (`O_EXCL`) under a temporary name and renamed
//! into place without replacing anything (`RENAME_NOREPLACE`). A key is read only from a
//! regular file that is not a link and that no other user can read.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, RenameFlags};

/// What is wrong with a key's folder or file, naming it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {detail}")]
pub struct KeyFileError {
    pub path: String,
    pub detail: String,
}

fn file_error(path: &Path, detail: impl std::fmt::Display) -> KeyFileError {
    KeyFileError {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// Whether `uid` may own a folder or key this process trusts: itself, or root.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::geteuid().as_raw()
}

/// A folder keys are written into, opened once: every file in it is reached through this
/// descriptor.
pub struct KeyDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl KeyDir {
    /// Opens `path` (made owner-only, with any missing parents, when absent) and checks that
    /// no other user can write it.
    pub fn open(path: &Path) -> Result<KeyDir, KeyFileError> {
        use std::os::unix::fs::DirBuilderExt;
        if path.symlink_metadata().is_err() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| file_error(path, e))?;
        }
        let fd = rustix::fs::open(
            path,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => file_error(
                path,
                "is a link or not a folder: keys are written only into a real folder",
            ),
            e => file_error(path, e),
        })?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| file_error(path, e))?;
        let mode = stat.st_mode & 0o7777;
        if !trusted_owner(stat.st_uid) {
            return Err(file_error(
                path,
                format!(
                    "is owned by uid {}, not by this user or root: keys are written only into \
                     a folder no other user controls",
                    stat.st_uid
                ),
            ));
        }
        if mode & 0o022 != 0 {
            return Err(file_error(
                path,
                format!(
                    "can be written by other users (mode {mode:04o}): another user could plant \
                     a link where a key is written; use a folder only you can write (chmod \
                     go-w)"
                ),
            ));
        }
        Ok(KeyDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The path of `name` in the folder, for messages.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Refuses to go on when `name` exists (as anything, a link included): a CA or a key
    /// others already trust is not made again by accident.
    pub fn refuse_existing(&self, name: &str) -> Result<(), KeyFileError> {
        match rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Err(file_error(
                &self.path_of(name),
                "exists already; remove it to make a new one (whoever trusts the old one will \
                 not trust the new)",
            )),
            Err(_) => Ok(()),
        }
    }

    /// Writes `bytes` as `name` with `mode` (0600 for a key): into a new temporary file, then
    /// renamed into place, neither ever through a link nor over an existing file.
    pub fn write_new(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), KeyFileError> {
        let tmp = format!(".{name}.tmp");
        let tmp_path = self.path_of(&tmp);
        let fd = rustix::fs::openat(
            &self.fd,
            &*tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| match e {
            rustix::io::Errno::EXIST => file_error(
                &tmp_path,
                "exists (left by an interrupted run, or put there by someone): remove it and \
                 run again",
            ),
            e => file_error(&tmp_path, e),
        })?;
        // The umask may have taken bits away; never added any. Set exactly what was asked.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| file_error(&tmp_path, e))?;
        let mut file = std::fs::File::from(fd);
        let written = file
            .write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| file_error(&tmp_path, e));
        let renamed = written.and_then(|()| {
            rustix::fs::renameat_with(&self.fd, &*tmp, &self.fd, name, RenameFlags::NOREPLACE)
                .map_err(|e| file_error(&self.path_of(name), e))
        });
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, &*tmp, rustix::fs::AtFlags::empty());
        }
        renamed?;
        rustix::fs::fsync(&self.fd).map_err(|e| file_error(&self.path, e))
    }
}

/// Reads the private key at `path`: a regular file, not a link, owned by this user or root
/// and readable by nobody else (a key others can read is a key others hold).
pub fn read_private(path: &Path) -> Result<String, KeyFileError> {
    use std::io::Read;
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => {
            file_error(path, "is a link: a key is read only from its own file")
        }
        e => file_error(path, e),
    })?;
    let stat = rustix::fs::fstat(fd.as_fd()).map_err(|e| file_error(path, e))?;
    let mode = stat.st_mode & 0o7777;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(file_error(path, "is not a regular file"));
    }
    if !trusted_owner(stat.st_uid) {
        return Err(file_error(
            path,
            format!(
                "is owned by uid {}, not by this user or root: another user could have put a \
                 key of theirs there",
                stat.st_uid
            ),
        ));
    }
    if mode & 0o077 != 0 {
        return Err(file_error(
            path,
            format!(
                "can be read or written by other users (mode {mode:04o}): whoever read it can \
                 issue certificates the pool trusts; chmod 600 it (and consider the CA \
                 compromised if others did read it)"
            ),
        ));
    }
    // A key is a few kilobytes; a larger file is not one.
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(1 << 20)
        .read_to_string(&mut text)
        .map_err(|e| file_error(path, e))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_is_written_owner_only_and_never_over_or_through_anything() {
        let d = tempfile::tempdir().unwrap();
        let dir = KeyDir::open(d.path()).unwrap();
        dir.write_new("k.pem", b"secret", 0o600).unwrap();
        let meta = std::fs::metadata(d.path().join("k.pem")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(dir.write_new("k.pem", b"other", 0o600).is_err());
        assert_eq!(std::fs::read(d.path().join("k.pem")).unwrap(), b"secret");
        // A link at the temporary name receives nothing.
        let target = d.path().join("target");
        std::os::unix::fs::symlink(&target, d.path().join(".l.pem.tmp")).unwrap();
        let e = dir.write_new("l.pem", b"secret", 0o600).unwrap_err();
        assert!(e.to_string().contains(".l.pem.tmp"), "{e}");
        assert!(!target.exists());
    }

    #[test]
    fn a_folder_others_can_write_or_a_link_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = KeyDir::open(&open).err().unwrap().to_string();
        assert!(e.contains("other users") && e.contains("1777"), "{e}");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        let e = KeyDir::open(&link).err().unwrap().to_string();
        assert!(e.contains("link"), "{e}");
        let made = d.path().join("new/deeper");
        KeyDir::open(&made).unwrap();
        let mode = std::fs::metadata(&made).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_key_others_can_read_or_behind_a_link_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        let key = d.path().join("ca.key");
        std::fs::write(&key, "KEY").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_private(&key).unwrap(), "KEY");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_private(&key).unwrap_err().to_string();
        assert!(e.contains("0644") && e.contains("chmod 600"), "{e}");
        let link = d.path().join("link.key");
        std::os::unix::fs::symlink(&key, &link).unwrap();
        let e = read_private(&link).unwrap_err().to_string();
        assert!(e.contains("is a link"), "{e}");
    }
}
