//! The node's shape as its runtime runs it: the cgroup driver and the CNI directories.
//! kubelet takes the driver from CRI `RuntimeConfig` when the runtime answers it and from
//! `--cgroup-driver` otherwise; podlapse also reads the runtime's verbose status info,
//! where containerd 1.7 (which has no RuntimeConfig) shows its configuration, so the
//! node's real layout wins over a default.

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

use super::{CriClient, CriError, RuntimeService, api};
use crate::cm::CgroupDriver;

/// Where the cgroup driver was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverSource {
    /// CRI RuntimeConfig.
    RuntimeConfig,
    /// The runtime's status info: its runc runtime's `SystemdCgroup` option.
    StatusInfo,
    /// The runtime's status info names a runc runtime without the option: runc's own
    /// default, cgroupfs.
    StatusInfoDefault,
    /// `--cgroup-driver`.
    Flag,
}

impl fmt::Display for DriverSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DriverSource::RuntimeConfig => "CRI RuntimeConfig",
            DriverSource::StatusInfo => "runtime status info (SystemdCgroup)",
            DriverSource::StatusInfoDefault => "runtime status info (runc's default)",
            DriverSource::Flag => "--cgroup-driver",
        })
    }
}

/// Where the CNI directories were learnt: the CRI configuration in the runtime's verbose
/// status info, whose keys differ between containerd's major versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniSource {
    /// containerd 2.x: a list, `cni.binDirs`.
    BinDirs,
    /// containerd 1.x: one directory, `cni.binDir`.
    BinDir,
}

impl fmt::Display for CniSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CniSource::BinDirs => "runtime status info cni.binDirs",
            CniSource::BinDir => "runtime status info cni.binDir",
        })
    }
}

/// Where the CNI configuration directory was learnt.
pub const CNI_CONF_SOURCE: &str = "runtime status info cni.confDir";

/// What the runtime says about the node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeShape {
    pub cgroup_driver: Option<(CgroupDriver, DriverSource)>,
    /// Where the runtime runs CNI plugins from, in its order.
    pub cni_bin_dirs: Vec<String>,
    /// Which key said `cni_bin_dirs`; None when the runtime said nothing.
    pub cni_bin_source: Option<CniSource>,
    pub cni_conf_dir: Option<String>,
    /// The runtime applies `supplementalGroupsPolicy: Strict` (its Status features).
    pub supplemental_groups_policy: bool,
    /// The runtime handlers that run pods in user namespaces (Status runtime_handlers;
    /// `""` is the default handler).
    pub user_namespace_handlers: Vec<String>,
}

/// Why the node's shape could not be learnt.
#[derive(Debug, thiserror::Error)]
pub enum NodeShapeError {
    /// The runtime failed a call other than with Unimplemented.
    #[error("{0}")]
    Cri(#[from] CriError),

    /// The driver is needed, the runtime does not say and none was given.
    #[error(
        "cannot tell the cgroup driver: {runtime} answers RuntimeConfig with {runtime_config} and its status info {info}; pass --cgroup-driver systemd or cgroupfs"
    )]
    UnknownDriver {
        runtime: String,
        runtime_config: String,
        info: String,
    },
}

impl NodeShape {
    /// Asks the runtime; `flag` is kubelet's `--cgroup-driver`, used only when the runtime
    /// does not say. With `need_driver`, a driver nobody names is an error saying what the
    /// runtime answered.
    pub async fn detect(
        cri: &CriClient,
        flag: Option<CgroupDriver>,
        need_driver: bool,
    ) -> Result<NodeShape, NodeShapeError> {
        let status = cri.status(true).await?;
        let mut shape = NodeShape::from_status_info(&status.info);
        shape.supplemental_groups_policy = status
            .features
            .as_ref()
            .is_some_and(|f| f.supplemental_groups_policy);
        shape.user_namespace_handlers = status
            .runtime_handlers
            .iter()
            .filter(|h| h.features.as_ref().is_some_and(|f| f.user_namespaces))
            .map(|h| h.name.clone())
            .collect();
        let recognised = status
            .info
            .get("config")
            .and_then(|c| serde_json::from_str::<Value>(c).ok())
            .is_some_and(|c| c.get("containerd").is_some() || c.get("cni").is_some());
        let info = if !status.info.contains_key("config") {
            "has no configuration"
        } else if !recognised {
            "has a configuration podlapse does not recognise"
        } else if shape.cgroup_driver.is_none() {
            "names no runc runtime as the default"
        } else {
            "names the driver"
        };
        let runtime_config = match cri.runtime_config().await {
            Ok(resp) => match resp.linux.and_then(|l| driver_from_cri(l.cgroup_driver)) {
                Some(driver) => {
                    shape.cgroup_driver = Some((driver, DriverSource::RuntimeConfig));
                    "a driver".to_string()
                }
                None => "no Linux driver".to_string(),
            },
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => "Unimplemented".to_string(),
            Err(e) => return Err(e.into()),
        };
        if shape.cgroup_driver.is_none() {
            shape.cgroup_driver = flag.map(|d| (d, DriverSource::Flag));
        }
        if need_driver && shape.cgroup_driver.is_none() {
            let runtime = match cri.version().await {
                Ok(v) => format!("the runtime {} {}", v.runtime_name, v.runtime_version),
                Err(_) => "the runtime".to_string(),
            };
            return Err(NodeShapeError::UnknownDriver {
                runtime,
                runtime_config,
                info: info.to_string(),
            });
        }
        Ok(shape)
    }

