//! The states and exit reasons a runtime's status answers carry, as CRI numbers and names
//! them: `PodSandboxState`, `ContainerState`, and the reason containerd gives an exited
//! container. A trace writes a state by its CRI number and a reason by its name.

use std::fmt;

/// CRI's `PodSandboxState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodSandboxState {
    /// `SANDBOX_READY` (0).
    Ready,
    /// `SANDBOX_NOTREADY` (1).
    NotReady,
}

impl PodSandboxState {
    /// The state CRI numbers `n`; `None` for a number CRI does not define.
    pub fn from_number(n: i32) -> Option<PodSandboxState> {
        match n {
            0 => Some(PodSandboxState::Ready),
            1 => Some(PodSandboxState::NotReady),
            _ => None,
        }
    }

    /// The state's number in CRI (and in a trace).
    pub fn number(self) -> i32 {
        match self {
            PodSandboxState::Ready => 0,
            PodSandboxState::NotReady => 1,
        }
    }
}

/// CRI's `ContainerState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// `CONTAINER_CREATED` (0).
    Created,
    /// `CONTAINER_RUNNING` (1).
    Running,
    /// `CONTAINER_EXITED` (2).
    Exited,
    /// `CONTAINER_UNKNOWN` (3).
    Unknown,
}

impl ContainerState {
    /// The state CRI numbers `n`; `None` for a number CRI does not define.
    pub fn from_number(n: i32) -> Option<ContainerState> {
        match n {
            0 => Some(ContainerState::Created),
            1 => Some(ContainerState::Running),
            2 => Some(ContainerState::Exited),
            3 => Some(ContainerState::Unknown),
            _ => None,
        }
    }

    /// The state's number in CRI (and in a trace).
    pub fn number(self) -> i32 {
        match self {
            ContainerState::Created => 0,
            ContainerState::Running => 1,
            ContainerState::Exited => 2,
            ContainerState::Unknown => 3,
        }
    }
}

/// Why a container is in its state, as the runtime says it (`ContainerStatus.reason`):
/// containerd's names by variant, any other runtime's text as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ContainerReason {
    /// `Completed`: exited with code 0.
    Completed,
    /// `Error`: exited with another code.
    Error,
    /// `OOMKilled`: the kernel's OOM killer ended it.
    OomKilled,
    /// `StartError`: the runtime could not start it.
    StartError,
    /// A reason named otherwise; never one of the names above.
    Other(String),
}

impl ContainerReason {
    /// The reason `text` names.
    pub fn new(text: &str) -> ContainerReason {
        match text {
            "Completed" => ContainerReason::Completed,
            "Error" => ContainerReason::Error,
            "OOMKilled" => ContainerReason::OomKilled,
            "StartError" => ContainerReason::StartError,
            other => ContainerReason::Other(other.to_string()),
        }
    }

    /// The reason as the runtime spelled it.
    pub fn as_str(&self) -> &str {
        match self {
            ContainerReason::Completed => "Completed",
            ContainerReason::Error => "Error",
            ContainerReason::OomKilled => "OOMKilled",
            ContainerReason::StartError => "StartError",
            ContainerReason::Other(text) => text,
        }
    }
}

impl fmt::Display for ContainerReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_keep_their_cri_numbers() {
        for n in -1..6 {
            if let Some(s) = PodSandboxState::from_number(n) {
                assert_eq!(s.number(), n);
            }
            if let Some(s) = ContainerState::from_number(n) {
                assert_eq!(s.number(), n);
            }
        }
        assert_eq!(
            PodSandboxState::from_number(0),
            Some(PodSandboxState::Ready)
        );
        assert_eq!(PodSandboxState::from_number(2), None);
        assert_eq!(ContainerState::from_number(2), Some(ContainerState::Exited));
        assert_eq!(ContainerState::from_number(4), None);
    }

    #[test]
    fn a_reason_reads_back_as_it_was_spelled() {
        for text in [
            "Completed",
            "Error",
            "OOMKilled",
            "StartError",
            "ContainerCannotRun",
        ] {
            assert_eq!(ContainerReason::new(text).as_str(), text);
            assert_eq!(ContainerReason::new(text).to_string(), text);
        }
        assert_eq!(
            ContainerReason::new("OOMKilled"),
            ContainerReason::OomKilled
        );
        assert_eq!(
            ContainerReason::new("Unknown"),
            ContainerReason::Other("Unknown".into())
        );
    }
}
