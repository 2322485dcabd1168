//! A runtime of its own for the work whose latency is the point: reading the kernel's
//! events (a container's first exec shows it running) and waiting on containers'
//! processes to exit (their pidfds), so the agent shows both as soon as the kernel
//! reports them.
//!
//! tokio's multi-thread scheduler polls its I/O and timer drivers when a worker runs out
//! of tasks, or after a few dozen task polls, so while the sync loop is busy (pods
//! restarting, a burst of creations) a pidfd or ring buffer that turned readable waits
//! behind its tasks: measured with eight crash-looping pods, the kernel's exit to the
//! watcher waking took up to 104 ms (debug build) on the shared runtime, 18 ms here. On
//! a thread of its own, idle but for these waits, the drivers are polled as soon as the
//! kernel wakes it.
//!
//! What runs here only decodes events, reads pidfds and `/proc`, and hands results on
//! through channels and the status store's mutex; the sync loop stays on the caller's
//! runtime.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

static HANDLE: OnceLock<Option<Handle>> = OnceLock::new();
static ON_START: OnceLock<fn()> = OnceLock::new();

/// Runs `f` first thing on the event thread, as tokio's `on_thread_start` does on the
/// agent's runtime threads (the scheduler slice they ask for). Call before the first
/// [`spawn`]; a second call is ignored.
pub fn on_thread_start(f: fn()) {
    let _ = ON_START.set(f);
}

/// Runs `f` on the event thread, started on first use; on the caller's runtime if that
/// thread cannot be started (it is logged once).
pub fn spawn<F>(f: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match HANDLE.get_or_init(start) {
        Some(handle) => handle.spawn(f),
        None => tokio::spawn(f),
    }
}

fn start() -> Option<Handle> {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!(
                "no thread of its own for kernel events ({e}); sharing the agent's runtime"
            );
            return None;
        }
    };
    let handle = runtime.handle().clone();
    let started = std::thread::Builder::new()
        .name("podlapse-events".into())
        .spawn(move || {
            if let Some(f) = ON_START.get() {
                f();
            }
            runtime.block_on(std::future::pending::<()>())
        });
    match started {
        Ok(_) => Some(handle),
        Err(e) => {
            tracing::warn!(
                "no thread of its own for kernel events ({e}); sharing the agent's runtime"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_spawned_there_runs_on_its_own_thread() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        spawn(async move {
            let _ = tx.send(std::thread::current().name().map(str::to_string));
        });
        let name = rx.await.expect("the task ran");
        assert_eq!(name.as_deref(), Some("podlapse-events"));
    }
}
