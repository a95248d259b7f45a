//! The pool of workers an epoch runs on, and how it changes while the epoch runs.
//!
//! A loader's workers come from a fixed list (`workers`), a file (`workers_file`, one
//! `host:port` a line) or both; every name in them may be a DNS name, each of whose records
//! is a worker (a Kubernetes headless Service's pods). Each epoch resolves them when it
//! starts and dials a link to each worker ([`Dialer`]); where the pool can change (a workers
//! file, or a name that is not an address), a [`Watcher`] re-reads and re-resolves them
//! every `workers_refresh` while the epoch runs. A worker that appears gets a link at once
//! (the coordinator hears [`Event::Joined`] before anything the link says); a worker that
//! goes is drained ([`Event::Left`]: its open units finish there, or are reassigned if it
//! dies, and it gets no new ones). Where a unit is decoded never changes which batch its
//! samples land in, so the batches stay the plan's whatever joins or leaves.
//!
//! A source that cannot be read or resolved for a moment (a file being rewritten, a DNS
//! server restarting) changes nothing: the pool stays as it was, and the failure is logged
//! once until it clears. An empty source changes nothing either: emptying a pool is done by
//! stopping its workers, whose units then move to the others.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sluice_wire::{BufferPool, JobSpec, Limits};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{read_workers_file, LoaderConfig};
use crate::error::ClientError;
use crate::link::{Event, RemoteLink, SameHostRoute};
use crate::same_host::SameHost;
use crate::session::Command;
use crate::stats::Stats;

pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where the pool's workers are named: the fixed list and the workers file.
#[derive(Clone, Debug)]
pub(crate) struct Source {
    list: Vec<String>,
    file: Option<PathBuf>,
}

impl Source {
    pub(crate) fn new(config: &LoaderConfig) -> Self {
        Source {
            list: config.workers.clone(),
            file: config.workers_file.clone(),
        }
    }

    /// The pool can change while an epoch runs: a workers file, or a name that is not an
    /// address (DNS).
    pub(crate) fn changes(&self) -> bool {
        self.file.is_some() || self.list.iter().any(|n| n.parse::<SocketAddr>().is_err())
    }

