//! Container CPU and memory settings from the spec, converted as kubelet converts them.

use k8s_openapi::api::core::v1::Container;

use crate::cri::api;
use crate::kubelet::quantity;

/// CFS period kubelet uses for CPU limits (100 ms).
pub const CPU_PERIOD_US: i64 = 100_000;
const MIN_SHARES: i64 = 2;
const SHARES_PER_CPU: i64 = 1024;

/// CPU shares for a request of `milli` milli-CPU.
pub fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    (milli * SHARES_PER_CPU / 1000).max(MIN_SHARES)
}

/// CFS quota for a limit of `milli` milli-CPU.
pub fn milli_cpu_to_quota(milli: i64) -> i64 {
    if milli == 0 {
        return 0;
    }
    (milli * CPU_PERIOD_US / 1000).max(1000)
}

pub fn linux_container_resources(c: &Container) -> api::LinuxContainerResources {
    let res = c.resources.as_ref();
    let get = |which: Option<&std::collections::BTreeMap<String, _>>, key: &str| {
        which.and_then(|m| m.get(key).cloned())
    };
    let limits = res.and_then(|r| r.limits.as_ref());
    let requests = res.and_then(|r| r.requests.as_ref());
    let cpu_limit = get(limits, "cpu").and_then(|q| quantity::milli_value(&q));
    // A limit without a request means request = limit, as API defaulting does.
    let cpu_request = get(requests, "cpu")
        .and_then(|q| quantity::milli_value(&q))
        .or(cpu_limit)
        .unwrap_or(0);
    let memory_limit = get(limits, "memory")
        .and_then(|q| quantity::value(&q))
        .unwrap_or(0);
    api::LinuxContainerResources {
        cpu_shares: milli_cpu_to_shares(cpu_request),
        cpu_quota: cpu_limit.map(milli_cpu_to_quota).unwrap_or(0),
        cpu_period: if cpu_limit.is_some() {
            CPU_PERIOD_US
        } else {
            0
        },
        memory_limit_in_bytes: memory_limit,
        oom_score_adj: 0,
        ..Default::default()
    }
}
