//! Workflows behind `cargo xtask`. The library half exists so that integration tests can
//! start, inspect and tear down the node lab with the same code the CLI uses.

pub mod agent_process;
pub mod debs;
pub mod lab;
pub mod poll;
pub mod text;

/// Perfetto's own Python definitions of its trace format (the `perfetto` package on
/// PyPI, with the protobuf runtime it needs), which the `.pftrace` test reads its output
/// with. `cargo xtask setup` installs them into [`PERFETTO_PYTHON_DIR`] under the
/// workspace, outside any Python installation's own packages.
pub const PERFETTO_PYTHON_PACKAGES: &[&str] = &["perfetto==0.59.1", "protobuf==7.36.2"];
/// Where, relative to the workspace root, those packages are installed.
pub const PERFETTO_PYTHON_DIR: &str = "target/perfetto-python";