    /// The names it gives now, the list's first, each once.
    pub(crate) fn names(&self) -> Result<Vec<String>, ClientError> {
        let mut names = self.list.clone();
        if let Some(file) = &self.file {
            for n in read_workers_file(file)? {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        Ok(names)
    }
}

/// What the pool's source last gave that could be used, kept for the loader's life: when
/// the source cannot be read, parsed or resolved later, at an epoch's start as while one
/// runs, the pool is this again, and the failure is said once per change of state (WARN when
/// it starts or changes, INFO when it clears). Only a loader whose source never gave a list
/// fails for it.
#[derive(Default)]
pub(crate) struct LastGood {
    inner: std::sync::Mutex<Remembered>,
    said: Arc<crate::link::Said>,
}

#[derive(Default)]
struct Remembered {
    names: Option<Vec<String>>,
    members: Vec<Member>,
    failing: Option<String>,
    /// The route last said for each worker (`Dialer::same_host_route`).
    routes: std::collections::HashMap<String, String>,
}

impl LastGood {
    fn lock(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `route` is news for `worker`: the first this loader takes to it, or another
    /// than the last. Each epoch dials its workers again; a log line for every epoch's link
    /// would say nothing new.
    fn route_changed(&self, worker: &str, route: &str) -> bool {
        let mut r = self.lock();
        if r.routes.get(worker).is_some_and(|last| last == route) {
            return false;
        }
        r.routes.insert(worker.to_string(), route.to_string());
        true
    }

    /// What the loader's links said once, for its next epochs' links.
    pub(crate) fn said(&self) -> Arc<crate::link::Said> {
        self.said.clone()
    }

    /// The names `source` gives now (and `true`); when it cannot be read, or names no
    /// worker, the ones it gave last (said once, and `false`). An error only when it never
    /// gave any.
    fn names(&self, source: &Source) -> Result<(Vec<String>, bool), ClientError> {
        let now = source.names();
        let last = self.lock().names.clone();
        match (now, last) {
            (Ok(names), _) if !names.is_empty() => Ok((names, true)),
            (Ok(names), None) => Ok((names, true)),
            (Ok(_), Some(last)) => {
                self.failed("the workers' source names no worker now");
                Ok((last, false))
            }
            (Err(e), Some(last)) => {
                self.failed(&e.to_string());
                Ok((last, false))
            }
            (Err(e), None) => Err(e),
        }
    }

    /// The pool an epoch starts on: the names `source` gives now (else the ones it gave
    /// last), each resolved. A name that does not resolve keeps the workers it gave last (a
    /// blip, said once); one that never resolved is left out, with a warning, until it does.
    /// `keep`: whether names may fail to resolve at all (a pool that changes); a fixed list
    /// must resolve now.
    pub(crate) fn start(&self, source: &Source, keep: bool) -> Result<Vec<Member>, ClientError> {
        let (names, fresh) = self.names(source)?;
        let before = self.lock().members.clone();
        let (members, unresolved) = pool(&names, &before, keep)?;
        let mut kept = false;
        for e in &unresolved {
            let blip = matches!(e, ClientError::Resolve { worker, .. }
                if before.iter().any(|m| &m.name == worker));
            match blip {
                true => self.failed(&e.to_string()),
                false => tracing::warn!(
                    "{e}: the epoch starts without it, and takes it when it resolves"
                ),
            }
            kept |= blip;
        }
        if fresh && !kept {
            self.cleared();
        }
        self.good(&names, &members);
        Ok(members)
    }

    /// The source gave `names`, which are the workers `members`.
    pub(crate) fn good(&self, names: &[String], members: &[Member]) {
        if members.is_empty() {
            return;
        }
        let mut r = self.lock();
        r.names = Some(names.to_vec());
        r.members = members.to_vec();
    }

    /// The source reads (and resolves) again.
    pub(crate) fn cleared(&self) {
        if self.lock().failing.take().is_some() {
            tracing::info!("the workers' source reads again");
        }
    }

    /// The source failed with `e`: said when this is news.
    pub(crate) fn failed(&self, e: &str) {
        let mut r = self.lock();
        if r.failing.as_deref() != Some(e) {
            tracing::warn!("the workers' source: {e} (the workers it gave before stay)");
            r.failing = Some(e.to_string());
        }
    }
}

/// A worker of the pool: the name it came from, the label its links carry, its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub name: String,
    pub label: String,
    pub addr: SocketAddr,
}

/// Whether this machine speaks IPv6 (a UDP socket binds to `[::]`): the client's QUIC
/// endpoint is then dual-stack, and workers may be IPv6 addresses. Checked once.
pub(crate) fn ipv6() -> bool {
    static IPV6: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IPV6.get_or_init(|| std::net::UdpSocket::bind(SocketAddr::from(([0u16; 8], 0))).is_ok())
}

/// Of a name's addresses, the workers: its IPv4 ones if it has any, else its IPv6 ones (where
/// this machine speaks IPv6). A dual-stack pod has one record of each for the same worker;
/// counting both would put it in the pool twice.
fn one_family(mut addrs: Vec<SocketAddr>, ipv6: bool) -> Vec<SocketAddr> {
    let v4 = addrs.iter().any(SocketAddr::is_ipv4);
    addrs.retain(|a| a.is_ipv4() == v4 && (v4 || ipv6));
    addrs.sort();
    addrs.dedup();
    addrs
}

/// The workers `name` resolves to now (each A record, or each AAAA record of a name with
/// none), each with its label: the name itself, or `name (address)` when it gives several.
/// Blocks on DNS.
pub(crate) fn resolve(name: &str) -> Result<Vec<Member>, ClientError> {
    use std::net::ToSocketAddrs;
    let failed = |detail: String| ClientError::Resolve {
        worker: name.to_string(),
        detail,
    };
    let all: Vec<SocketAddr> = name
        .to_socket_addrs()
        .map_err(|e| failed(e.to_string()))?
        .collect();
    let addrs = one_family(all, ipv6());
    if addrs.is_empty() {
        return Err(failed(
            "resolves to no address this machine can reach (IPv6 only, and IPv6 is off here)"
                .into(),
        ));
    }
    let many = addrs.len() > 1;
    Ok(addrs
        .into_iter()
        .map(|addr| Member {
            name: name.to_string(),
            label: if many {
                format!("{name} ({addr})")
            } else {
                name.to_string()
            },
            addr,
        })
        .collect())
}

/// The pool as `names` give it now, each worker once (the first name that gives an address
/// labels it). `keep`: a name that does not resolve keeps the workers it gave before, from
/// `before` (a DNS hiccup drains nobody), and is returned among the errors; otherwise the
/// first such error is returned. Blocks on DNS.
pub(crate) fn pool(
    names: &[String],
    before: &[Member],
    keep: bool,
) -> Result<(Vec<Member>, Vec<ClientError>), ClientError> {
    let mut out: Vec<Member> = Vec::new();
    let mut errors = Vec::new();
    for name in names {
        let members = match resolve(name) {
            Ok(m) => m,
            Err(e) if keep => {
                errors.push(e);
                before.iter().filter(|m| &m.name == name).cloned().collect()
            }
            Err(e) => return Err(e),
        };
        for m in members {
            if !out.iter().any(|o| o.addr == m.addr) {
                out.push(m);
            }
        }
    }
    Ok((out, errors))
}

/// Makes the links of one epoch's job to a worker: everything a link needs but its address.
pub(crate) struct Dialer {
    pub config: Arc<LoaderConfig>,
    pub quic: Option<(crate::quic::Endpoint, quinn_proto::ClientConfig)>,
    pub token: Option<String>,
    pub buffers: Arc<BufferPool>,
    pub segments: Arc<crate::same_host::Segments>,
    /// Same-host slots beyond the credits per link, for samples waiting for their turn: the
    /// loader's bound on those, shared among the workers the epoch starts with.
    pub spare_slots: u32,
    pub spec: JobSpec,
    pub events: mpsc::Sender<Event>,
    pub cancel: CancellationToken,
    /// The loader's memory of its pool, where the routes it said are kept.
    pub last: Arc<LastGood>,
}

/// A link, ready to run: its label, its command queue and its task.
pub(crate) type Dialed = (String, mpsc::Sender<Command>, Task);

impl Dialer {
    /// The links to `worker`, numbered from `first`: one for a same-host worker, else
    /// `connections_per_worker` QUIC connections (they spread one worker's packets over
    /// tasks on both sides).
    pub(crate) fn dial(&self, first: usize, worker: &Member) -> Result<Vec<Dialed>, ClientError> {
        let same_host = self.same_host_route(&worker.label, worker.addr)?;
        let connections = match same_host {
            Some(_) => 1,
            None => self.config.connections_per_worker,
        };
        let mut out = Vec::new();
        for c in 1..=connections {
            let label = match connections {
                1 => worker.label.clone(),
                _ => format!("{} #{c}", worker.label),
            };
            let link = RemoteLink {
                same_host: same_host.clone(),
                ..self.remote_link(first + out.len(), label.clone(), worker.addr)?
            };
            let (tx, rx) = mpsc::channel(64);
            let task: Task = Box::pin(link.run(rx, self.events.clone(), self.cancel.clone()));
            out.push((label, tx, task));
        }
        Ok(out)
    }

    /// A QUIC link (number `link`) to the worker at `addr`.
    fn remote_link(
        &self,
        link: usize,
        name: String,
        addr: SocketAddr,
    ) -> Result<RemoteLink, ClientError> {
        let c = &self.config;
        let (endpoint, client_config) = self
            .quic
            .clone()
            .ok_or_else(|| ClientError::Runtime("no QUIC endpoint".into()))?;
        Ok(RemoteLink {
            link,
            addr,
            name,
            endpoint,
            client_config,
            same_host: None,
            credits: c.credits_per_worker,
            receive_window: c.receive_window,
            token: self.token.clone().unwrap_or_default(),
            client: format!("{} rank {}", c.client_name, c.rank),
            job: self.spec.clone(),
            heartbeat: c.heartbeat,
            silence: c.silence,
            connect_timeout: c.connect_timeout,
            limits: Limits::default(),
            buffers: self.buffers.clone(),
            segments: self.segments.clone(),
            spare_slots: self.spare_slots,
            releasing: Default::default(),
            answered: Default::default(),
            said: self.last.said(),
        })
    }

    /// The same-host route to worker `name` at `addr`, when `same_host` allows and finds one.
    fn same_host_route(
        &self,
        name: &str,
        addr: SocketAddr,
    ) -> Result<Option<SameHostRoute>, ClientError> {
        let c = &self.config;
        let route = match c.same_host {
            SameHost::Off => None,
            mode => match crate::same_host::socket_for(&c.same_host_dir, addr) {
                Ok(socket) => Some(SameHostRoute {
                    socket,
                    required: mode == SameHost::Require,
                    worker_uid: c.same_host_uid,
                }),
                Err(why) if mode == SameHost::Require => {
                    return Err(ClientError::Config {
                        key: "same_host",
                        detail: format!("required, but worker {name}: {why}"),
                    });
                }
                Err(why) => {
                    match self.last.route_changed(name, &why) {
                        true => tracing::info!(worker = %name, "QUIC, not same-host: {why}"),
                        false => tracing::debug!(worker = %name, "QUIC, not same-host: {why}"),
                    }
                    None
                }
            },
        };
        if let Some(r) = &route {
            let socket = r.socket.display();
            match self.last.route_changed(name, &socket.to_string()) {
                true => tracing::info!(worker = %name, %socket, "same-host transport"),
                false => tracing::debug!(worker = %name, %socket, "same-host transport"),
            }
        }
        Ok(route)
    }
}

/// Watches one epoch's pool while it runs (see the module's comment).
pub(crate) struct Watcher {
    pub source: Source,
    pub every: Duration,
    pub dialer: Dialer,
    /// The workers the epoch has links to, with their links' numbers.
    pub pool: Vec<(Member, Vec<usize>)>,
    /// The number the next link gets.
    pub next_link: usize,
    pub stats: Arc<Stats>,
    /// The loader's last good list, and whether its failure was said.
    pub last: Arc<LastGood>,
}

impl Watcher {
    /// Runs until the epoch ends (its coordinator stops listening, or it is cancelled).
    pub(crate) async fn run(mut self) {
        let events = self.dialer.events.clone();
        let cancel = self.dialer.cancel.clone();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.every) => {}
                _ = events.closed() => return,
                _ = cancel.cancelled() => return,
            }
            match self.refresh().await {
                Ok(()) => self.last.cleared(),
                Err(e) => self.last.failed(&e.to_string()),
            }
        }
    }

    /// Reads the source once and brings the epoch's links in line with it.
    async fn refresh(&mut self) -> Result<(), ClientError> {
        let source = self.source.clone();
        let before: Vec<Member> = self.pool.iter().map(|(m, _)| m.clone()).collect();
        let was = before.clone();
        // DNS blocks: off the runtime's threads.
        let (names, now, errors) = tokio::task::spawn_blocking(move || {
            let names = source.names()?;
            let (now, errors) = pool(&names, &was, true)?;
            Ok::<_, ClientError>((names, now, errors))
        })
        .await
        .map_err(|e| ClientError::Runtime(e.to_string()))??;
        if now.is_empty() {
            return Err(ClientError::Runtime(
                "the workers' source names no worker now".into(),
            ));
        }
        self.last.good(&names, &now);
        let (joined, left) = diff(&before, &now);
        let mut result = Ok(());
        for m in joined {
            // One that cannot be dialed (same-host required but not found) stays out; the
            // next refresh tries again.
            if let Err(e) = self.join(m).await {
                result = Err(e);
            }
        }
        for m in left {
            self.leave(&m).await;
        }
        report(&self.stats, &self.pool);
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => result,
        }
    }

    async fn join(&mut self, member: Member) -> Result<(), ClientError> {
        let dialed = self.dialer.dial(self.next_link, &member)?;
        let mut links = Vec::new();
        for (label, commands, task) in dialed {
            let link = self.next_link;
            let joined = Event::Joined {
                link,
                name: label,
                commands,
            };
            if self.dialer.events.send(joined).await.is_err() {
                return Ok(()); // the epoch ended
            }
            tokio::spawn(task);
            links.push(link);
            self.next_link += 1;
        }
        self.pool.push((member, links));
        Ok(())
    }

    async fn leave(&mut self, member: &Member) {
        let Some(i) = self.pool.iter().position(|(m, _)| m.addr == member.addr) else {
            return;
        };
        let (_, links) = self.pool.remove(i);
        for link in links {
            let _ = self.dialer.events.send(Event::Left { link }).await;
        }
    }
}

