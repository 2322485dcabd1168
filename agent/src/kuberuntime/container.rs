//! startContainer: image, container config, CreateContainer, StartContainer.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use super::config::RuntimeConfig;
use super::event::PodEvent;
use super::image::{EnsuredImage, ImagePullContext, ensure_image_exists};
use super::labels;
use super::security_context::{
    ImageUser, SecurityContextError, container_security_context, verify_run_as_non_root,
};
use super::sync_pod::SyncContext;
use super::{SyncError, SyncReason};
use crate::cri::{ImageService, RuntimeService, api};
use crate::kubelet::container_hash::container_hash;
use crate::kubelet::downward_api;
use crate::kubelet::expansion::expand_env_refs;
use crate::lifecycle::run_handler;

/// How long a postStart hook may run.
const POST_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the pod knows at container start that the spec does not: its IPs.
#[derive(Debug, Clone, Default)]
pub struct PodRuntimeFacts {
    pub pod_ip: String,
    pub pod_ips: Vec<String>,
}

/// kubelet's generateContainerConfig. Pure: reads the pod, the config, the image's user
/// and `facts`. A container that would run as root against its runAsNonRoot, or whose
/// security context cannot be expressed, is refused before anything is created.
pub fn generate_container_config(
    pod: &Pod,
    c: &Container,
    image_ref: &str,
    image_user: &ImageUser,
    restart_count: u32,
    facts: &PodRuntimeFacts,
    cfg: &RuntimeConfig,
) -> Result<api::ContainerConfig, SyncError> {
    let config_error = |e: SecurityContextError| {
        SyncError::new(SyncReason::CreateContainerConfigError, e.0).for_container(&c.name)
    };
    verify_run_as_non_root(pod, c, image_user).map_err(config_error)?;
    let security_context =
        container_security_context(pod, c, image_user, &cfg.root_dir).map_err(config_error)?;
    let envs = container_envs(pod, c, facts, cfg)?;
    let mounts = container_mounts(pod, c, cfg)?;
    let expand = |s: &String| expand_env_refs(s, &envs);
    Ok(api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: c.name.clone(),
            attempt: restart_count,
        }),
        image: Some(api::ImageSpec {
            image: image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: c.command.iter().flatten().map(expand).collect(),
        args: c.args.iter().flatten().map(expand).collect(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: envs
            .iter()
            .map(|(key, value)| api::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts,
        log_path: format!("{}/{}.log", c.name, restart_count),
        labels: labels::container_labels(pod, c),
        annotations: labels::container_annotations(pod, c, &container_hash(c), restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(super::resources::linux_container_resources(c)),
            security_context: Some(security_context),
        }),
        ..Default::default()
    })
}

/// Environment in spec order. `valueFrom.fieldRef` resolves the fields kubelet resolves
/// locally; references to ConfigMaps or Secrets need an API server podlapse does not have.
fn container_envs(
    pod: &Pod,
    c: &Container,
    facts: &PodRuntimeFacts,
    cfg: &RuntimeConfig,
) -> Result<Vec<(String, String)>, SyncError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for EnvVar {
        name,
        value,
        value_from,
    } in c.env.iter().flatten()
    {
        let v = match (value, value_from) {
            (Some(v), _) => expand_env_refs(v, &out),
            (None, None) => String::new(),
            (None, Some(from)) if from.resource_field_ref.is_some() => {
                let sel = from.resource_field_ref.as_ref().expect("checked");
                resource_env(pod, c, sel, cfg).map_err(|e| {
                    SyncError::new(
                        SyncReason::CreateContainerConfigError,
                        format!("env {name}: {e}"),
                    )
                    .for_container(&c.name)
                })?
            }
            (None, Some(from)) => {
                let Some(field) = from.field_ref.as_ref() else {
                    return Err(SyncError::new(
                        SyncReason::CreateContainerConfigError,
                        format!(
                            "env {name}: only valueFrom.fieldRef and resourceFieldRef are supported"
                        ),
                    )
                    .for_container(&c.name));
                };
                field_value(pod, &field.field_path, facts, cfg).ok_or_else(|| {
                    SyncError::new(
                        SyncReason::CreateContainerConfigError,
                        format!("env {name}: unsupported fieldRef {:?}", field.field_path),
                    )
                    .for_container(&c.name)
                })?
            }
        };
        out.retain(|(k, _)| k != name);
        out.push((name.clone(), v));
    }
    Ok(out)
}

