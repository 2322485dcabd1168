//! kubelet's security contexts for CRI: the pod's and the container's settings merged
//! (`DetermineEffectiveSecurityContext`), converted to the container's
//! `LinuxContainerSecurityContext` (`determineEffectiveSecurityContext`) and the sandbox's
//! `LinuxSandboxSecurityContext`, the namespaces a pod's containers get
//! (`NamespacesForPod`), seccomp and AppArmor profiles, and the runAsNonRoot check made
//! against the image's user before a container is created. Pure: reads the pod, the
//! container, the image's user and the root directory.

use std::path::Path;

use k8s_openapi::api::core::v1::{
    Container, Pod, PodSecurityContext, SELinuxOptions, SeccompProfile, SecurityContext,
};

use super::labels;
use crate::cri::api;
pub use crate::kubelet::apparmor::container_apparmor;

/// kubelet's default masked paths (`securitycontext.defaultMaskedPaths`): what a
/// container's `/proc` and `/sys` hide unless its `procMount` is `Unmasked`.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// kubelet's default read-only paths (`securitycontext.defaultReadonlyPaths`).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The user an image runs as, from the runtime's ImageStatus: a numeric uid, or a name
/// the runtime resolves. Neither means root (kubelet's getImageUser).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: Option<i64>,
    pub username: String,
}

impl ImageUser {
    /// An image that names no user: it runs as root.
    pub fn root() -> ImageUser {
        ImageUser {
            uid: Some(0),
            username: String::new(),
        }
    }

    pub fn of(image: &api::Image) -> ImageUser {
        match (&image.uid, image.username.as_str()) {
            (Some(uid), _) => ImageUser {
                uid: Some(uid.value),
                username: String::new(),
            },
            (None, name) if !name.is_empty() => ImageUser {
                uid: None,
                username: name.to_string(),
            },
            _ => ImageUser::root(),
        }
    }
}

/// A security context kubelet cannot turn into CRI, in kubelet's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SecurityContextError(pub String);

/// kubelet's `DetermineEffectiveSecurityContext`: the container's fields over the pod's.
/// The pod contributes SELinux options, runAsUser, runAsGroup and runAsNonRoot; seccomp
/// and AppArmor are resolved on their own ([`seccomp_profile`], [`apparmor_profile`]).
pub fn effective(pod: &Pod, c: &Container) -> SecurityContext {
    let mut sc = pod_security_context(pod)
        .map(|p| SecurityContext {
            se_linux_options: p.se_linux_options.clone(),
            windows_options: p.windows_options.clone(),
            run_as_user: p.run_as_user,
            run_as_group: p.run_as_group,
            run_as_non_root: p.run_as_non_root,
            ..SecurityContext::default()
        })
        .unwrap_or_default();
    let Some(own) = &c.security_context else {
        return sc;
    };
    macro_rules! over {
        ($($field:ident),*) => {
            $(if own.$field.is_some() {
                sc.$field = own.$field.clone();
            })*
        };
    }
    over!(
        se_linux_options,
        windows_options,
        capabilities,
        privileged,
        run_as_user,
        run_as_group,
        run_as_non_root,
        read_only_root_filesystem,
        allow_privilege_escalation,
        proc_mount,
        seccomp_profile,
        app_armor_profile
    );
    sc
}

fn pod_security_context(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref()?.security_context.as_ref()
}

/// kubelet's `format.Pod`: `name_namespace(uid)`.
fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        labels::pod_name(pod),
        labels::pod_namespace(pod),
        labels::pod_uid(pod)
    )
}

/// kubelet's `verifyRunAsNonRoot`: a container that must not run as root is refused
/// before it is created when its own uid, or the image's, is 0, or when the image names
/// a user that cannot be checked.
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    user: &ImageUser,
) -> Result<(), SecurityContextError> {
    let sc = effective(pod, c);
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    let who = format!("(pod: {:?}, container: {})", format_pod(pod), c.name);
    if let Some(uid) = sc.run_as_user {
        return if uid == 0 {
            Err(SecurityContextError(format!(
                "container's runAsUser breaks non-root policy {who}"
            )))
        } else {
            Ok(())
        };
    }
    match (user.uid, user.username.as_str()) {
        (Some(0), _) => Err(SecurityContextError(format!(
            "container has runAsNonRoot and image will run as root {who}"
        ))),
        (None, name) if !name.is_empty() => Err(SecurityContextError(format!(
            "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root {who}"
        ))),
        _ => Ok(()),
    }
}

