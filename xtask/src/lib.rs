//! Workflows behind `cargo xtask`. The library half exists so that integration tests can
//! start, inspect and tear down the node lab with the same code the CLI uses.

pub mod lab;
