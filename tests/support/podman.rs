//! The image under test, built with `configs/container/build.sh` around the test's own
//! `sluice`, and podman as the container tests drive it. Where podman is missing or cannot
//! run a container the tests skip with a message, unless `SLUICE_REQUIRE_CONTAINERS` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Says why a container test does not run (a failure where `SLUICE_REQUIRE_CONTAINERS` is set).
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("SLUICE_REQUIRE_CONTAINERS").is_none(),
        "SLUICE_REQUIRE_CONTAINERS is set, but {why}"
    );
    eprintln!("skipped: {why}");
}

/// The image built from the binary under test, removed when dropped, and the podman
/// configuration that runs containers on this machine.
pub struct Image {
    pub tag: String,
    /// This machine's own configuration (`None`), else the sandbox one in
    /// `configs/container/containers.conf` (runc, cgroupfs, no ulimits).
    pub conf: Option<PathBuf>,
}

impl Image {
    /// Builds the image as `localhost/sluice:<name>-<pid>`; `Err` says why containers cannot
    /// run here (podman missing, the build failing, no configuration that runs one).
    pub fn build(name: &str) -> Result<Image, String> {
        if Command::new("podman").arg("--version").output().is_err() {
            return Err("podman is not installed".into());
        }
        let tag = format!("localhost/sluice:{name}-{}", std::process::id());
        let built = Command::new(repo().join("configs/container/build.sh"))
            .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
            .env("SLUICE_TAG", &tag)
            .output()
            .map_err(|e| format!("build.sh did not start: {e}"))?;
        if !built.status.success() {
            return Err(format!(
                "the image did not build: {}",
                String::from_utf8_lossy(&built.stderr)
            ));
        }
        let mut image = Image { tag, conf: None };
        let sandbox = repo().join("configs/container/containers.conf");
        for conf in [None, Some(sandbox)] {
            image.conf = conf;
            if image
                .run(&["run", "--rm", &image.tag, "--version"])
                .status
                .success()
            {
                return Ok(image);
            }
        }
        Err("podman cannot run a container here".into())
    }

    /// `podman args`, under the configuration that runs containers here.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut c = Command::new("podman");
        if let Some(conf) = &self.conf {
            c.env("CONTAINERS_CONF", conf);
        }
        c.args(args).output().expect("podman runs")
    }

    /// `podman args`, which must succeed: its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = self.run(&["rmi", "-f", &self.tag]);
    }
}
