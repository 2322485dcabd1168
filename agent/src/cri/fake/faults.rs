//! Error injection for the fake runtime: a fault makes calls of one method fail, all of
//! them or only those for one container or image, or only the Nth of those, with the
//! error a real runtime gives (a gRPC status and containerd's wording, or a deadline).

use std::time::Duration;

use super::calls::Method;
use crate::cri::CriError;

/// How a faulty call fails.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// The runtime answers with this status.
    Status { code: tonic::Code, message: String },
    /// No answer within the call's deadline.
    Timeout(Duration),
}

/// A fault to inject: which calls fail and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    method: Method,
    container: Option<String>,
    image: Option<String>,
    nth: Option<usize>,
    failure: Failure,
}

impl Fault {
    /// Every call of `method` fails with the status `code` and `message`.
    pub fn new(method: Method, code: tonic::Code, message: impl Into<String>) -> Fault {
        Fault {
            method,
            container: None,
            image: None,
            nth: None,
            failure: Failure::Status {
                code,
                message: message.into(),
            },
        }
    }

    /// Every call of `method` gets no answer within its deadline `after`.
    pub fn timeout(method: Method, after: Duration) -> Fault {
        Fault {
            failure: Failure::Timeout(after),
            ..Fault::new(method, tonic::Code::DeadlineExceeded, "")
        }
    }

    /// Only calls for the container of this name (the name in its config's metadata).
    pub fn for_container(mut self, name: impl Into<String>) -> Fault {
        self.container = Some(name.into());
        self
    }

    /// Only calls for this image (ImageStatus, PullImage).
    pub fn for_image(mut self, image: impl Into<String>) -> Fault {
        self.image = Some(image.into());
        self
    }

    /// Only the `n`th call (from 1) that the fault otherwise matches; the others succeed.
    pub fn nth(mut self, n: usize) -> Fault {
        self.nth = Some(n);
        self
    }

    /// The method the fault is for.
    pub fn method(&self) -> Method {
        self.method
    }

    /// True when a call of `method` for `container` (its name) and `image` is one this
    /// fault is about, whichever of them it is.
    pub(super) fn matches(
        &self,
        method: Method,
        container: Option<&str>,
        image: Option<&str>,
    ) -> bool {
        self.method == method
            && self
                .container
                .as_deref()
                .is_none_or(|c| container == Some(c))
            && self.image.as_deref().is_none_or(|i| image == Some(i))
    }

    /// True when the `seen`th matching call (from 1) fails.
    pub(super) fn fires_at(&self, seen: usize) -> bool {
        self.nth.is_none_or(|n| n == seen)
    }

    /// The error the call returns.
    pub(super) fn error(&self) -> CriError {
        match &self.failure {
            Failure::Status { code, message } => CriError::Call {
                method: self.method.as_str(),
                code: *code,
                message: message.clone(),
            },
            Failure::Timeout(after) => CriError::Timeout {
                method: self.method.as_str(),
                after: *after,
            },
        }
    }

    /// RunPodSandbox fails in the CNI plugin: the pod network could not be set up (here
    /// host-local's range is used up), as containerd reports it.
    pub fn cni_failure() -> Fault {
        Fault::new(
            Method::RunPodSandbox,
            tonic::Code::Unknown,
            "failed to setup network for sandbox: plugin type=\"bridge\" name=\"podlapse\" \
             failed (add): failed to allocate for range 0: no IP addresses available in \
             range set: 10.88.0.1-10.88.0.2",
        )
    }

    /// PullImage fails: the registry does not have the image.
    pub fn image_not_found(image: &str) -> Fault {
        Fault::new(
            Method::PullImage,
            tonic::Code::NotFound,
            format!(
                "failed to pull and unpack image {image:?}: failed to resolve reference \
                 {image:?}: {image}: not found"
            ),
        )
        .for_image(image)
    }

    /// CreateContainer fails for the container `name`: containerd cannot build its spec
    /// (here, AppArmor asked for and no apparmor_parser on the host).
    pub fn create_failed(name: &str) -> Fault {
        Fault::new(
            Method::CreateContainer,
            tonic::Code::Unknown,
            "failed to create containerd container: get apparmor_parser version: exec: \
             \"apparmor_parser\": executable file not found in $PATH",
        )
        .for_container(name)
    }

    /// StartContainer fails for the container `name`: runc cannot exec its command.
    pub fn exec_not_found(name: &str, command: &str) -> Fault {
        Fault::new(
            Method::StartContainer,
            tonic::Code::Unknown,
            format!(
                "failed to create containerd task: failed to create shim task: OCI runtime \
                 create failed: runc create failed: unable to start container process: error \
                 during container init: exec: {command:?}: executable file not found in \
                 $PATH: unknown"
            ),
        )
        .for_container(name)
    }
}

/// A fault and how many calls it has matched so far.
#[derive(Debug)]
pub(super) struct Armed {
    pub fault: Fault,
    pub seen: usize,
}
