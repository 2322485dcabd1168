//! Prometheus metrics: kubelet's histograms under kubelet's names where kubelet has one,
//! and podlapse's own (stages, CNI plugins, lost kernel events). Served on `/metrics`.

mod diagnosis;
mod observed;
mod registry;
mod server;

pub use registry::{Metrics, operation_type};
pub use server::{DEFAULT_METRICS_ADDR, MetricsError, bind, parse_addr, serve, serve_on};
