//! An observer's run in phases, as the agent's: [`connect`] learns what the runtime is
//! and how to follow it (its event stream, or lists); [`Connected::start`] starts the
//! probes, the trace, the API and the span receiver; [`Running::observe`] follows the
//! runtime until told to stop; [`Running::finish`] stops it all in order and says what
//! was observed and lost. Nothing here calls a mutating CRI method or touches a cgroup.

mod connect;
mod forget;
mod metrics;
mod outputs;
mod start;

pub use connect::{Connected, connect};
pub use start::{Finished, Options, Running};