/// Tells `stats` the pool is now `pool`, and logs each change it had not heard of (an epoch
/// and the one started early behind it report the same changes; each is logged once).
pub(crate) fn report(stats: &Stats, pool: &[(Member, Vec<usize>)]) {
    let workers: Vec<(SocketAddr, String)> = pool
        .iter()
        .map(|(m, _)| (m.addr, m.label.clone()))
        .collect();
    let (came, went) = stats.pool_is(&workers);
    let n = workers.len();
    for w in came {
        tracing::info!("worker {w} joined the pool ({n} workers)");
    }
    for w in went {
        tracing::info!(
            "worker {w} left the pool ({n} workers): it gets no new units; those it holds \
             finish there"
        );
    }
}

/// Who is in `now` and not `before` (by address), and who went.
fn diff(before: &[Member], now: &[Member]) -> (Vec<Member>, Vec<Member>) {
    let index = |ms: &[Member]| -> BTreeMap<SocketAddr, Member> {
        ms.iter().map(|m| (m.addr, m.clone())).collect()
    };
    let (b, n) = (index(before), index(now));
    let joined = now
        .iter()
        .filter(|m| !b.contains_key(&m.addr))
        .cloned()
        .collect();
    let left = before
        .iter()
        .filter(|m| !n.contains_key(&m.addr))
        .cloned()
        .collect();
    (joined, left)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn member(name: &str, addr: &str) -> Member {
        Member {
            name: name.into(),
            label: name.into(),
            addr: addr.parse().unwrap(),
        }
    }

    /// What [`read_workers_file`] makes of a file holding `text`.
    fn read(text: &str) -> Result<Vec<String>, ClientError> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        read_workers_file(file.path())
    }

    #[test]
    fn a_name_gives_its_ipv4_workers_or_else_its_ipv6_ones() {
        let addrs = |list: &[&str]| -> Vec<SocketAddr> {
            list.iter().map(|a| a.parse().unwrap()).collect()
        };
        // A dual-stack pod is one worker: its A record.
        let dual = addrs(&[
            "[fd00::2]:7100",
            "10.0.0.2:7100",
            "10.0.0.1:7100",
            "[fd00::1]:7100",
        ]);
        assert_eq!(
            one_family(dual, true),
            addrs(&["10.0.0.1:7100", "10.0.0.2:7100"])
        );
        // An IPv6-only Service: its AAAA records, where this machine speaks IPv6.
        let v6 = addrs(&["[fd00::2]:7100", "[fd00::1]:7100", "[fd00::1]:7100"]);
        assert_eq!(
            one_family(v6.clone(), true),
            addrs(&["[fd00::1]:7100", "[fd00::2]:7100"])
        );
        assert!(one_family(v6, false).is_empty());
    }

    #[test]
    fn a_workers_file_reads_one_worker_a_line_and_names_a_bad_line() {
        let pool = "# the pool\n10.0.0.1:7100\n\n  cpu.pool.svc:7100   # a headless Service\n";
        assert_eq!(read(pool).unwrap(), ["10.0.0.1:7100", "cpu.pool.svc:7100"]);
        let e = read("10.0.0.1:7100\n10.0.0.2 7100\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("workers_file") && e.contains("line 2"), "{e}");
        let none = Path::new("/nonexistent/sluice-workers");
        let e = read_workers_file(none).unwrap_err().to_string();
        assert!(
            e.contains("workers_file") && e.contains("sluice-workers"),
            "{e}"
        );
    }

    #[test]
    fn only_a_file_or_a_name_makes_a_pool_that_changes() {
        let mut c = LoaderConfig {
            workers: vec!["10.0.0.1:7100".into()],
            ..LoaderConfig::default()
        };
        assert!(!Source::new(&c).changes());
        c.workers.push("cpu.pool.svc:7100".into());
        assert!(Source::new(&c).changes());
        c.workers.truncate(1);
        c.workers_file = Some("/etc/sluice/workers".into());
        assert!(Source::new(&c).changes());
    }

    #[test]
    fn the_pool_changes_by_address() {
        let a = member("a:1", "10.0.0.1:1");
        let b = member("b:1", "10.0.0.2:1");
        let c = member("c:1", "10.0.0.3:1");
        let (joined, left) = diff(&[a.clone(), b.clone()], &[b.clone(), c.clone()]);
        assert_eq!((joined, left), (vec![c.clone()], vec![a]));
        // The same address under another label is the same worker.
        let b2 = Member {
            label: "svc:1 (10.0.0.2:1)".into(),
            ..b.clone()
        };
        assert_eq!(
            diff(std::slice::from_ref(&b), std::slice::from_ref(&b2)),
            (vec![], vec![])
        );
        // And is reported as no change: an epoch that started when `svc` gave several
        // addresses and the next, started when it gave one, report the same worker under two
        // labels, turn about, while both run.
        let stats = Stats::new();
        let at = |m: &Member| vec![(m.addr, m.label.clone())];
        for _ in 0..3 {
            assert_eq!(stats.pool_is(&at(&b)), (vec![], vec![]));
            assert_eq!(stats.pool_is(&at(&b2)), (vec![], vec![]));
        }
        let both = [at(&b2), at(&c)].concat();
        assert_eq!(stats.pool_is(&both), (vec![c.label.clone()], vec![]));
        assert_eq!(stats.pool_is(&at(&c)), (vec![], vec![b2.label]));
        assert_eq!(stats.snapshot().pool_changes, 2);
    }

    #[test]
    fn a_name_that_stops_resolving_keeps_its_workers() {
        let before = vec![member("nowhere.invalid:7100", "10.0.0.9:7100")];
        let names = vec!["127.0.0.1:7100".into(), "nowhere.invalid:7100".into()];
        let (now, errors) = pool(&names, &before, true).unwrap();
        let addrs: Vec<String> = now.iter().map(|m| m.addr.to_string()).collect();
        assert_eq!(addrs, ["127.0.0.1:7100", "10.0.0.9:7100"]);
        assert_eq!(errors.len(), 1);
        assert!(pool(&names, &before, false).is_err());
    }

    #[test]
    fn a_route_is_said_when_it_is_news() {
        let last = LastGood::default();
        assert!(last.route_changed("cpu-0:7100", "/run/sluice/cpu-7100.sock"));
        // The next epoch's link to it, the same way: nothing new.
        assert!(!last.route_changed("cpu-0:7100", "/run/sluice/cpu-7100.sock"));
        assert!(last.route_changed("cpu-1:7100", "/run/sluice/cpu-7100.sock"));
        // Its socket went away: QUIC, said; and back, said again.
        assert!(last.route_changed("cpu-0:7100", "it serves no socket"));
        assert!(last.route_changed("cpu-0:7100", "/run/sluice/cpu-7100.sock"));
    }
}