/// `resourceFieldRef` in env: the named container's resource (this one when it names
/// none), as the downward API reads it.
fn resource_env(
    pod: &Pod,
    c: &Container,
    sel: &k8s_openapi::api::core::v1::ResourceFieldSelector,
    cfg: &RuntimeConfig,
) -> Result<String, String> {
    let node = cfg
        .allocatable
        .as_ref()
        .ok_or("the node's allocatable is not known")?;
    let target = match sel.container_name.as_deref() {
        None | Some("") => c,
        Some(name) => pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .find(|x| x.name == name)
            .ok_or_else(|| format!("container {name:?} not found in the pod"))?,
    };
    downward_api::resource_value(target, sel, node)
}

fn field_value(
    pod: &Pod,
    path: &str,
    facts: &PodRuntimeFacts,
    cfg: &RuntimeConfig,
) -> Option<String> {
    Some(match path {
        "metadata.name" => labels::pod_name(pod).to_string(),
        "metadata.namespace" => labels::pod_namespace(pod).to_string(),
        "metadata.uid" => labels::pod_uid(pod).to_string(),
        "spec.nodeName" => cfg.node_name.clone(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => facts.pod_ip.clone(),
        "status.podIPs" => facts.pod_ips.join(","),
        "status.hostIP" | "status.hostIPs" => cfg.node_ip.clone(),
        other => return downward_api::metadata_field(pod, other),
    })
}

fn container_mounts(
    pod: &Pod,
    c: &Container,
    cfg: &RuntimeConfig,
) -> Result<Vec<api::Mount>, SyncError> {
    let volumes: BTreeMap<&str, _> = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let uid = labels::pod_uid(pod);
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(v) = volumes.get(m.name.as_str()) else {
            return Err(SyncError::new(
                SyncReason::CreateContainerConfigError,
                format!("volume mount {:?} names no volume", m.name),
            )
            .for_container(&c.name));
        };
        let host_path = if v.empty_dir.is_some() {
            cfg.empty_dir_path(uid, &v.name)
        } else if v.downward_api.is_some() {
            cfg.downward_api_path(uid, &v.name)
        } else if let Some(hp) = &v.host_path {
            hp.path.clone().into()
        } else {
            return Err(SyncError::new(
                SyncReason::CreateContainerConfigError,
                format!("volume {:?} has no supported source", v.name),
            )
            .for_container(&c.name));
        };
        let host_path = match &m.sub_path {
            Some(sub) if !sub.is_empty() => host_path.join(sub),
            _ => host_path,
        };
        mounts.push(api::Mount {
            container_path: m.mount_path.clone(),
            host_path: host_path.display().to_string(),
            readonly: m.read_only.unwrap_or(false),
            ..Default::default()
        });
    }
    Ok(mounts)
}

/// kubelet's getImageUser after a pull: the runtime's ImageStatus of the container's
/// image says which user it runs as.
async fn image_user<I: ImageService>(images: &I, c: &Container) -> Result<ImageUser, SyncError> {
    let spec = api::ImageSpec {
        image: c.image.clone().unwrap_or_default(),
        ..Default::default()
    };
    match images.image_status(spec).await {
        Ok(Some(image)) => Ok(ImageUser::of(&image)),
        Ok(None) => Err(SyncError::new(
            SyncReason::CreateContainerConfigError,
            format!(
                "image {:?} not found after its pull",
                c.image.as_deref().unwrap_or_default()
            ),
        )
        .for_container(&c.name)),
        Err(e) => Err(SyncError::cri(SyncReason::ImageInspectError, e).for_container(&c.name)),
    }
}