/// kubelet's `NamespacesForPod`: the node's namespaces where the pod asks for them; one
/// PID namespace per container unless the pod shares its process namespace.
pub fn namespaces_for_pod(pod: &Pod) -> api::NamespaceOption {
    let spec = pod.spec.as_ref();
    let flag = |f: fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>| {
        spec.and_then(f).unwrap_or(false)
    };
    let node = api::NamespaceMode::Node as i32;
    api::NamespaceOption {
        network: if flag(|s| s.host_network) {
            node
        } else {
            api::NamespaceMode::Pod as i32
        },
        pid: if flag(|s| s.host_pid) {
            node
        } else if flag(|s| s.share_process_namespace) {
            api::NamespaceMode::Pod as i32
        } else {
            api::NamespaceMode::Container as i32
        },
        ipc: if flag(|s| s.host_ipc) {
            node
        } else {
            api::NamespaceMode::Pod as i32
        },
        ..Default::default()
    }
}

/// kubelet's seccomp profile for a container (`""` for the sandbox): the container's
/// field, else the pod's, else Unconfined (kubelet's `--seccomp-default` is off by
/// default). A Localhost profile is a file under `<root-dir>/seccomp`.
pub fn seccomp_profile(
    pod: &Pod,
    c: Option<&Container>,
    root_dir: &Path,
) -> Result<api::SecurityProfile, SecurityContextError> {
    let chosen = c
        .and_then(|c| c.security_context.as_ref())
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| pod_security_context(pod).and_then(|p| p.seccomp_profile.as_ref()));
    let Some(SeccompProfile {
        type_,
        localhost_profile,
    }) = chosen
    else {
        return Ok(profile(api::security_profile::ProfileType::Unconfined, ""));
    };
    Ok(match type_.as_str() {
        "RuntimeDefault" => profile(api::security_profile::ProfileType::RuntimeDefault, ""),
        "Localhost" => match localhost_profile.as_deref() {
            Some(name) if !name.is_empty() => profile(
                api::security_profile::ProfileType::Localhost,
                &root_dir.join("seccomp").join(name).display().to_string(),
            ),
            _ => {
                return Err(SecurityContextError(
                    "localhostProfile must be set if seccompProfile type is Localhost.".into(),
                ));
            }
        },
        _ => profile(api::security_profile::ProfileType::Unconfined, ""),
    })
}

fn profile(kind: api::security_profile::ProfileType, localhost_ref: &str) -> api::SecurityProfile {
    api::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: localhost_ref.to_string(),
    }
}

/// kubelet's AppArmor profile for a container: its `appArmorProfile`, else the deprecated
/// per-container annotation, else the pod's `appArmorProfile`. Returns the profile and the
/// deprecated string form runtimes still read; `None` leaves it to the runtime.
pub fn apparmor_profile(
    pod: &Pod,
    c: &Container,
) -> Result<Option<(api::SecurityProfile, String)>, SecurityContextError> {
    let Some(chosen) = container_apparmor(pod, c) else {
        return Ok(None);
    };
    use api::security_profile::ProfileType;
    Ok(Some(match chosen.type_.as_str() {
        "RuntimeDefault" => (
            profile(ProfileType::RuntimeDefault, ""),
            "runtime/default".into(),
        ),
        "Unconfined" => (profile(ProfileType::Unconfined, ""), "unconfined".into()),
        "Localhost" => {
            let Some(name) = chosen.localhost_profile.as_deref() else {
                return Err(SecurityContextError(
                    "missing localhost apparmor profile name".into(),
                ));
            };
            (
                profile(ProfileType::Localhost, name),
                format!("localhost/{name}"),
            )
        }
        other => {
            return Err(SecurityContextError(format!(
                "unknown apparmor profile type: {other:?}"
            )));
        }
    }))
}

/// The pod's supplemental groups as kubelet passes them: fsGroup first, then
/// supplementalGroups in order.
fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let Some(sc) = pod_security_context(pod) else {
        return Vec::new();
    };
    sc.fs_group
        .into_iter()
        .chain(sc.supplemental_groups.iter().flatten().copied())
        .collect()
}

