//! Cases after kubelet's security_context_test.go and kuberuntime's seccomp and
//! namespace tables.

use std::path::Path;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, Pod, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::kubelet::apparmor::{APPARMOR_ANNOTATION_PREFIX, apparmor};

fn pod(sc: Option<PodSecurityContext>, containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("u1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            security_context: sc,
            containers,
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn container(sc: Option<SecurityContext>) -> Container {
    Container {
        name: "app".into(),
        security_context: sc,
        ..Container::default()
    }
}

fn uid(u: i64) -> ImageUser {
    ImageUser {
        uid: Some(u),
        username: String::new(),
    }
}

#[test]
fn run_as_non_root_is_checked_as_kubelet_checks_it() {
    let non_root = |user: Option<i64>| SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: user,
        ..SecurityContext::default()
    };
    let named = ImageUser {
        uid: None,
        username: "nobody".into(),
    };
    let cases: Vec<(&str, Option<SecurityContext>, ImageUser, Option<&str>)> = vec![
        ("no security context", None, uid(0), None),
        (
            "runAsNonRoot unset",
            Some(SecurityContext::default()),
            uid(0),
            None,
        ),
        (
            "runAsNonRoot false, image root",
            Some(SecurityContext {
                run_as_non_root: Some(false),
                ..SecurityContext::default()
            }),
            uid(0),
            None,
        ),
        (
            "runAsNonRoot, runAsUser non-root",
            Some(non_root(Some(1000))),
            uid(0),
            None,
        ),
        (
            "runAsNonRoot, runAsUser root",
            Some(non_root(Some(0))),
            uid(1000),
            Some(
                "container's runAsUser breaks non-root policy (pod: \"web_default(u1)\", container: app)",
            ),
        ),
        (
            "runAsNonRoot, image root",
            Some(non_root(None)),
            uid(0),
            Some(
                "container has runAsNonRoot and image will run as root (pod: \"web_default(u1)\", container: app)",
            ),
        ),
        (
            "runAsNonRoot, image names a user",
            Some(non_root(None)),
            named,
            Some(
                "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: \"web_default(u1)\", container: app)",
            ),
        ),
        (
            "runAsNonRoot, image non-root",
            Some(non_root(None)),
            uid(1234),
            None,
        ),
        (
            "runAsNonRoot, no user anywhere",
            Some(non_root(None)),
            ImageUser::default(),
            None,
        ),
    ];
    for (name, sc, user, want) in cases {
        let c = container(sc);
        let p = pod(None, vec![c.clone()]);
        let got = verify_run_as_non_root(&p, &c, &user).err().map(|e| e.0);
        assert_eq!(got.as_deref(), want, "{name}");
    }
}

#[test]
fn the_pods_run_as_non_root_and_user_apply_unless_the_container_overrides_them() {
    let p = pod(
        Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(0),
            run_as_group: Some(3000),
            ..PodSecurityContext::default()
        }),
        vec![],
    );
    let plain = container(None);
    assert!(verify_run_as_non_root(&p, &plain, &uid(1000)).is_err());
    let own = container(Some(SecurityContext {
        run_as_user: Some(1000),
        ..SecurityContext::default()
    }));
    assert!(verify_run_as_non_root(&p, &own, &uid(0)).is_ok());
    let sc = effective(&p, &own);
    assert_eq!(
        (sc.run_as_user, sc.run_as_group, sc.run_as_non_root),
        (Some(1000), Some(3000), Some(true))
    );
}

#[test]
fn each_container_gets_its_own_pid_namespace_unless_the_pod_shares_it() {
    let ns = |f: fn(&mut PodSpec)| {
        let mut p = pod(None, vec![]);
        f(p.spec.as_mut().unwrap());
        let o = namespaces_for_pod(&p);
        (o.network, o.pid, o.ipc)
    };
    use api::NamespaceMode::{Container as C, Node as N, Pod as P};
    let (c, n, p) = (C as i32, N as i32, P as i32);
    assert_eq!(ns(|_| {}), (p, c, p));
    assert_eq!(ns(|s| s.share_process_namespace = Some(true)), (p, p, p));
    assert_eq!(
        ns(|s| {
            s.host_pid = Some(true);
            s.share_process_namespace = Some(true);
        }),
        (p, n, p)
    );
    assert_eq!(
        ns(|s| {
            s.host_network = Some(true);
            s.host_ipc = Some(true);
        }),
        (n, c, n)
    );
}

#[test]
fn the_container_security_context_reaches_cri() {
    let c = container(Some(SecurityContext {
        run_as_user: Some(1000),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            add: Some(vec!["NET_ADMIN".into()]),
            drop: Some(vec!["ALL".into()]),
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }));
    let p = pod(
        Some(PodSecurityContext {
            run_as_group: Some(3000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![4000, 5000]),
            supplemental_groups_policy: Some("Strict".into()),
            ..PodSecurityContext::default()
        }),
        vec![c.clone()],
    );
    let sc = container_security_context(&p, &c, &uid(0), Path::new("/var/lib/kubelet")).unwrap();
    assert_eq!(sc.run_as_user, Some(api::Int64Value { value: 1000 }));
    assert_eq!(sc.run_as_group, Some(api::Int64Value { value: 3000 }));
    assert_eq!(sc.supplemental_groups, [2000, 4000, 5000]);
    assert_eq!(
        sc.supplemental_groups_policy,
        api::SupplementalGroupsPolicy::Strict as i32
    );
    assert!(sc.no_new_privs && sc.readonly_rootfs && !sc.privileged);
    let caps = sc.capabilities.unwrap();
    assert_eq!(
        (caps.add_capabilities, caps.drop_capabilities),
        (vec!["NET_ADMIN".to_string()], vec!["ALL".to_string()])
    );
    assert_eq!(
        sc.seccomp.unwrap().profile_type,
        api::security_profile::ProfileType::RuntimeDefault as i32
    );
    assert_eq!(sc.masked_paths.len(), DEFAULT_MASKED_PATHS.len());
    assert_eq!(sc.readonly_paths.len(), DEFAULT_READONLY_PATHS.len());
    assert_eq!(
        sc.namespace_options.unwrap().pid,
        api::NamespaceMode::Container as i32
    );
}

