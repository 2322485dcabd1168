//! kubelet's user namespace manager: a pod with `hostUsers: false` runs in a user
//! namespace of its own, 65536 IDs mapped from a range no other pod on the node holds,
//! kept in the pod's directory so the same pod gets the same range after a restart.
//! A runtime handler that does not support user namespaces refuses the pod at sandbox
//! creation with kubelet's message; every other pod gets the node's user namespace.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use super::config::RuntimeConfig;
use super::{SyncError, SyncReason};
use crate::cri::api;

/// IDs per pod, kubelet's default (`userNamespaces.idsPerPod`).
pub const IDS_PER_POD: u32 = 65536;
/// Ranges start here: the first 65536 IDs are the node's own. kubelet takes its range
/// from the `kubelet` user's subordinate IDs when it has some, else from here up.
const FIRST_HOST_ID: u32 = IDS_PER_POD;
/// How many pod ranges fit below 2^32.
const SLOTS: u32 = u32::MAX / IDS_PER_POD - 1;
/// The file in the pod's directory that keeps its range (kubelet's name).
const MAPPINGS_FILE: &str = "userns";

/// What the pod's directory keeps: kubelet's `userNamespace` file, its host ID ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Mappings {
    #[serde(rename = "hostId")]
    host_id: u32,
    length: u32,
}

/// The user namespace the pod's sandbox and containers run in: the node's unless the pod
/// sets `hostUsers: false`; then a range of its own, if the runtime handler can.
pub fn user_namespace(
    pod: &Pod,
    cfg: &RuntimeConfig,
    handler: &str,
) -> Result<api::UserNamespace, SyncError> {
    let host_users = pod.spec.as_ref().and_then(|s| s.host_users);
    if host_users != Some(false) {
        return Ok(api::UserNamespace {
            mode: api::NamespaceMode::Node as i32,
            ..Default::default()
        });
    }
    if let Some(able) = &cfg.user_namespace_handlers
        && !able.iter().any(|h| h == handler)
    {
        return Err(SyncError::new(
            SyncReason::CreatePodSandboxError,
            format!("RuntimeClass handler {handler:?} does not support user namespaces"),
        ));
    }
    let uid = super::labels::pod_uid(pod);
    let m = if cfg.touch_host {
        mappings_on_disk(&cfg.root_dir, &cfg.pod_dir(uid))?
    } else {
        // A replay touches no file: every pod gets the first range.
        Mappings {
            host_id: FIRST_HOST_ID,
            length: IDS_PER_POD,
        }
    };
    let mapping = api::IdMapping {
        host_id: m.host_id,
        container_id: 0,
        length: m.length,
    };
    Ok(api::UserNamespace {
        mode: api::NamespaceMode::Pod as i32,
        uids: vec![mapping],
        gids: vec![mapping],
    })
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> SyncError {
    SyncError::new(
        SyncReason::CreatePodSandboxError,
        format!("{what} {}: {e}", path.display()),
    )
}

/// The pod's range: the one its directory keeps, else the lowest range no pod directory
/// under `root` keeps, written to the pod's directory before it is used.
fn mappings_on_disk(root: &Path, pod_dir: &Path) -> Result<Mappings, SyncError> {
    let own = pod_dir.join(MAPPINGS_FILE);
    if let Ok(text) = std::fs::read_to_string(&own) {
        return serde_json::from_str(&text).map_err(|e| io_error("reading", &own, e));
    }
    let mut taken = std::collections::BTreeSet::new();
    if let Ok(pods) = std::fs::read_dir(root.join("pods")) {
        for entry in pods.flatten() {
            let file = entry.path().join(MAPPINGS_FILE);
            if let Ok(m) = std::fs::read_to_string(&file)
                .map_err(|_| ())
                .and_then(|t| serde_json::from_str::<Mappings>(&t).map_err(|_| ()))
            {
                taken.insert(m.host_id);
            }
        }
    }
    let host_id = (0..SLOTS)
        .map(|i| FIRST_HOST_ID + i * IDS_PER_POD)
        .find(|id| !taken.contains(id))
        .ok_or_else(|| {
            SyncError::new(
                SyncReason::CreatePodSandboxError,
                "no user namespace range left on the node",
            )
        })?;
    let m = Mappings {
        host_id,
        length: IDS_PER_POD,
    };
    std::fs::create_dir_all(pod_dir).map_err(|e| io_error("creating", pod_dir, e))?;
    let text = serde_json::to_string(&m).expect("mappings serialize");
    std::fs::write(&own, text).map_err(|e| io_error("writing", &own, e))?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;

    fn cfg(root: &Path, able: Option<Vec<String>>) -> RuntimeConfig {
        RuntimeConfig {
            node_name: "n".into(),
            node_ip: String::new(),
            root_dir: root.to_path_buf(),
            pod_logs_dir: PathBuf::from("/nonexistent"),
            host_dns: Default::default(),
            runtime_handlers: BTreeMap::new(),
            touch_host: true,
            user_namespace_handlers: able,
            allocatable: None,
        }
    }

    fn pod(uid: &str, host_users: Option<bool>) -> Pod {
        let mut p: Pod = serde_yaml::from_str(&format!(
            "metadata: {{name: p, uid: {uid}}}\nspec: {{containers: [{{name: a, image: i}}]}}"
        ))
        .unwrap();
        p.spec.as_mut().unwrap().host_users = host_users;
        p
    }

    #[test]
    fn only_host_users_false_gets_a_namespace_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), Some(vec![String::new()]));
        for host_users in [None, Some(true)] {
            let u = user_namespace(&pod("a", host_users), &c, "").unwrap();
            assert_eq!(u.mode, api::NamespaceMode::Node as i32);
            assert!(u.uids.is_empty());
        }
        let u = user_namespace(&pod("a", Some(false)), &c, "").unwrap();
        assert_eq!(u.mode, api::NamespaceMode::Pod as i32);
        assert_eq!(
            (u.uids[0].container_id, u.uids[0].host_id, u.uids[0].length),
            (0, 65536, 65536)
        );
        assert_eq!(u.uids, u.gids);
    }

    #[test]
    fn each_pod_keeps_its_own_range() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), Some(vec![String::new()]));
        let first =
            |uid: &str| user_namespace(&pod(uid, Some(false)), &c, "").unwrap().uids[0].host_id;
        let a = first("a");
        let b = first("b");
        assert_ne!(a, b);
        assert_eq!(first("a"), a, "the same pod, the same range");
        std::fs::remove_dir_all(dir.path().join("pods/a")).unwrap();
        assert_eq!(first("c"), a, "a freed range is reused");
    }

    #[test]
    fn a_handler_without_user_namespaces_refuses_with_kubelets_message() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), Some(vec!["kata".into()]));
        let e = user_namespace(&pod("a", Some(false)), &c, "").unwrap_err();
        assert_eq!(e.reason, SyncReason::CreatePodSandboxError);
        assert_eq!(
            e.message,
            "RuntimeClass handler \"\" does not support user namespaces"
        );
        assert!(!dir.path().join("pods/a").exists(), "nothing was made");
    }
}
