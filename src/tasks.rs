//! Starting a task: every task rebound starts outside a `TaskTracker` goes through [`spawn`],
//! named for what it does (clippy refuses a bare `tokio::spawn`, `clippy.toml`). The name is a
//! debug-level span around the task, so that each event it logs says which task it comes from;
//! at the default level the span is disabled and costs a check per poll.

use std::future::Future;

use tokio::task::JoinHandle;
use tracing::Instrument as _;

/// Starts `task` on the runtime, named `name`.
#[allow(clippy::disallowed_methods)] // the one place a task is started bare
pub(crate) fn spawn<F>(name: &'static str, task: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(task.instrument(tracing::debug_span!("task", name)))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_task_runs_and_hands_back_its_output() {
        assert_eq!(super::spawn("test", async { 41 + 1 }).await.unwrap(), 42);
    }
}
