//! `[limits.NAME]` and `[prices]`, typed: who a limit limits (its `key`), its quotas, what a
//! request over it does (`on_limit`, `max_wait`, the `weights` of `share_by`'s values) and what
//! the fleet does while Redis is away (`redis_down`). Enforced by `crate::limits`; the keys and
//! their defaults are in docs/configuration.md, worked examples in docs/limits.md.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::limits::key::KeySpec;

/// One `[limits.NAME]` table.
#[derive(Debug, Clone)]
pub struct LimitPolicy {
    pub name: String,
    /// Who is limited: each value of the key has its own bucket.
    #[allow(dead_code)] // read by the admission step (issue 49, next)
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
    #[allow(dead_code)] // read by the fair queue (issue 49, next)
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
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Prompt tokens read from the provider's cache (the input price when not given).
    pub cached_input: f64,
}

/// Micro-USD in one USD.
pub(crate) const MICRO: f64 = 1_000_000.0;
