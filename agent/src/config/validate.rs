//! Checks a decoded Pod before podlapse accepts it. Errors are `(field path, problem)`.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

type Invalid = (String, String);

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Invalid {
    (field.into(), problem.into())
}

pub fn validate(pod: &Pod) -> Result<(), Invalid> {
    let name = pod
        .metadata
        .name
        .as_deref()
        .ok_or_else(|| invalid("metadata.name", "required"))?;
    dns1123_subdomain(name).map_err(|p| invalid("metadata.name", p))?;
    if let Some(ns) = pod.metadata.namespace.as_deref() {
        dns1123_label(ns).map_err(|p| invalid("metadata.namespace", p))?;
    }
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| invalid("spec", "required"))?;
    if spec.containers.is_empty() {
        return Err(invalid(
            "spec.containers",
            "at least one container is required",
        ));
    }
    if let Some(policy) = spec.restart_policy.as_deref() {
        one_of(policy, &["Always", "OnFailure", "Never"])
            .map_err(|p| invalid("spec.restartPolicy", p))?;
    }
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let mut volume_names = BTreeSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}]");
        dns1123_label(&v.name).map_err(|p| invalid(format!("{field}.name"), p))?;
        if !volume_names.insert(v.name.as_str()) {
            return Err(invalid(
                format!("{field}.name"),
                format!("duplicate volume {:?}", v.name),
            ));
        }
        if volume_source_name(v).is_none() {
            return Err(invalid(field, "must specify a volume type"));
        }
    }
    let mut container_names = BTreeSet::new();
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let groups = [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
    ];
    for (group, containers) in groups {
        for (i, c) in containers.iter().enumerate() {
            let field = format!("{group}[{i}]");
            container(c, &field, &volume_names)?;
            if !container_names.insert(c.name.as_str()) {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("duplicate container name {:?}", c.name),
                ));
            }
        }
    }
    Ok(())
}

fn container(c: &Container, field: &str, volumes: &BTreeSet<&str>) -> Result<(), Invalid> {
    dns1123_label(&c.name).map_err(|p| invalid(format!("{field}.name"), p))?;
    match c.image.as_deref() {
        None | Some("") => return Err(invalid(format!("{field}.image"), "required")),
        Some(_) => {}
    }
    if let Some(policy) = c.image_pull_policy.as_deref() {
        one_of(policy, &["Always", "IfNotPresent", "Never"])
            .map_err(|p| invalid(format!("{field}.imagePullPolicy"), p))?;
    }
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        if !volumes.contains(m.name.as_str()) {
            return Err(invalid(
                format!("{field}.volumeMounts[{i}].name"),
                format!("no volume named {:?} in spec.volumes", m.name),
            ));
        }
        if !m.mount_path.starts_with('/') {
            return Err(invalid(
                format!("{field}.volumeMounts[{i}].mountPath"),
                "must be an absolute path",
            ));
        }
    }
    for (i, p) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&p.container_port) {
            return Err(invalid(
                format!("{field}.ports[{i}].containerPort"),
                format!("{} is not a port number (1-65535)", p.container_port),
            ));
        }
    }
    Ok(())
}

/// The source a volume names (`emptyDir`, `configMap`, ...), as the manifest spells it.
fn volume_source_name(v: &Volume) -> Option<String> {
    let json = serde_json::to_value(v).unwrap_or_default();
    json.as_object()
        .and_then(|o| o.keys().find(|k| k.as_str() != "name").cloned())
}

/// What podlapse can run, checked after kubelet's own validation and API-reference ban
/// have passed, so a manifest kubelet refuses gets kubelet's reason: podlapse mounts
/// `emptyDir`, `hostPath` and `downwardAPI` volumes, and resolves env from the pod's
/// fields and the containers' resources.
pub fn supported(pod: &Pod) -> Result<(), Invalid> {
    let Some(spec) = &pod.spec else {
        return Ok(());
    };
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if v.empty_dir.is_some() || v.host_path.is_some() || v.downward_api.is_some() {
            continue;
        }
        let other = volume_source_name(v).unwrap_or_else(|| "no source".into());
        return Err(invalid(
            format!("spec.volumes[{i}]"),
            format!(
                "volume source {other:?} is not supported (podlapse supports emptyDir, hostPath and downwardAPI)"
            ),
        ));
    }
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (group, containers) in [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in containers.iter().enumerate() {
            for (j, e) in c.env.iter().flatten().enumerate() {
                if e.value_from
                    .as_ref()
                    .is_some_and(|f| f.field_ref.is_none() && f.resource_field_ref.is_none())
                {
                    return Err(invalid(
                        format!("{group}[{i}].env[{j}].valueFrom"),
                        "only fieldRef and resourceFieldRef are supported",
                    ));
                }
            }
        }
    }
    Ok(())
}

fn one_of(value: &str, allowed: &[&str]) -> Result<(), String> {
    if allowed.contains(&value) {
        Ok(())
    } else {
        Err(format!("{value:?} is not one of {allowed:?}"))
    }
}

fn dns1123_label(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63)"
        ))
    }
}

/// The API's IsDNS1123Subdomain: at most 253 characters, dot-separated parts of lower-case
/// alphanumerics and dashes, each starting and ending alphanumeric. Unlike a label, a part
/// has no length limit of its own (a static pod's `<name>-<node>` often passes 63).
fn dns1123_subdomain(s: &str) -> Result<(), String> {
    let part_ok = |p: &str| {
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        p.starts_with(alnum) && p.ends_with(alnum) && p.chars().all(|c| alnum(c) || c == '-')
    };
    let ok = !s.is_empty() && s.len() <= 253 && s.split('.').all(part_ok);
    if ok {
        Ok(())
    } else {
        Err(format!("{s:?} is not a DNS-1123 subdomain"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn names_the_bad_field() {
        let cases = [
            (
                "metadata: {}\nspec: {containers: [{name: a, image: i}]}",
                "metadata.name",
            ),
            (
                "metadata: {name: Web}\nspec: {containers: [{name: a, image: i}]}",
                "metadata.name",
            ),
            (
                "metadata: {name: w}\nspec: {containers: [{name: a}]}",
                "spec.containers[0].image",
            ),
            (
                "metadata: {name: w}\nspec: {containers: [{name: a, image: i}, {name: a, image: i}]}",
                "spec.containers[1].name",
            ),
            (
                "metadata: {name: w}\nspec: {restartPolicy: Sometimes, containers: [{name: a, image: i}]}",
                "spec.restartPolicy",
            ),
            (
                "metadata: {name: w}\nspec: {volumes: [{name: v}], containers: [{name: a, image: i}]}",
                "spec.volumes[0]",
            ),
            (
                "metadata: {name: w}\nspec: {containers: [{name: a, image: i, volumeMounts: [{name: nope, mountPath: /x}]}]}",
                "spec.containers[0].volumeMounts[0].name",
            ),
        ];
        for (yaml, field) in cases {
            let (got, problem) = validate(&pod(yaml)).unwrap_err();
            assert_eq!(got, field, "{yaml}: {problem}");
        }
    }

    #[test]
    fn unsupported_volume_is_named() {
        let p = pod(
            "metadata: {name: w}\nspec: {volumes: [{name: v, nfs: {server: s, path: /x}}], containers: [{name: a, image: i}]}",
        );
        assert!(validate(&p).is_ok(), "kubelet accepts it");
        let (field, problem) = supported(&p).unwrap_err();
        assert_eq!(field, "spec.volumes[0]");
        assert!(problem.contains("nfs"), "{problem}");
    }
}
