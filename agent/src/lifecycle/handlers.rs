//! kubelet's `HandlerRunner`: runs a postStart or preStop handler against a container.
//! Exec goes through CRI ExecSync, httpGet through the prober's HTTP client, sleep waits;
//! tcpSocket is accepted by the API for compatibility but kubelet refuses to run it.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, LifecycleHandler, Pod};

use crate::cri::RuntimeService;
use crate::prober::action::{ActionError, ExecError, exec_in_container};
use crate::prober::gofmt;
use crate::prober::http::{self, HttpError, HttpRequest, LIFECYCLE_PURPOSE};

/// Why a hook failed. Display is kubelet's message for the failure, the text it logs and
/// once put in the `FailedPostStartHook` / `FailedPreStopHook` event (current kubelet
/// records only "PostStartHook failed" there, to keep command output out of events).
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The exec command exited non-zero, timed out, or the runtime could not run it.
    #[error(
        "Exec lifecycle hook ({}) for Container {} in Pod {} failed - error: {source}, message: {}",
        gofmt::list(command),
        gofmt::quote(container.as_bytes()),
        gofmt::quote(pod.as_bytes()),
        gofmt::quote(message.as_bytes())
    )]
    Exec {
        command: Vec<String>,
        container: String,
        pod: String,
        #[source]
        source: Box<ExecError>,
        /// The command's combined output.
        message: String,
    },

    /// The GET could not be made: no port, no host, or a bad header.
    #[error(
        "HTTP lifecycle hook ({path}) for Container {} in Pod {} failed - error: {source}",
        gofmt::quote(container.as_bytes()),
        gofmt::quote(pod.as_bytes())
    )]
    HttpRequest {
        path: String,
        container: String,
        pod: String,
        #[source]
        source: Box<ActionError>,
    },

    /// The GET got no response (refused, reset, timed out).
    #[error(
        "HTTP lifecycle hook ({path}) for Container {} in Pod {} failed - error: {source}",
        gofmt::quote(container.as_bytes()),
        gofmt::quote(pod.as_bytes())
    )]
    Http {
        path: String,
        container: String,
        pod: String,
        #[source]
        source: Box<HttpError>,
    },

    /// The hook's time ran out before the sleep did.
    #[error(
        "Sleep lifecycle hook ({seconds}) for Container {} in Pod {} failed - error: container terminated before sleep hook finished",
        gofmt::quote(container.as_bytes()),
        gofmt::quote(pod.as_bytes())
    )]
    Sleep {
        seconds: i64,
        container: String,
        pod: String,
    },

    /// The handler names nothing kubelet runs: tcpSocket, an empty command, no action.
    #[error("Cannot run handler: invalid handler: {reason}")]
    Invalid { reason: String },
}

/// The action a handler asks for, once it is known to be runnable.
#[derive(Debug, Clone, PartialEq)]
pub enum HookAction<'a> {
    Exec(&'a [String]),
    HttpGet(&'a HTTPGetAction),
    Sleep(i64),
}

impl<'a> HookAction<'a> {
    /// Picks the action in kubelet's order (exec, httpGet, sleep) and refuses the rest.
    pub fn from_handler(handler: &'a LifecycleHandler) -> Result<HookAction<'a>, HandlerError> {
        let invalid = |reason: &str| HandlerError::Invalid {
            reason: reason.to_string(),
        };
        if let Some(exec) = &handler.exec {
            return match exec.command.as_deref() {
                Some(cmd) if !cmd.is_empty() => Ok(HookAction::Exec(cmd)),
                _ => Err(invalid("exec.command is empty")),
            };
        }
        if let Some(get) = &handler.http_get {
            return Ok(HookAction::HttpGet(get));
        }
        if let Some(sleep) = &handler.sleep {
            return match sleep.seconds {
                s if s < 0 => Err(invalid(&format!("sleep.seconds is negative ({s})"))),
                s => Ok(HookAction::Sleep(s)),
            };
        }
        if handler.tcp_socket.is_some() {
            return Err(invalid("tcpSocket is not supported for lifecycle hooks"));
        }
        Err(invalid("no exec, httpGet or sleep action"))
    }
}

/// Runs `handler` for the container, taking at most `timeout` (for preStop, what is left
/// of the grace period). `pod_ip` is the host of an httpGet without one.
pub async fn run_handler<R: RuntimeService>(
    cri: &R,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    pod_ip: &str,
    handler: &LifecycleHandler,
    timeout: Duration,
) -> Result<(), HandlerError> {
    match HookAction::from_handler(handler)? {
        HookAction::Exec(command) => {
            run_exec_handler(cri, pod, container, container_id, command, timeout).await
        }
        HookAction::HttpGet(action) => {
            run_http_handler(pod, container, pod_ip, action, timeout).await
        }
        HookAction::Sleep(seconds) => run_sleep_handler(pod, container, seconds, timeout).await,
    }
}

async fn run_exec_handler<R: RuntimeService>(
    cri: &R,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    command: &[String],
    timeout: Duration,
) -> Result<(), HandlerError> {
    // The runtime enforces the timeout too (in whole seconds); this bounds the call for a
    // runtime that does not.
    let run = tokio::time::timeout(
        timeout,
        exec_in_container(cri, container_id, command.to_vec(), timeout),
    )
    .await;
    let (source, output) = match run {
        Ok(done) => match done.error {
            None => return Ok(()),
            Some(e) => (e, done.output),
        },
        Err(_) => (
            ExecError::TimedOut {
                command: command.to_vec(),
            },
            Vec::new(),
        ),
    };
    Err(HandlerError::Exec {
        command: command.to_vec(),
        container: container.name.clone(),
        pod: gofmt::pod(pod),
        source: Box::new(source),
        message: String::from_utf8_lossy(&output).into_owned(),
    })
}

/// An httpGet hook succeeds on any response: kubelet does not look at the status code of
/// a hook, only at whether the server answered.
pub async fn run_http_handler(
    pod: &Pod,
    container: &Container,
    pod_ip: &str,
    action: &HTTPGetAction,
    timeout: Duration,
) -> Result<(), HandlerError> {
    let path = action.path.clone().unwrap_or_default();
    let req = HttpRequest::new(action, container, pod_ip, LIFECYCLE_PURPOSE).map_err(|source| {
        HandlerError::HttpRequest {
            path: path.clone(),
            container: container.name.clone(),
            pod: gofmt::pod(pod),
            source: Box::new(source),
        }
    })?;
    http::get(&req, timeout, false)
        .await
        .map(|_| ())
        .map_err(|source| HandlerError::Http {
            path,
            container: container.name.clone(),
            pod: gofmt::pod(pod),
            source: Box::new(source),
        })
}

/// Sleeps `seconds`, or fails once `timeout` is up first, as kubelet does when the
/// container is killed before its preStop sleep ends.
pub async fn run_sleep_handler(
    pod: &Pod,
    container: &Container,
    seconds: i64,
    timeout: Duration,
) -> Result<(), HandlerError> {
    let want = Duration::from_secs(seconds.max(0).unsigned_abs());
    if want <= timeout {
        tokio::time::sleep(want).await;
        return Ok(());
    }
    tokio::time::sleep(timeout).await;
    Err(HandlerError::Sleep {
        seconds,
        container: container.name.clone(),
        pod: gofmt::pod(pod),
    })
}