    /// What containerd's verbose status info (`info["config"]`, its CRI configuration as
    /// JSON) says: the default runtime's `SystemdCgroup` and the CNI directories.
    pub fn from_status_info(info: &HashMap<String, String>) -> NodeShape {
        let mut shape = NodeShape::default();
        let Some(config) = info
            .get("config")
            .and_then(|c| serde_json::from_str::<Value>(c).ok())
        else {
            return shape;
        };
        let containerd = &config["containerd"];
        let default = containerd["defaultRuntimeName"].as_str().unwrap_or("runc");
        let runtime = &containerd["runtimes"][default];
        if runtime.is_object() {
            let runc = runtime["runtimeType"]
                .as_str()
                .is_none_or(|t| t.starts_with("io.containerd.runc."));
            shape.cgroup_driver = match runtime["options"]["SystemdCgroup"].as_bool() {
                Some(true) => Some((CgroupDriver::Systemd, DriverSource::StatusInfo)),
                Some(false) => Some((CgroupDriver::Cgroupfs, DriverSource::StatusInfo)),
                None if runc => Some((CgroupDriver::Cgroupfs, DriverSource::StatusInfoDefault)),
                None => None,
            };
        }
        let cni = &config["cni"];
        // containerd 1.7 has one `binDir`; 2.x a list `binDirs`.
        // 2.x still carries the deprecated `binDir`, empty unless set: the list wins.
        let dirs: Vec<String> = cni["binDirs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d.as_str().filter(|d| !d.is_empty()).map(str::to_string))
            .collect();
        if !dirs.is_empty() {
            shape.cni_bin_dirs = dirs;
            shape.cni_bin_source = Some(CniSource::BinDirs);
        } else if let Some(dir) = cni["binDir"].as_str().filter(|d| !d.is_empty()) {
            shape.cni_bin_dirs = vec![dir.to_string()];
            shape.cni_bin_source = Some(CniSource::BinDir);
        }
        shape.cni_conf_dir = cni["confDir"].as_str().map(str::to_string);
        shape
    }
}

fn driver_from_cri(value: i32) -> Option<CgroupDriver> {
    match api::CgroupDriver::try_from(value).ok()? {
        api::CgroupDriver::Systemd => Some(CgroupDriver::Systemd),
        api::CgroupDriver::Cgroupfs => Some(CgroupDriver::Cgroupfs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(config: Value) -> HashMap<String, String> {
        HashMap::from([("config".to_string(), config.to_string())])
    }

    #[test]
    fn containerd_17_with_systemd_cgroups_and_opt_cni() {
        let shape = NodeShape::from_status_info(&info(serde_json::json!({
            "containerd": {
                "defaultRuntimeName": "runc",
                "runtimes": {"runc": {
                    "runtimeType": "io.containerd.runc.v2",
                    "options": {"SystemdCgroup": true, "BinaryName": ""},
                }},
            },
            "cni": {"binDir": "/opt/cni/bin", "confDir": "/etc/cni/net.d"},
        })));
        assert_eq!(
            shape,
            NodeShape {
                cgroup_driver: Some((CgroupDriver::Systemd, DriverSource::StatusInfo)),
                cni_bin_dirs: vec!["/opt/cni/bin".into()],
                cni_bin_source: Some(CniSource::BinDir),
                cni_conf_dir: Some("/etc/cni/net.d".into()),
                ..NodeShape::default()
            }
        );
    }

    #[test]
    fn a_runc_runtime_without_the_option_is_runcs_default() {
        let shape = NodeShape::from_status_info(&info(serde_json::json!({
            "containerd": {"defaultRuntimeName": "runc", "runtimes": {"runc": {
                "runtimeType": "io.containerd.runc.v2", "options": null,
            }}},
            "cni": {"binDirs": ["/usr/lib/cni", "/opt/cni/bin"]},
        })));
        assert_eq!(
            shape.cgroup_driver,
            Some((CgroupDriver::Cgroupfs, DriverSource::StatusInfoDefault))
        );
        assert_eq!(shape.cni_bin_dirs, ["/usr/lib/cni", "/opt/cni/bin"]);
        assert_eq!(shape.cni_bin_source, Some(CniSource::BinDirs));
        assert_eq!(shape.cni_conf_dir, None);
    }

    #[test]
    fn containerd_2_says_its_cni_dirs_as_a_list_beside_an_empty_bin_dir() {
        // As containerd 2.1.9 reports a version-3 config with `cni.bin_dirs` set.
        let shape = NodeShape::from_status_info(&info(serde_json::json!({
            "containerd": {"defaultRuntimeName": "runc", "runtimes": {"runc": {
                "runtimeType": "io.containerd.runc.v2",
                "options": {"SystemdCgroup": true},
                "sandboxer": "podsandbox",
            }}},
            "cni": {"binDir": "", "binDirs": ["/opt/cni/bin"], "confDir": "/etc/cni/net.d"},
        })));
        assert_eq!(shape.cni_bin_dirs, ["/opt/cni/bin"]);
        assert_eq!(shape.cni_bin_source, Some(CniSource::BinDirs));
        // Only 1.x's key, or 2.x's list left empty with the deprecated key set.
        let old = NodeShape::from_status_info(&info(serde_json::json!({
            "cni": {"binDir": "/usr/lib/cni", "binDirs": []},
        })));
        assert_eq!(old.cni_bin_dirs, ["/usr/lib/cni"]);
        assert_eq!(old.cni_bin_source, Some(CniSource::BinDir));
    }

    #[test]
    fn another_runtime_or_no_info_says_nothing() {
        let other = NodeShape::from_status_info(&info(serde_json::json!({
            "containerd": {"defaultRuntimeName": "kata", "runtimes": {"kata": {
                "runtimeType": "io.containerd.kata.v2",
            }}},
        })));
        assert_eq!(other.cgroup_driver, None);
        assert_eq!(
            NodeShape::from_status_info(&HashMap::new()),
            NodeShape::default()
        );
    }
}