#[test]
fn without_a_run_as_user_the_images_user_is_passed_on() {
    let c = container(None);
    let p = pod(None, vec![c.clone()]);
    let root = Path::new("/r");
    let sc = container_security_context(&p, &c, &uid(65534), root).unwrap();
    assert_eq!(sc.run_as_user, Some(api::Int64Value { value: 65534 }));
    let named = ImageUser {
        uid: None,
        username: "nginx".into(),
    };
    let sc = container_security_context(&p, &c, &named, root).unwrap();
    assert_eq!(
        (sc.run_as_user, sc.run_as_username.as_str()),
        (None, "nginx")
    );
    // No allowPrivilegeEscalation: no_new_privs stays off, as kubelet leaves it.
    assert!(!sc.no_new_privs);
    // No profile anywhere: Unconfined (kubelet's --seccomp-default is off).
    assert_eq!(
        sc.seccomp.unwrap().profile_type,
        api::security_profile::ProfileType::Unconfined as i32
    );
}

#[test]
fn seccomp_takes_the_containers_profile_then_the_pods() {
    let root = Path::new("/var/lib/kubelet");
    let local = |name: Option<&str>| SeccompProfile {
        type_: "Localhost".into(),
        localhost_profile: name.map(str::to_string),
    };
    let p = pod(
        Some(PodSecurityContext {
            seccomp_profile: Some(local(Some("profiles/audit.json"))),
            ..PodSecurityContext::default()
        }),
        vec![],
    );
    let got = seccomp_profile(&p, Some(&container(None)), root).unwrap();
    assert_eq!(
        (got.profile_type, got.localhost_ref.as_str()),
        (
            api::security_profile::ProfileType::Localhost as i32,
            "/var/lib/kubelet/seccomp/profiles/audit.json"
        )
    );
    let unconfined = container(Some(SecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "Unconfined".into(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }));
    assert_eq!(
        seccomp_profile(&p, Some(&unconfined), root)
            .unwrap()
            .profile_type,
        api::security_profile::ProfileType::Unconfined as i32
    );
    let missing = container(Some(SecurityContext {
        seccomp_profile: Some(local(None)),
        ..SecurityContext::default()
    }));
    assert_eq!(
        seccomp_profile(&p, Some(&missing), root).unwrap_err().0,
        "localhostProfile must be set if seccompProfile type is Localhost."
    );
}

#[test]
fn apparmor_takes_the_field_then_the_annotation_then_the_pod() {
    let mut p = pod(
        Some(PodSecurityContext {
            app_armor_profile: Some(apparmor("RuntimeDefault", None)),
            ..PodSecurityContext::default()
        }),
        vec![],
    );
    let c = container(None);
    let (prof, old) = apparmor_profile(&p, &c).unwrap().unwrap();
    assert_eq!(
        (prof.profile_type, old.as_str()),
        (
            api::security_profile::ProfileType::RuntimeDefault as i32,
            "runtime/default"
        )
    );
    p.metadata.annotations = Some(
        [(
            format!("{APPARMOR_ANNOTATION_PREFIX}app"),
            "localhost/k8s-deny-write".to_string(),
        )]
        .into(),
    );
    let (prof, old) = apparmor_profile(&p, &c).unwrap().unwrap();
    assert_eq!(
        (prof.localhost_ref.as_str(), old.as_str()),
        ("k8s-deny-write", "localhost/k8s-deny-write")
    );
    let own = container(Some(SecurityContext {
        app_armor_profile: Some(apparmor("Unconfined", None)),
        ..SecurityContext::default()
    }));
    assert_eq!(apparmor_profile(&p, &own).unwrap().unwrap().1, "unconfined");
    assert_eq!(apparmor_profile(&pod(None, vec![]), &c).unwrap(), None);
}

#[test]
fn the_sandbox_is_privileged_when_a_container_is_and_always_runtime_default() {
    let privileged = container(Some(SecurityContext {
        privileged: Some(true),
        ..SecurityContext::default()
    }));
    let p = pod(
        Some(PodSecurityContext {
            run_as_user: Some(1000),
            fs_group: Some(2000),
            ..PodSecurityContext::default()
        }),
        vec![container(None), privileged],
    );
    let sc = sandbox_security_context(&p);
    assert!(sc.privileged);
    assert_eq!(sc.run_as_user, Some(api::Int64Value { value: 1000 }));
    assert_eq!(sc.supplemental_groups, [2000]);
    assert_eq!(
        sc.seccomp.unwrap().profile_type,
        api::security_profile::ProfileType::RuntimeDefault as i32
    );
    assert!(!sandbox_security_context(&pod(None, vec![container(None)])).privileged);
}

#[test]
fn an_unmasked_proc_mount_masks_nothing() {
    let c = container(Some(SecurityContext {
        proc_mount: Some("Unmasked".into()),
        ..SecurityContext::default()
    }));
    let p = pod(None, vec![c.clone()]);
    let sc = container_security_context(&p, &c, &uid(0), Path::new("/r")).unwrap();
    assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
}
