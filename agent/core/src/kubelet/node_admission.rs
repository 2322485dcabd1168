//! The admission checks kubelet makes against the node itself rather than its room: the
//! pod's OS, required node affinity and `nodeSelector` against the node's labels (the
//! predicate admit handler's NodeAffinity), `supplementalGroupsPolicy: Strict` on a
//! runtime that cannot do it, and AppArmor profiles on a host without AppArmor. Each
//! rejection carries kubelet's reason and message; `admission::can_admit_pod` runs them
//! in kubelet's order.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};
use serde::{Deserialize, Serialize};

use super::admission::Rejection;
use super::apparmor::container_apparmor;

/// What kubelet knows of its node when it admits a pod: its labels, and what the host
/// and the runtime can enforce.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    /// The node's name, matched by `matchFields` on `metadata.name`.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The host's kernel enforces AppArmor.
    #[serde(default)]
    pub apparmor: bool,
    /// The runtime applies `supplementalGroupsPolicy: Strict` (CRI RuntimeStatus features).
    #[serde(default)]
    pub supplemental_groups_policy: bool,
}

impl NodeFacts {
    /// kubelet's own labels for a Linux node (`kubernetes.io/hostname`, `/os`, `/arch` and
    /// their beta forms), then `extra` (kubelet's `--node-labels`), which may override.
    pub fn new(name: &str, arch: &str, extra: &BTreeMap<String, String>) -> NodeFacts {
        let arch = match arch {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let mut labels: BTreeMap<String, String> = [
            ("kubernetes.io/hostname", name.to_lowercase()),
            ("kubernetes.io/os", "linux".into()),
            ("kubernetes.io/arch", arch.into()),
            ("beta.kubernetes.io/os", "linux".into()),
            ("beta.kubernetes.io/arch", arch.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        labels.extend(extra.clone());
        NodeFacts {
            name: name.to_string(),
            labels,
            apparmor: false,
            supplemental_groups_policy: false,
        }
    }
}

/// The node's operating system, as kubelet's `runtime.GOOS`.
const NODE_OS: &str = "linux";

/// The predicate handler's first checks: a `kubernetes.io/os` pod label other than the
/// node's OS, then a `spec.os.name` other than it.
pub fn os_matches(pod: &Pod) -> Result<(), Rejection> {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/os"));
    if label.is_some_and(|os| os != NODE_OS) {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".into(),
            message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                .into(),
        });
    }
    let os = pod.spec.as_ref().and_then(|s| s.os.as_ref());
    if os.is_some_and(|os| os.name != NODE_OS) {
        return Err(Rejection {
            reason: "PodOSNotSupported".into(),
            message: "Failed to admit pod as the OS field doesn't match node OS".into(),
        });
    }
    Ok(())
}

/// `supplementalGroupsPolicy: Strict` on a node whose runtime cannot apply it.
pub fn supplemental_groups_policy(pod: &Pod, node: &NodeFacts) -> Result<(), Rejection> {
    let strict = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.supplemental_groups_policy.as_deref())
        == Some("Strict");
    if strict && !node.supplemental_groups_policy {
        return Err(Rejection {
            reason: "SupplementalGroupsPolicyNotSupported".into(),
            message: "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        });
    }
    Ok(())
}

/// Required node affinity and `nodeSelector` against the node's labels.
pub fn node_affinity(pod: &Pod, node: &NodeFacts) -> Result<(), Rejection> {
    if !required_node_affinity_matches(pod, node) {
        return Err(Rejection {
            reason: "NodeAffinity".into(),
            message:
                "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
                    .into(),
        });
    }
    Ok(())
}

/// An AppArmor profile other than Unconfined on a host that does not enforce AppArmor.
pub fn apparmor(pod: &Pod, node: &NodeFacts) -> Result<(), Rejection> {
    if apparmor_required(pod) && !node.apparmor {
        return Err(Rejection {
            reason: "AppArmor".into(),
            message: "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
        });
    }
    Ok(())
}

/// True when any container asks for an AppArmor profile other than Unconfined.
fn apparmor_required(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .filter_map(|c| container_apparmor(pod, c))
        .any(|p| p.type_ != "Unconfined")
}

/// kubelet's `GetRequiredNodeAffinity(pod).Match(node)`: every `nodeSelector` label
/// equal, and, when the pod has required node affinity, one of its terms matching.
pub fn required_node_affinity_matches(pod: &Pod, node: &NodeFacts) -> bool {
    let Some(spec) = &pod.spec else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    if !selector_ok {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(selector) => selector
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node)),
    }
}

