//! `[limits.NAME]` and `[prices]`, typed: who a limit limits (its `key`, [`KeySpec`]: the syntax
//! and its canonical order; the bucket a request falls in is `limits::key`'s), its quotas, what a
//! request over it does (`on_limit`, `max_wait`, the `weights` of `share_by`'s values) and what
//! the fleet does while Redis is away (`redis_down`). Enforced by `limiter` (the pure arithmetic is `limits`'s); the keys and
//! their defaults are in docs/configuration.md, worked examples in docs/limits.md.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::header::HeaderName;
use smallvec::SmallVec;

use crate::credentials::HEADERS;

/// An upstream's `concurrency`: the requests it may have in flight at once, per credential and
/// model, across the fleet. Enforced by `limiter::concurrency`, adapted by `limits::aimd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Concurrency {
    /// A number: this many, always.
    Fixed(u32),
    /// `"adaptive"`: found from the provider's answers, within `[concurrency]`'s bounds.
    Adaptive,
}

/// `[concurrency]`: where every adaptive limit starts, and the bounds it moves in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConcurrencyBounds {
    pub initial: u32,
    pub min: u32,
    pub max: u32,
}

impl Default for ConcurrencyBounds {
    fn default() -> ConcurrencyBounds {
        ConcurrencyBounds {
            initial: 20,
            min: 1,
            max: 1000,
        }
    }
}

/// One `[limits.NAME]` table.
#[derive(Debug, Clone)]
pub struct LimitPolicy {
    pub name: String,
    /// Who is limited: each value of the key has its own bucket.
    pub(crate) key: KeySpec,
    pub requests_per_minute: Option<u64>,
    /// Input + output tokens.
    pub tokens_per_minute: Option<u64>,
    pub concurrent: Option<u32>,
    /// Spend per UTC day, in micro-USD (from `usd_per_day` and `[prices]`).
    pub micro_usd_per_day: Option<u64>,
    /// Spend per UTC calendar month, in micro-USD.
    pub micro_usd_per_month: Option<u64>,
    pub on_limit: OnLimit,
    /// The longest a request waits in the queue (`on_limit = "queue"`), within its deadline.
    pub max_wait: Duration,
    /// Under scarcity, the queue releases `share_by`'s values by these weights (1 when unlisted).
    pub weights: BTreeMap<String, u32>,
    /// Whose shares the queue balances, on a limit whose key does not name them.
    pub(crate) share_by: Option<KeySpec>,
    pub redis_down: RedisDown,
}

/// What a request over a limit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimit {
    /// Waits in a fair queue while its deadline allows and at most `max_wait`, then 429.
    Queue,
    /// 429 `limit_exceeded` at once.
    Reject,
}

/// What a replica does with a limit while Redis is away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisDown {
    /// Each replica enforces its share of the limit (the limit over the replicas it last saw).
    Local,
    /// No limit.
    Open,
    /// Every request over the limit's key is refused (429) until Redis is back.
    Closed,
}

/// A model's price: USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PriceConfig {
    pub input: f64,
    pub output: f64,
    /// Prompt tokens read from the provider's cache (the input price when not given).
    pub cached_input: f64,
}

/// Micro-USD in one USD.
pub(crate) const MICRO: f64 = 1_000_000.0;

/// One part of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// The route's name: one bucket per route.
    Route,
    /// The credential the request carried (its hash): one bucket per API key.
    Credential,
    /// The model the request names (none: the scope `""`).
    Model,
    /// A request header's value (absent: the scope `""`), e.g. a team or tenant.
    Header(HeaderName),
}

impl Part {
    /// The canonical order of parts: the one a key is printed and hashed in.
    fn rank(&self) -> (u8, &str) {
        match self {
            Part::Route => (0, ""),
            Part::Credential => (1, ""),
            Part::Model => (2, ""),
            Part::Header(name) => (3, name.as_str()),
        }
    }
}

/// A limit's `key`: the parts whose values give each request its bucket. Parts are kept in a
/// canonical order (route, credential, model, headers by name), so `"model+header:x-team"` and
/// `"header:x-team+model"` are one key with one set of buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeySpec {
    parts: SmallVec<[Part; 2]>,
}

const EXPECTED: &str = "expected \"route\", \"credential\", \"model\" or \"header:NAME\", joined with \"+\"";

impl KeySpec {
    /// Parses a key (surrounding spaces of each part are ignored). The error says what was
    /// expected; the config layer prefixes the file and the key.
    pub(crate) fn parse(text: &str) -> Result<KeySpec, String> {
        let mut parts: SmallVec<[Part; 2]> = SmallVec::new();
        for word in text.split('+').map(str::trim) {
            let part = match word {
                "route" => Part::Route,
                "credential" => Part::Credential,
                "model" => Part::Model,
                "" => return Err(format!("an empty part in {text:?}: {EXPECTED}")),
                _ => Part::Header(header_part(word)?),
            };
            if parts.contains(&part) {
                return Err(format!("{word:?} twice in {text:?}: each part may appear once"));
            }
            parts.push(part);
        }
        parts.sort_by(|a, b| a.rank().cmp(&b.rank()));
        Ok(KeySpec { parts })
    }

    /// The parts, in canonical order.
    pub(crate) fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Whether the key names this header (the config layer refuses one of `[server]
    /// credential_headers`: a credential is keyed by `"credential"`, its hash).
    pub(crate) fn names_header(&self, name: &HeaderName) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Header(h) if h == name))
    }

    /// Whether the key needs the request's model (else the pipeline need not find it).
    pub(crate) fn uses_model(&self) -> bool {
        self.parts.contains(&Part::Model)
    }

    /// Whether the key needs the credential's hash (else the pipeline need not compute it).
    pub(crate) fn uses_credential(&self) -> bool {
        self.parts.contains(&Part::Credential)
    }
}

/// The header a `header:NAME` part names.
fn header_part(word: &str) -> Result<HeaderName, String> {
    let Some(name) = word.strip_prefix("header:") else {
        return Err(format!("unknown part {word:?}: {EXPECTED}"));
    };
    let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
        format!("{word:?} does not name a valid header: expected \"header:NAME\", e.g. \"header:x-team\"")
    })?;
    if HEADERS.contains(&name) {
        return Err(format!(
            "{word:?} is a credential header: key by \"credential\" (its hash) instead"
        ));
    }
    Ok(name)
}

impl FromStr for KeySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<KeySpec, String> {
        KeySpec::parse(s)
    }
}

impl fmt::Display for KeySpec {
    /// The canonical spelling, e.g. `model+header:x-team`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            match part {
                Part::Route => f.write_str("route")?,
                Part::Credential => f.write_str("credential")?,
                Part::Model => f.write_str("model")?,
                Part::Header(name) => write!(f, "header:{name}")?,
            }
        }
        Ok(())
    }
}
