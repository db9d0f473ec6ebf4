//! What every step of a request shares beyond its route: the metrics, the task tracker and its
//! hard stop, the credential forms in force, and the fleet's circuits and holds (a local mirror).
//! The steps take it, never the [`super::Proxy`] they run in.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::circuit::Circuits;
use crate::credentials::Credentials;
use crate::metrics::Metrics;

pub(super) struct Context {
    pub(super) metrics: Arc<Metrics>,
    /// Tasks that outlive their request (upgraded connections, dead-letter writes), drained on
    /// shutdown.
    pub(super) tasks: TaskTracker,
    /// Cancelled when the shutdown grace runs out.
    pub(super) hard_stop: CancellationToken,
    /// The credential forms in force (`[server] credential_headers`).
    pub(super) credentials: Credentials,
    /// Every upstream's breaker and the credentials' holds.
    pub(super) circuits: Arc<Circuits>,
    /// The `[limits.*]` of the configuration and their buckets on this replica.
    pub(super) limiter: Arc<crate::limiter::Limiter>,
}
