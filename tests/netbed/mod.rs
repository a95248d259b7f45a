//! A cluster on one machine: each host is a network namespace with its own address, joined to
//! the others through veth pairs on a bridge that lives in a namespace of its own, so nothing
//! a scenario sends leaves the namespaces it made. Faults are applied per host link: cut (the
//! link down), capped (`tc tbf`). Processes run inside a host with `ip netns exec`.
//!
//! Everything is removed on drop (processes killed, namespaces deleted, which deletes their
//! veths), also when a test fails. Needs root and `ip`; [`Bed::new`] says why it cannot run
//! and returns `None` otherwise.

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// One host of the bed.
pub struct Host {
    pub name: String,
    pub ns: String,
    pub addr: Ipv4Addr,
    /// The host's end of its link (inside its namespace).
    pub link: String,
}

/// Hosts on one bridge, and the processes started in them.
pub struct Bed {
    switch: String,
    pub hosts: Vec<Host>,
    children: Vec<(String, Child)>,
    /// Per-namespace files under /etc/netns the bed made.
    etc: Vec<std::path::PathBuf>,
    /// CPU cgroups the bed made (removed on drop, once their processes are gone).
    cgroups: Vec<std::path::PathBuf>,
    prefix: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `args` (a program and its arguments) inside namespace `ns`, to completion.
fn in_ns(ns: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    ip(&all)
}

static BEDS: AtomicU32 = AtomicU32::new(0);

impl Bed {
    /// A bed of `hosts` (names), or `None` with a message when this machine cannot make one
    /// (not root, no `ip`, no network namespaces).
    pub fn new(hosts: &[&str]) -> Option<Bed> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc_geteuid() } != 0 {
            eprintln!("skipped: the cluster test bed needs root (network namespaces)");
            return None;
        }
        let id = (std::process::id() % 200) * 8 + BEDS.fetch_add(1, Ordering::SeqCst) % 8;
        let prefix = format!("sl{id}");
        let switch = format!("{prefix}sw");
        if let Err(e) = ip(&["netns", "add", &switch]) {
            eprintln!("skipped: cannot make network namespaces here ({e})");
            return None;
        }
        let mut bed = Bed {
            switch: switch.clone(),
            hosts: Vec::new(),
            children: Vec::new(),
            etc: Vec::new(),
            cgroups: Vec::new(),
            prefix: prefix.clone(),
        };
        let setup = (|| -> Result<(), String> {
            in_ns(&switch, &["ip", "link", "add", "br0", "type", "bridge"])?;
            in_ns(&switch, &["ip", "link", "set", "br0", "up"])?;
            // 10.(100 + id / 250).(id % 250).0/24 keeps concurrent beds apart.
            let (a, b) = (100 + (id / 250) as u8, (id % 250) as u8);
            for (i, name) in hosts.iter().enumerate() {
                let ns = format!("{prefix}{name}");
                let (near, far) = (format!("{prefix}h{i}"), format!("{prefix}s{i}"));
                ip(&["netns", "add", &ns])?;
                in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;
                ip(&["link", "add", &near, "type", "veth", "peer", "name", &far])?;
                ip(&["link", "set", &near, "netns", &ns])?;
                ip(&["link", "set", &far, "netns", &switch])?;
                in_ns(&switch, &["ip", "link", "set", &far, "master", "br0"])?;
                in_ns(&switch, &["ip", "link", "set", &far, "up"])?;
                let addr = Ipv4Addr::new(10, a, b, 10 + i as u8);
                in_ns(
                    &ns,
                    &["ip", "addr", "add", &format!("{addr}/24"), "dev", &near],
                )?;
                in_ns(&ns, &["ip", "link", "set", &near, "up"])?;
                bed.hosts.push(Host {
                    name: name.to_string(),
                    ns,
                    addr,
                    link: near,
                });
            }
            Ok(())
        })();
        if let Err(e) = setup {
            eprintln!("skipped: cannot build the test bed ({e})");
            return None;
        }
        Some(bed)
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name}"))
    }

    /// A command that runs `program` inside `host`.
    pub fn command(&self, host: &str, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host(host).ns]).arg(program);
        c
    }

    /// Starts `sluice args...` in `host` as a daemon of the bed (killed on drop); its output
    /// goes to `log`.
    pub fn start(&mut self, host: &str, tag: &str, args: &[&str], log: &Path) {
        self.start_program(
            host,
            tag,
            Path::new(env!("CARGO_BIN_EXE_sluice")),
            args,
            log,
        );
    }

    /// Starts `program args...` in `host` (killed on drop); stderr goes to `log`, stdout too
    /// when `log` ends in `.out`, else nowhere.
    pub fn start_program(
        &mut self,
        host: &str,
        tag: &str,
        program: &Path,
        args: &[&str],
        log: &Path,
    ) {
        let file = std::fs::File::create(log).unwrap();
        let stdout = if log.extension().is_some_and(|e| e == "out") {
            Stdio::from(file.try_clone().unwrap())
        } else {
            Stdio::null()
        };
        let child = self
            .command(host, program)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(stdout)
            .stderr(file)
            .spawn()
            .unwrap();
        self.children.push((tag.to_string(), child));
    }

    /// Waits for the program started as `tag` to exit (up to `secs`); whether it did.
    pub fn wait(&mut self, tag: &str, secs: u64) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        for (t, child) in &mut self.children {
            if t == tag {
                while std::time::Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        return true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                return false;
            }
        }
        false
    }

    /// The exit code of the program started as `tag`, once it has exited (`None` before, or
    /// when a signal ended it).
    pub fn exit_code(&mut self, tag: &str) -> Option<i32> {
        let (_, child) = self.children.iter_mut().find(|(t, _)| t == tag)?;
        child.try_wait().ok().flatten()?.code()
    }

    /// SIGKILLs the daemon started as `tag`.
    pub fn kill9(&mut self, tag: &str) {
        for (t, child) in &mut self.children {
            if t == tag {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.children.retain(|(t, _)| t != tag);
    }

    /// The pid of the daemon started as `tag` (`ip netns exec` execs the program).
    pub fn pid(&self, tag: &str) -> Option<u32> {
        self.children
            .iter()
            .find(|(t, _)| t == tag)
            .map(|(_, c)| c.id())
    }

    /// Sends SIGTERM to the daemon started as `tag` (a drain), without waiting for it.
    pub fn sigterm(&self, tag: &str) {
        if let Some(pid) = self.pid(tag) {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }

    /// Resident memory of the daemon started as `tag`, KiB (0 when it is gone).
    pub fn rss_kb(&self, tag: &str) -> u64 {
        self.pid(tag).map_or(0, crate::support::rss_kb)
    }

    /// Runs `args` (a program and its arguments, e.g. `iptables ...`) inside `host`, to
    /// completion.
    pub fn exec(&self, host: &str, args: &[&str]) -> Result<(), String> {
        in_ns(&self.host(host).ns, args)
    }

    /// Takes `host`'s link down (a cut cable) or up again.
    pub fn link(&self, host: &str, up: bool) {
        let h = self.host(host);
        in_ns(
            &h.ns,
            &["ip", "link", "set", &h.link, if up { "up" } else { "down" }],
        )
        .unwrap();
    }

    /// Waits (up to `secs`) for the workers started with these certificate paths to write
    /// them, and pins them all in `trust`, as a client's `--trust-cert`; whether they came.
    pub fn pin_certificates(certs: &[std::path::PathBuf], trust: &Path, secs: u64) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while !certs.iter().all(|c| c.exists()) {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let pem: String = certs
            .iter()
            .map(|c| std::fs::read_to_string(c).unwrap())
            .collect();
        std::fs::write(trust, pem).unwrap();
        true
    }

    /// Caps the program started as `tag` at `millicores` thousandths of a core, as a
    /// Kubernetes CPU limit does (a CFS quota in a cgroup of its own, v2 or v1). Returns why
    /// it could not, where the machine has no writable CPU controller.
    pub fn cap_cpu(&mut self, tag: &str, millicores: u32) -> Result<(), String> {
        let pid = self.pid(tag).ok_or_else(|| format!("no program {tag}"))?;
        let (period, quota) = (100_000u64, u64::from(millicores) * 100);
        let name = format!("{}-{tag}", self.prefix);
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let group = match v2 {
            true => Path::new("/sys/fs/cgroup").join(&name),
            false => Path::new("/sys/fs/cgroup/cpu").join(&name),
        };
        let fail = |what: &str, e: std::io::Error| format!("{what} {}: {e}", group.display());
        if !group.exists() {
            std::fs::create_dir(&group).map_err(|e| fail("making", e))?;
            self.cgroups.push(group.clone());
        }
        match v2 {
            true => std::fs::write(group.join("cpu.max"), format!("{quota} {period}"))
                .map_err(|e| fail("writing cpu.max in", e))?,
            false => {
                std::fs::write(group.join("cpu.cfs_period_us"), period.to_string())
                    .map_err(|e| fail("writing the period in", e))?;
                std::fs::write(group.join("cpu.cfs_quota_us"), quota.to_string())
                    .map_err(|e| fail("writing the quota in", e))?;
            }
        }
        std::fs::write(group.join("cgroup.procs"), pid.to_string())
            .map_err(|e| fail("moving the program into", e))
    }

    /// Makes `host`'s programs resolve names through the DNS server at `nameserver`: `ip
    /// netns exec` mounts `/etc/netns/NS/resolv.conf` over `/etc/resolv.conf` (removed on
    /// drop).
    pub fn nameserver(&mut self, host: &str, nameserver: Ipv4Addr) {
        let dir = Path::new("/etc/netns").join(&self.host(host).ns);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("resolv.conf"),
            format!("nameserver {nameserver}\noptions timeout:1 attempts:2\n"),
        )
        .unwrap();
        self.etc.push(dir);
    }

    /// Caps `host`'s outgoing traffic (a token bucket, `tc tbf`), e.g. "1gbit".
    pub fn cap(&self, host: &str, rate: &str) {
        let h = self.host(host);
        in_ns(
            &h.ns,
            &[
                "tc", "qdisc", "replace", "dev", &h.link, "root", "tbf", "rate", rate, "burst",
                "256kb", "latency", "50ms",
            ],
        )
        .unwrap();
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.ns]);
        }
        let _ = ip(&["netns", "del", &self.switch]);
        for dir in &self.etc {
            let _ = std::fs::remove_dir_all(dir);
        }
        for group in &self.cgroups {
            let _ = std::fs::remove_dir(group);
        }
    }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