/// A term matches when it has at least one requirement and all of them hold.
fn term_matches(term: &NodeSelectorTerm, node: &NodeFacts) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node.name.as_str())))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), [want]) = (value.and_then(number), values) else {
                return false;
            };
            let Some(want) = number(want) else {
                return false;
            };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: p}}\nspec:\n  containers:\n  - {{name: a, image: i}}\n{spec}"
        ))
        .unwrap()
    }

    fn node() -> NodeFacts {
        NodeFacts::new(
            "Lab-Node",
            "x86_64",
            &[
                ("disktype".to_string(), "ssd".to_string()),
                ("cores".to_string(), "8".to_string()),
            ]
            .into(),
        )
    }

    fn affinity(terms: &str) -> String {
        format!(
            "  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n{terms}"
        )
    }

    #[test]
    fn kubelets_own_labels_and_the_users() {
        let n = node();
        assert_eq!(n.labels["kubernetes.io/hostname"], "lab-node");
        assert_eq!(n.labels["kubernetes.io/arch"], "amd64");
        assert_eq!(n.labels["kubernetes.io/os"], "linux");
        assert_eq!(n.labels["disktype"], "ssd");
    }

    #[test]
    fn node_selector_and_required_affinity_match_as_the_scheduler_would() {
        let cases = [
            ("", true),
            ("  nodeSelector: {disktype: ssd}\n", true),
            ("  nodeSelector: {disktype: hdd}\n", false),
            (
                "  nodeSelector: {kubernetes.io/os: linux, gpu: 'true'}\n",
                false,
            ),
            (
                "        - matchExpressions: [{key: disktype, operator: In, values: [ssd, nvme]}]\n",
                true,
            ),
            (
                "        - matchExpressions: [{key: disktype, operator: NotIn, values: [ssd]}]\n        - matchExpressions: [{key: zone, operator: DoesNotExist}]\n",
                true,
            ),
            (
                "        - matchExpressions: [{key: cores, operator: Gt, values: ['4']}, {key: gpu, operator: Exists}]\n",
                false,
            ),
            (
                "        - matchExpressions: [{key: cores, operator: Lt, values: ['16']}]\n",
                true,
            ),
            (
                "        - matchFields: [{key: metadata.name, operator: In, values: [Lab-Node]}]\n",
                true,
            ),
            ("        - {}\n", false),
        ];
        for (spec, want) in cases {
            let spec = if spec.starts_with("        -") {
                affinity(spec)
            } else {
                spec.to_string()
            };
            assert_eq!(
                required_node_affinity_matches(&pod(&spec), &node()),
                want,
                "{spec}"
            );
        }
    }

    #[test]
    fn each_refusal_has_kubelets_reason_and_message() {
        let n = node();
        let r = node_affinity(&pod("  nodeSelector: {disktype: hdd}\n"), &n).unwrap_err();
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "NodeAffinity",
                "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
            )
        );
        let strict = pod("  securityContext: {supplementalGroupsPolicy: Strict}\n");
        let r = supplemental_groups_policy(&strict, &n).unwrap_err();
        assert_eq!(r.reason, "SupplementalGroupsPolicyNotSupported");
        assert_eq!(
            r.message,
            "SupplementalGroupsPolicy=Strict is not supported in this node"
        );
        let confined = pod("  securityContext: {appArmorProfile: {type: RuntimeDefault}}\n");
        let r = apparmor(&confined, &n).unwrap_err();
        assert_eq!(r.reason, "AppArmor");
        assert_eq!(
            r.message,
            "Cannot enforce AppArmor: AppArmor is not enabled on the host"
        );
        // Unconfined asks nothing of the host; Merge nothing of the runtime.
        let lax = pod(
            "  securityContext: {appArmorProfile: {type: Unconfined}, supplementalGroupsPolicy: Merge}\n",
        );
        assert!(apparmor(&lax, &n).is_ok() && supplemental_groups_policy(&lax, &n).is_ok());
        let able = NodeFacts {
            apparmor: true,
            supplemental_groups_policy: true,
            ..node()
        };
        assert!(apparmor(&confined, &able).is_ok());
        assert!(supplemental_groups_policy(&strict, &able).is_ok());
    }

    #[test]
    fn a_pod_for_another_os_is_refused_by_label_then_by_field() {
        let labelled: Pod = serde_yaml::from_str(
            "metadata: {name: p, labels: {kubernetes.io/os: windows}}\nspec: {os: {name: windows}, containers: [{name: a, image: i}]}",
        )
        .unwrap();
        let r = os_matches(&labelled).unwrap_err();
        assert_eq!(r.reason, "PodOSSelectorNodeLabelDoesNotMatch");
        assert_eq!(
            r.message,
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
        );
        let r = os_matches(&pod("  os: {name: windows}\n")).unwrap_err();
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "PodOSNotSupported",
                "Failed to admit pod as the OS field doesn't match node OS"
            )
        );
        assert!(os_matches(&pod("  os: {name: linux}\n")).is_ok());
        let linux: Pod = serde_yaml::from_str(
            "metadata: {name: p, labels: {kubernetes.io/os: linux}}\nspec: {containers: [{name: a, image: i}]}",
        )
        .unwrap();
        assert!(os_matches(&linux).is_ok());
    }
}
