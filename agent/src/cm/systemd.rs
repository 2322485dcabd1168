//! kubelet's systemd cgroup manager, the D-Bus side: pod and QoS cgroups are transient
//! slice units that systemd creates, sizes and stops, as runc's libcontainer does for
//! kubelet (StartTransientUnit with DefaultDependencies=no, Wants= its parent slice,
//! accounting on and the limits as unit properties; StopUnit to remove).
//!
//! Calls block the calling thread until systemd's job for the unit finishes (its
//! JobRemoved signal), bounded by [`JOB_TIMEOUT`] as in runc.

use std::time::Duration;

use futures_lite::StreamExt;
use zbus::zvariant::{OwnedObjectPath, Value};

use super::CmError;
use crate::kubelet::qos::PodResourceConfig;

/// How long systemd gets to finish one unit job (runc waits 30 s as well).
pub const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// systemd's default CFS period, which it uses when a unit sets no period.
const DEFAULT_CFS_PERIOD_US: u64 = 100_000;

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Manager {
    fn subscribe(&self) -> zbus::Result<()>;

    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Value<'_>)],
    ) -> zbus::Result<()>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
}

/// A connection to the system's systemd over the system bus.
#[derive(Debug, Clone)]
pub struct Systemd {
    manager: ManagerProxy<'static>,
}

/// One unit property: its name and value.
pub type Property = (&'static str, Value<'static>);

impl Systemd {
    /// Connects to systemd on the system bus; an error says the systemd driver cannot
    /// work on this node.
    pub fn connect() -> Result<Systemd, CmError> {
        let failed = |e: zbus::Error| CmError::Systemd {
            unit: "the system bus".into(),
            action: "connecting to systemd on",
            message: e.to_string(),
        };
        zbus::block_on(async {
            let conn = zbus::Connection::system().await.map_err(failed)?;
            let manager = ManagerProxy::new(&conn).await.map_err(failed)?;
            manager.subscribe().await.map_err(failed)?;
            Ok(Systemd { manager })
        })
    }

    /// Starts slice `unit` below `parent` (a slice unit, `-.slice` for the root) with
    /// `properties`; a slice that exists already gets the properties set instead.
    pub fn start_slice(
        &self,
        unit: &str,
        parent: &str,
        properties: &[Property],
    ) -> Result<(), CmError> {
        let mut all: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(format!("podlapse {unit}"))),
            ("Wants", Value::from(vec![parent.to_string()])),
            ("DefaultDependencies", Value::from(false)),
            ("MemoryAccounting", Value::from(true)),
            ("CPUAccounting", Value::from(true)),
            ("IOAccounting", Value::from(true)),
            ("TasksAccounting", Value::from(true)),
        ];
        all.extend(properties.iter().map(|(k, v)| (*k, v.clone())));
        let started = zbus::block_on(self.run_job(unit, "starting", async {
            self.manager
                .start_transient_unit(unit, "replace", &all, &[])
                .await
        }));
        match started {
            Err(CmError::Systemd { message, .. })
                if message.contains("org.freedesktop.systemd1.UnitExists") =>
            {
                self.set_properties(unit, properties)
            }
            other => other,
        }
    }

    /// Sets runtime properties (limits) of an existing unit.
    pub fn set_properties(&self, unit: &str, properties: &[Property]) -> Result<(), CmError> {
        if properties.is_empty() {
            return Ok(());
        }
        let props: Vec<(&str, Value<'_>)> =
            properties.iter().map(|(k, v)| (*k, v.clone())).collect();
        zbus::block_on(self.manager.set_unit_properties(unit, true, &props)).map_err(|e| {
            CmError::Systemd {
                unit: unit.to_string(),
                action: "setting properties of",
                message: e.to_string(),
            }
        })
    }

    /// Stops `unit`; one that does not exist is already stopped.
    pub fn stop_unit(&self, unit: &str) -> Result<(), CmError> {
        let stopped = zbus::block_on(self.run_job(unit, "stopping", async {
            self.manager.stop_unit(unit, "replace").await
        }));
        let result = match stopped {
            Err(CmError::Systemd { message, .. })
                if message.contains("org.freedesktop.systemd1.NoSuchUnit") =>
            {
                Ok(())
            }
            other => other,
        };
        // A unit that failed stays listed as failed until reset; like runc, clear it.
        let _ = zbus::block_on(self.manager.reset_failed_unit(unit));
        result
    }

    /// Queues a job with `call` and waits for its JobRemoved signal. The signal stream
    /// is opened before the call so the job cannot finish unseen.
    async fn run_job(
        &self,
        unit: &str,
        action: &'static str,
        call: impl Future<Output = zbus::Result<OwnedObjectPath>>,
    ) -> Result<(), CmError> {
        let failed = |message: String| CmError::Systemd {
            unit: unit.to_string(),
            action,
            message,
        };
        let mut removed = self
            .manager
            .receive_job_removed()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let job = call.await.map_err(|e| failed(e.to_string()))?;
        let wait = async {
            while let Some(signal) = removed.next().await {
                let Ok(args) = signal.args() else { continue };
                if args.job == job {
                    return match args.result.as_str() {
                        "done" => Ok(()),
                        other => Err(failed(format!("the job ended {other:?}"))),
                    };
                }
            }
            Err(failed("the bus closed before the job ended".into()))
        };
        let timeout = async {
            async_io::Timer::after(JOB_TIMEOUT).await;
            Err(failed(format!(
                "the job did not end within {} s",
                JOB_TIMEOUT.as_secs()
            )))
        };
        futures_lite::future::or(wait, timeout).await
    }
}