/// What one startContainer did.
#[derive(Debug, Clone)]
pub struct StartedContainer {
    pub name: String,
    pub container_id: String,
    pub image_ref: String,
}

/// kubelet's startContainer: ensure the image, create, start.
#[expect(
    clippy::too_many_arguments,
    reason = "mirrors kubelet's startContainer inputs"
)]
pub async fn start_container<R: RuntimeService + ImageService>(
    cri: &R,
    ctx: &SyncContext<'_>,
    pod: &Pod,
    c: &Container,
    sandbox_id: &str,
    sandbox_config: &api::PodSandboxConfig,
    restart_count: u32,
    facts: &PodRuntimeFacts,
) -> Result<StartedContainer, SyncError> {
    let image = c.image.clone().unwrap_or_default();
    let pull = ImagePullContext {
        pod_uid: labels::pod_uid(pod),
        sandbox: sandbox_config,
        auth: (ctx.auth)(&image),
        backoff: ctx.backoff,
        limiter: ctx.limiter,
        now: ctx.now,
        events: ctx.events,
    };
    let EnsuredImage { image_ref, user } = ensure_image_exists(cri, c, &pull).await?;
    let user = match user {
        Some(user) => user,
        None => image_user(cri, c).await?,
    };
    let mut config =
        generate_container_config(pod, c, &image_ref, &user, restart_count, facts, ctx.cfg)?;
    // The pod's user namespace, as the sandbox was given it.
    let userns = sandbox_config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|n| n.userns_options.clone());
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.userns_options = userns;
    }
    // Like the sandbox's log directory: only an agent that runs pods on this host makes it;
    // a replay touches no file.
    if ctx.cfg.touch_host {
        let log_dir = std::path::Path::new(&sandbox_config.log_directory).join(&c.name);
        std::fs::create_dir_all(&log_dir).map_err(|e| {
            SyncError::new(
                SyncReason::CreateContainerConfigError,
                format!(
                    "creating container log directory {}: {e}",
                    log_dir.display()
                ),
            )
            .for_container(&c.name)
        })?;
    }
    let req = api::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.to_string(),
        config: Some(config),
        sandbox_config: Some(sandbox_config.clone()),
    };
    // Boxed: the request (container and sandbox config, about 15 KB inline) lives only
    // while the call does, not in every pod's sync future (see `sync_pod`).
    let container_id = Box::pin(cri.create_container(req))
        .await
        .map_err(|e| SyncError::cri(SyncReason::CreateContainerError, e).for_container(&c.name))?;
    ctx.events.record(PodEvent::normal(
        "Created",
        format!("Created container {}", c.name),
        Some(c.name.clone()),
    ));
    cri.start_container(&container_id)
        .await
        .map_err(|e| SyncError::cri(SyncReason::RunContainerError, e).for_container(&c.name))?;
    ctx.events.record(PodEvent::normal(
        "Started",
        format!("Started container {}", c.name),
        Some(c.name.clone()),
    ));
    if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
        let ran = run_handler(
            cri,
            pod,
            c,
            &container_id,
            &facts.pod_ip,
            hook,
            POST_START_TIMEOUT,
        )
        .await;
        if let Err(e) = ran {
            // kubelet kills a container whose postStart hook failed; its restart policy
            // and back-off decide what happens next.
            let message = e.to_string();
            ctx.events.record(PodEvent::warning(
                "FailedPostStartHook",
                message.clone(),
                Some(c.name.clone()),
            ));
            ctx.events.record(PodEvent::normal(
                "Killing",
                format!("FailedPostStartHook: stopping container {}", c.name),
                Some(c.name.clone()),
            ));
            let grace = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30);
            let _ = cri.stop_container(&container_id, grace).await;
            return Err(
                SyncError::new(SyncReason::PostStartHookError, message).for_container(&c.name)
            );
        }
    }
    Ok(StartedContainer {
        name: c.name.clone(),
        container_id,
        image_ref,
    })
}
