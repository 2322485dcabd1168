//! The node's pod network as its runtime and CNI plugins keep it, read for "why has this
//! pod no IP?": the CNI configuration directory in libcni's order ([`conf_dir`]),
//! host-local's pool and its reservations ([`ipam`]), and the phrases the runtime and
//! the plugins use for each fault ([`words`]). Reading only: nothing here runs a plugin
//! or changes a file.

pub mod conf_dir;
pub mod ipam;
pub mod words;