/// A pod's limits as systemd unit properties, as runc's systemd v2 manager sets them
/// (CPUWeight, CPUQuotaPerSecUSec with its period, MemoryMax). Zero or absent values
/// leave the property unset.
pub fn resource_properties(config: &PodResourceConfig) -> Vec<Property> {
    let mut out: Vec<Property> = Vec::new();
    if let Some(shares) = config.cpu_shares.filter(|s| *s != 0) {
        out.push((
            "CPUWeight",
            Value::from(super::cpu_shares_to_weight(shares)),
        ));
    }
    let period = config.cpu_period.filter(|p| *p != 0);
    if let Some(p) = period {
        out.push(("CPUQuotaPeriodUSec", Value::from(p)));
    }
    if let Some(quota) = config.cpu_quota.filter(|q| *q > 0) {
        out.push((
            "CPUQuotaPerSecUSec",
            Value::from(quota_per_sec(
                quota as u64,
                period.unwrap_or(DEFAULT_CFS_PERIOD_US),
            )),
        ));
    }
    if let Some(memory) = config.memory_limit.filter(|m| *m != 0) {
        let max = if memory < 0 { u64::MAX } else { memory as u64 };
        out.push(("MemoryMax", Value::from(max)));
    }
    out
}

/// CPU time per second of wall time for a CFS quota and period. systemd keeps this as a
/// whole percentage of a CPU, so like runc round up to the next 10 ms, or the child
/// cgroups runc makes could not get the quota they ask for.
fn quota_per_sec(quota_us: u64, period_us: u64) -> u64 {
    let per_sec = quota_us.saturating_mul(1_000_000) / period_us.max(1);
    per_sec.div_ceil(10_000) * 10_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(c: PodResourceConfig) -> Vec<(&'static str, String)> {
        resource_properties(&c)
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect()
    }

    #[test]
    fn limits_become_runcs_unit_properties() {
        let got = props(PodResourceConfig {
            cpu_shares: Some(256),
            cpu_quota: Some(25_000),
            cpu_period: Some(100_000),
            memory_limit: Some(128 << 20),
        });
        assert_eq!(
            got,
            [
                ("CPUWeight", "uint64 35".to_string()), // 256 shares on the weight curve
                ("CPUQuotaPeriodUSec", "uint64 100000".into()),
                ("CPUQuotaPerSecUSec", "uint64 250000".into()),
                ("MemoryMax", "uint64 134217728".into()),
            ]
        );
    }

    #[test]
    fn a_fractional_percent_of_cpu_rounds_up_to_ten_ms() {
        // 1 millicore: 100 us per 100 ms is 1 ms per second, kept as 10 ms.
        assert_eq!(quota_per_sec(100, 100_000), 10_000);
        assert_eq!(quota_per_sec(150_000, 100_000), 1_500_000);
        assert_eq!(quota_per_sec(33_333, 100_000), 340_000);
    }

    #[test]
    fn nothing_set_is_no_property() {
        assert!(props(PodResourceConfig::default()).is_empty());
    }
}
