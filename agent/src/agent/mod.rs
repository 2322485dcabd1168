//! The agent (`podlapse run`) in phases, each returning a typed error:
//! [`prepare`] learns the node from its runtime and checks the options;
//! [`Prepared::start`] starts the recording (trace, probes, exports) and the sync loop;
//! then [`Started::serve`] follows the manifests until a signal, or
//! [`Started::until_ready`] runs them once; [`Started::finish`] stops everything in order
//! and says what the recording lost. The `cli` only parses flags into [`Options`] and
//! prints.

mod error;
pub mod malloc;
mod outcome;
mod prepare;
pub mod probes;
pub mod recorder;
mod serve;
mod span_wait;
mod start;
mod start_feed;
mod until_ready;

pub use error::AgentError;
pub use outcome::{NotRunning, PodOutcome};
pub use prepare::{Options, Prepared, prepare};
pub use recorder::{DEFAULT_DELETED_POD_RETENTION, Finished, ProbeRequest, TraceLoss};
pub use serve::ServeOptions;
pub use start::Started;
pub use until_ready::{ReadyOptions, ReadyRun, ReadyWatch};
