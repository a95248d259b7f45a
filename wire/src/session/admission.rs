//! Who a worker admits, and as whom: the cluster token or a tenant's, checked in constant
//! time, and the limits a worker enforces from its config ([`Rules`]).

use std::sync::Arc;
use std::time::Duration;

use crate::message::{ErrorCode, Hello, Welcome};

/// Who a worker admits, and as whom.
#[derive(Clone, Default)]
pub enum Admission {
    /// Anyone (`no_auth`, loopback only; the in-process worker).
    #[default]
    Open,
    /// Whoever presents the cluster token; job names and weights are the clients' own.
    Token(String),
    /// Whoever presents one of these tenants' tokens, as that tenant: its jobs are named
    /// `<tenant>/<name>` and capped by its limits, so no tenant can reach another's job.
    Tenants(Vec<Arc<Tenant>>),
}

/// Never a token, wherever the rules are printed.
impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Admission::Open => f.write_str("Open"),
            Admission::Token(_) => f.write_str("Token(..)"),
            Admission::Tenants(t) => f.debug_tuple("Tenants").field(t).finish(),
        }
    }
}

impl From<Option<String>> for Admission {
    fn from(token: Option<String>) -> Self {
        token.map_or(Admission::Open, Admission::Token)
    }
}

/// A team sharing a worker: its token decides who it is, and its limits what its jobs get.
#[derive(Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Prefixes its jobs' names (`<name>/<job name>`); a DNS label ([`Tenant::valid_name`]).
    pub name: String,
    pub token: String,
    /// The largest weight one of its jobs gets (and no more than the worker's cap).
    pub max_weight: u32,
    /// The most unspent credits one of its jobs may hold (and no more than the worker's cap).
    pub max_credits: u32,
    /// The teams whose sweeps may share decodes with its own: those with the same group
    /// (its own name unless the operator groups teams).
    pub share_group: String,
}

/// Never the token, wherever a tenant is printed.
impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("max_weight", &self.max_weight)
            .field("max_credits", &self.max_credits)
            .field("share_group", &self.share_group)
            .finish_non_exhaustive()
    }
}

impl Tenant {
    /// Whether `name` can name a tenant: a DNS label (RFC 1123: 1 to 63 of `a-z 0-9 -`,
    /// starting and ending with a letter or digit), as a Kubernetes namespace is. It prefixes
    /// job names, metric labels and paths, so it holds no `/`, no `.` or `..`, nothing a label
    /// or a log would need to quote, and no control or bidirectional-override characters.
    pub fn valid_name(name: &str) -> bool {
        let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        (1..=63).contains(&name.len())
            && edge(name.as_bytes().first())
            && edge(name.as_bytes().last())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    /// The name a job of this tenant runs under: `asked`, prefixed with the tenant's name
    /// unless the client already gave it.
    pub fn job_name(&self, asked: &str) -> String {
        match asked.strip_prefix(self.name.as_str()) {
            Some(rest) if rest.starts_with('/') => asked.to_string(),
            _ => format!("{}/{asked}", self.name),
        }
    }
}

/// What a worker enforces, from its config.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Who may connect, and as whom.
    pub admission: Admission,
    /// What the worker says of itself to each client.
    pub welcome: Welcome,
    /// Most unspent credits a job may hold (counted credits; slot grants are bounded by the
    /// segment).
    pub max_credits: u32,
    /// Most assignments one connection may have open.
    pub max_units_per_connection: usize,
    /// The cap on the weight a job asks for.
    pub max_job_weight: u32,
    /// Between heartbeats to each client.
    pub heartbeat: Duration,
    /// A client silent this long has its connection closed (and its jobs cancelled).
    pub client_silence: Duration,
    /// From connecting to `Hello`.
    pub handshake: Duration,
    /// The largest shared-memory segment a same-host client may attach (its slots, or its
    /// batch arena), in bytes (`same_host.max_segment_bytes`).
    pub max_segment_bytes: u64,
}

impl Rules {
    /// A worker that says `welcome` and admits clients as `admission` says (a cluster
    /// token: `Some(token)`), with the limits and times of `sluice cpu`'s default config.
    pub fn new(admission: impl Into<Admission>, welcome: Welcome) -> Rules {
        Rules {
            admission: admission.into(),
            welcome,
            max_credits: 4096,
            max_units_per_connection: 16,
            max_job_weight: 16,
            heartbeat: Duration::from_secs(1),
            client_silence: Duration::from_secs(10),
            handshake: Duration::from_secs(5),
            max_segment_bytes: 4 << 30,
        }
    }
}

/// Whom `hello`'s token admits under `admission` (`None`: no tenant), or why it is refused.
pub(super) fn admit(
    admission: &Admission,
    hello: &Hello,
) -> Result<Option<Arc<Tenant>>, (ErrorCode, String)> {
    let admitted = match admission {
        Admission::Open => Ok(None),
        Admission::Token(expected) => match token_matches(expected, &hello.token) {
            true => Ok(None),
            false => Err("cluster token"),
        },
        Admission::Tenants(tenants) => {
            // Every token is compared, so the time says nothing of which matched.
            let mut found = None;
            for t in tenants {
                if token_matches(&t.token, &hello.token) {
                    found = Some(t.clone());
                }
            }
            found.map(Some).ok_or("tenant token")
        }
    };
    admitted.map_err(|what| {
        let why = match hello.token.is_empty() {
            true => format!("no {what} given"),
            false => format!("wrong {what}"),
        };
        (ErrorCode::Unauthorized, why)
    })
}

/// Constant-time comparison, so a token cannot be guessed byte by byte from timings.
fn token_matches(expected: &str, given: &str) -> bool {
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
