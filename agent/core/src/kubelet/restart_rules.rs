//! Container restart rules (kubelet's ContainerRestartRules, on by default since 1.35): a
//! regular container may carry its own `restartPolicy`, overriding the pod's, and
//! `restartPolicyRules` that restart it on chosen exit codes. Pure.

use k8s_openapi::api::core::v1::{Container, ContainerRestartRule, Pod};

use super::pod_actions::restart_policy;

/// The first rule whose exit-code condition matches (kubelet's
/// FindMatchingContainerRestartRule).
fn matching_rule(c: &Container, exit_code: i32) -> Option<&ContainerRestartRule> {
    c.restart_policy_rules.iter().flatten().find(|rule| {
        rule.exit_codes.as_ref().is_some_and(|codes| {
            let listed = codes.values.iter().flatten().any(|v| *v == exit_code);
            match codes.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                _ => false,
            }
        })
    })
}

/// kubelet's ContainerShouldRestart: does an exited regular container with this exit code
/// run again?
pub fn container_should_restart(c: &Container, pod: &Pod, exit_code: i32) -> bool {
    let policy = match c.restart_policy.as_deref() {
        Some(own) => {
            if matching_rule(c, exit_code).is_some_and(|r| r.action == "Restart") {
                return true;
            }
            own
        }
        None => restart_policy(pod),
    };
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// Whether a container is restarted after it is killed while running (a probe failure):
/// its own policy when it has one (rules are not evaluated, there is no exit code yet),
/// else the pod's.
pub fn restart_on_failure(c: &Container, pod: &Pod) -> bool {
    c.restart_policy.as_deref().unwrap_or(restart_policy(pod)) != "Never"
}

/// A container that runs to success once and is then done (OnFailure, its own or the pod's).
pub fn runs_once(c: &Container, pod: &Pod) -> bool {
    c.restart_policy.as_deref().unwrap_or(restart_policy(pod)) == "OnFailure"
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerRestartRuleOnExitCodes, PodSpec};

    fn pod(policy: &str) -> Pod {
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_containers_own_policy_and_rules_override_the_pods() {
        let mut c = Container {
            name: "c".into(),
            restart_policy: Some("Never".into()),
            restart_policy_rules: Some(vec![ContainerRestartRule {
                action: "Restart".into(),
                exit_codes: Some(ContainerRestartRuleOnExitCodes {
                    operator: "In".into(),
                    values: Some(vec![42]),
                }),
            }]),
            ..Container::default()
        };
        let always = pod("Always");
        assert!(container_should_restart(&c, &always, 42), "rule matches");
        assert!(!container_should_restart(&c, &always, 1), "own Never");
        assert!(!restart_on_failure(&c, &always));
        c.restart_policy = None;
        c.restart_policy_rules = None;
        assert!(container_should_restart(&c, &always, 1));
        assert!(!container_should_restart(&c, &pod("OnFailure"), 0));
        assert!(runs_once(&c, &pod("OnFailure")));
    }
}