/// The CRI value of the pod's `supplementalGroupsPolicy` (Merge when unset).
fn supplemental_groups_policy(pod: &Pod) -> i32 {
    match pod_security_context(pod).and_then(|s| s.supplemental_groups_policy.as_deref()) {
        Some("Strict") => api::SupplementalGroupsPolicy::Strict as i32,
        _ => api::SupplementalGroupsPolicy::Merge as i32,
    }
}

fn selinux(o: &SELinuxOptions) -> api::SeLinuxOption {
    api::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}

/// kubelet's `determineEffectiveSecurityContext`: what the runtime applies to the
/// container's process: user and groups, capabilities, privilege, no_new_privs, a
/// read-only root, seccomp, AppArmor, SELinux, masked and read-only paths, namespaces.
pub fn container_security_context(
    pod: &Pod,
    c: &Container,
    user: &ImageUser,
    root_dir: &Path,
) -> Result<api::LinuxContainerSecurityContext, SecurityContextError> {
    let sc = effective(pod, c);
    let (apparmor, apparmor_profile) = match apparmor_profile(pod, c)? {
        Some((p, s)) => (Some(p), s),
        None => (None, String::new()),
    };
    let (run_as_user, run_as_username) = match sc.run_as_user {
        Some(uid) => (Some(api::Int64Value { value: uid }), String::new()),
        None => (
            user.uid.map(|value| api::Int64Value { value }),
            user.username.clone(),
        ),
    };
    let unmasked = sc.proc_mount.as_deref() == Some("Unmasked");
    let owned = |paths: &[&str]| paths.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let mut out = api::LinuxContainerSecurityContext {
        capabilities: sc.capabilities.as_ref().map(|caps| api::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            ..Default::default()
        }),
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: Some(namespaces_for_pod(pod)),
        selinux_options: sc.se_linux_options.as_ref().map(selinux),
        run_as_user,
        run_as_group: sc.run_as_group.map(|value| api::Int64Value { value }),
        run_as_username,
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: supplemental_groups(pod),
        supplemental_groups_policy: supplemental_groups_policy(pod),
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: if unmasked {
            Vec::new()
        } else {
            owned(DEFAULT_MASKED_PATHS)
        },
        readonly_paths: if unmasked {
            Vec::new()
        } else {
            owned(DEFAULT_READONLY_PATHS)
        },
        seccomp: Some(seccomp_profile(pod, Some(c), root_dir)?),
        apparmor,
        ..Default::default()
    };
    set_deprecated_apparmor_profile(&mut out, apparmor_profile);
    Ok(out)
}

/// kubelet still fills the deprecated string form of the AppArmor profile beside the
/// typed one: runtimes before the typed field (containerd 1.6) read only the string.
#[expect(
    deprecated,
    reason = "containerd 1.6 reads only the deprecated field, and kubelet still sets it"
)]
fn set_deprecated_apparmor_profile(sc: &mut api::LinuxContainerSecurityContext, profile: String) {
    sc.apparmor_profile = profile;
}

/// True when any container of the pod (init and ephemeral ones included) is privileged.
pub fn has_privileged_container(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let privileged = |sc: Option<&SecurityContext>| sc.and_then(|s| s.privileged) == Some(true);
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| privileged(c.security_context.as_ref()))
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| privileged(c.security_context.as_ref()))
}

/// The sandbox's security context as kubelet's `generatePodSandboxLinuxConfig` sets it:
/// privileged when a container is, the RuntimeDefault seccomp profile always (so pods can
/// use least-privileged profiles), the pod's user, groups, SELinux options and namespaces.
pub fn sandbox_security_context(pod: &Pod) -> api::LinuxSandboxSecurityContext {
    let sc = pod_security_context(pod);
    api::LinuxSandboxSecurityContext {
        namespace_options: Some(namespaces_for_pod(pod)),
        selinux_options: sc.and_then(|s| s.se_linux_options.as_ref()).map(selinux),
        run_as_user: sc
            .and_then(|s| s.run_as_user)
            .map(|value| api::Int64Value { value }),
        run_as_group: sc
            .and_then(|s| s.run_as_group)
            .map(|value| api::Int64Value { value }),
        readonly_rootfs: false,
        supplemental_groups: supplemental_groups(pod),
        supplemental_groups_policy: supplemental_groups_policy(pod),
        privileged: has_privileged_container(pod),
        seccomp: Some(profile(
            api::security_profile::ProfileType::RuntimeDefault,
            "",
        )),
        apparmor: None,
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "security_context_tests.rs"]
mod tests;
