//! Running test processes, shared by every crate's integration tests (`#[path]`-included):
//! a command that must succeed, and the Python the interop tests need.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `cmd` to its end and fails the test, with the command, its stdout and its stderr,
/// unless it exited 0; returns its output.
pub fn succeed(mut cmd: impl std::borrow::BorrowMut<Command>) -> Output {
    let cmd = cmd.borrow_mut();
    let out = cmd.output().expect("running a test's command");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A Python interpreter that imports `modules` (`"moto.server, boto3"`): `$SLUICE_TEST_PYTHON`,
/// else the repository's `.venv`. `None` (the caller skips; this says so) unless
/// `SLUICE_REQUIRE_PYTHON` is set, as CI sets it, when its absence fails.
pub fn python_with(modules: &str) -> Option<PathBuf> {
    let repo_venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join(".venv/bin/python"))
        .find(|p| p.exists());
    let candidates = std::env::var_os("SLUICE_TEST_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(repo_venv);
    for py in candidates {
        let ok = Command::new(&py)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(py);
        }
    }
    assert!(
        std::env::var_os("SLUICE_REQUIRE_PYTHON").is_none(),
        "SLUICE_REQUIRE_PYTHON is set but no Python with {modules} was found"
    );
    eprintln!(
        "skipping: no Python with {modules} (set SLUICE_TEST_PYTHON, or make .venv as .ci/run does)"
    );
    None
}
