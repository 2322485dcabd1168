//! The machine a run measured, so figures from different machines are never compared
//! without saying so.

use serde_json::{Value, json};

pub struct Machine {
    pub nproc: usize,
    pub memory: String,
    pub kernel: String,
    pub cpu_model: String,
    /// The lab's container runtime, as its binary says (`containerd 2.1.9+unknown`).
    pub runtime: String,
    pub unix_time: u64,
}

fn first_field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

pub fn describe() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = first_field(&meminfo, "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or_else(
            || "unknown".to_string(),
            |kib| format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0)),
        );
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string());
    Machine {
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory,
        kernel,
        cpu_model: first_field(&cpuinfo, "model name").unwrap_or_else(|| "unknown".to_string()),
        runtime: xtask::lab::containerd_version(&xtask::lab::LabPaths::from_env()).map_or_else(
            || "containerd (version unknown: the lab is not unpacked yet)".to_string(),
            |(v, _)| format!("containerd {v}"),
        ),
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

impl Machine {
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("nproc", self.nproc.to_string()),
            ("memory", self.memory.clone()),
            ("kernel", self.kernel.clone()),
            ("CPU", self.cpu_model.clone()),
            ("runtime", self.runtime.clone()),
        ]
    }

    pub fn to_json(&self) -> Value {
        json!({
            "nproc": self.nproc,
            "memory": self.memory,
            "kernel": self.kernel,
            "cpu_model": self.cpu_model,
            "runtime": self.runtime,
            "unix_time": self.unix_time,
        })
    }
}
