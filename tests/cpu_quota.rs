//! `threads = 0` (the default) follows the CPU quota a worker's cgroup gives it (a Kubernetes
//! CPU limit is `cpu.max` / `cpu.cfs_quota_us`), not the host's cores: a worker in a cgroup of
//! one CPU on a machine of more starts one decode thread. Root only (it makes a cgroup), and
//! skipped with a message where no cgroup CPU controller can be written.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A cgroup of one CPU this test may put a process in, and the file a pid is written to.
struct OneCpu {
    dir: PathBuf,
    procs: PathBuf,
}

impl OneCpu {
    fn make() -> Option<OneCpu> {
        let name = format!("sluice-quota-{}", std::process::id());
        // cgroup v1's cpu controller, or v2's where its cpu controller is on for children.
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        if v1.join("cpu.cfs_quota_us").exists() {
            let dir = v1.join(&name);
            std::fs::create_dir(&dir).ok()?;
            let one = std::fs::write(dir.join("cpu.cfs_period_us"), "100000")
                .and_then(|()| std::fs::write(dir.join("cpu.cfs_quota_us"), "100000"));
            let group = OneCpu {
                procs: dir.join("tasks"),
                dir,
            };
            return one.is_ok().then_some(group);
        }
        let v2 = Path::new("/sys/fs/cgroup");
        let controls = std::fs::read_to_string(v2.join("cgroup.subtree_control")).ok()?;
        if !controls.split_whitespace().any(|c| c == "cpu") {
            return None;
        }
        let dir = v2.join(&name);
        std::fs::create_dir(&dir).ok()?;
        let one = std::fs::write(dir.join("cpu.max"), "100000 100000");
        let group = OneCpu {
            procs: dir.join("cgroup.procs"),
            dir,
        };
        one.is_ok().then_some(group)
    }
}

impl Drop for OneCpu {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The decode threads a worker started with `--threads 0` says it serves with, run inside
/// `group` when given; stopped once it said so.
fn threads(group: Option<&OneCpu>, state: &Path) -> u32 {
    use std::io::BufRead;
    let sluice = env!("CARGO_BIN_EXE_sluice");
    let serve = format!(
        "exec {sluice} cpu --listen 127.0.0.1:0 --no-auth --no-same-host --threads 0 \
         --state-dir {}",
        state.display()
    );
    let script = match group {
        Some(g) => format!("echo $$ > {}; {serve}", g.procs.display()),
        None => serve,
    };
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut said = String::new();
    let mut found = None;
    for line in std::io::BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
    {
        said.push_str(&line);
        said.push('\n');
        if let Some(at) = line.find("threads=") {
            let n: String = line[at + 8..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            found = n.parse().ok();
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    found.unwrap_or_else(|| panic!("no threads in the serving line:\n{said}"))
}

#[test]
fn zero_threads_follow_the_cgroup_s_cpu_quota_not_the_host_s_cores() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        eprintln!("skipped: one core here, so a quota of one changes nothing to see");
        return;
    }
    let Some(group) = OneCpu::make() else {
        eprintln!("skipped: no cgroup CPU controller this test can write (root needed)");
        return;
    };
    let state = tempfile::tempdir().unwrap();
    assert_eq!(threads(None, state.path()) as usize, cores);
    assert_eq!(threads(Some(&group), state.path()), 1);
}
