//! kubelet's ban on static pods that reference API objects (PreventStaticPodAPIReferences,
//! on by default since 1.34): a static pod has no API server behind it, so a secret, a
//! config map, a service account, a claim or a CSI driver it names could never be
//! resolved. kubelet refuses such a manifest when it decodes it, after validation, with
//! `static pods may not reference <resource>`; the resource is found in the order of
//! kubelet's `HasAPIObjectReference`. Here each refusal also names the field.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Volume};

/// The first API object reference in `pod`, as kubelet looks for one: `(field, resource)`,
/// where the resource is what kubelet's message names. An unknown volume source is an
/// error, as it is in kubelet.
pub fn api_object_reference(pod: &Pod) -> Result<Option<(String, String)>, (String, String)> {
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    let found = |field: String, resource: &str| Ok(Some((field, resource.to_string())));
    // The deprecated `serviceAccount` is an alias that conversion copies into the name.
    for (field, value) in [
        ("spec.serviceAccountName", &spec.service_account_name),
        ("spec.serviceAccount", &spec.service_account),
    ] {
        if value.as_deref().is_some_and(|v| !v.is_empty()) {
            return found(field.into(), "serviceaccounts");
        }
    }
    if let Some(field) = first_secret(spec) {
        return found(field, "secrets");
    }
    if let Some(field) = first_config_map(spec) {
        return found(field, "configmaps");
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return found("spec.resourceClaims".into(), "resourceclaims");
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}]");
        if let Some(reference) = volume_reference(v, &field)? {
            return Ok(Some(reference));
        }
    }
    Ok(None)
}

/// Every container of the pod with the field path of its list: init, regular, ephemeral
/// (kubelet's AllContainers order).
fn containers(spec: &PodSpec) -> Vec<(String, &Container)> {
    let init = spec.init_containers.iter().flatten().enumerate();
    let regular = spec.containers.iter().enumerate();
    init.map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(regular.map(|(i, c)| (format!("spec.containers[{i}]"), c)))
        .collect()
}

/// The ephemeral containers, which carry the same env fields under another type.
fn ephemeral_env_refs(spec: &PodSpec, secret: bool) -> Option<String> {
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let field = format!("spec.ephemeralContainers[{i}]");
        for (j, from) in c.env_from.iter().flatten().enumerate() {
            let hit = if secret {
                from.secret_ref.is_some()
            } else {
                from.config_map_ref.is_some()
            };
            if hit {
                return Some(format!("{field}.envFrom[{j}]"));
            }
        }
        for (j, e) in c.env.iter().flatten().enumerate() {
            let from = e.value_from.as_ref();
            let hit = if secret {
                from.is_some_and(|f| f.secret_key_ref.is_some())
            } else {
                from.is_some_and(|f| f.config_map_key_ref.is_some())
            };
            if hit {
                return Some(format!("{field}.env[{j}].valueFrom"));
            }
        }
    }
    None
}

/// kubelet's VisitPodSecretNames, first hit: image pull secrets, the containers' env,
/// then the volumes.
fn first_secret(spec: &PodSpec) -> Option<String> {
    if spec
        .image_pull_secrets
        .as_ref()
        .is_some_and(|s| !s.is_empty())
    {
        return Some("spec.imagePullSecrets".into());
    }
    for (field, c) in containers(spec) {
        for (j, from) in c.env_from.iter().flatten().enumerate() {
            if from.secret_ref.is_some() {
                return Some(format!("{field}.envFrom[{j}].secretRef"));
            }
        }
        for (j, e) in c.env.iter().flatten().enumerate() {
            if e.value_from
                .as_ref()
                .is_some_and(|f| f.secret_key_ref.is_some())
            {
                return Some(format!("{field}.env[{j}].valueFrom.secretKeyRef"));
            }
        }
    }
    if let Some(field) = ephemeral_env_refs(spec, true) {
        return Some(field);
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}]");
        let secret_ref = [
            ("azureFile", v.azure_file.is_some()),
            (
                "cephfs.secretRef",
                v.cephfs.as_ref().is_some_and(|s| s.secret_ref.is_some()),
            ),
            (
                "cinder.secretRef",
                v.cinder.as_ref().is_some_and(|s| s.secret_ref.is_some()),
            ),
            (
                "flexVolume.secretRef",
                v.flex_volume
                    .as_ref()
                    .is_some_and(|s| s.secret_ref.is_some()),
            ),
            (
                "rbd.secretRef",
                v.rbd.as_ref().is_some_and(|s| s.secret_ref.is_some()),
            ),
            ("secret", v.secret.is_some()),
            ("scaleIO.secretRef", v.scale_io.is_some()),
            (
                "iscsi.secretRef",
                v.iscsi.as_ref().is_some_and(|s| s.secret_ref.is_some()),
            ),
            (
                "storageos.secretRef",
                v.storageos.as_ref().is_some_and(|s| s.secret_ref.is_some()),
            ),
            (
                "csi.nodePublishSecretRef",
                v.csi
                    .as_ref()
                    .is_some_and(|s| s.node_publish_secret_ref.is_some()),
            ),
        ];
        if let Some((what, _)) = secret_ref.iter().find(|(_, hit)| *hit) {
            return Some(format!("{field}.{what}"));
        }
        for (j, s) in projected_sources(v).enumerate() {
            if s.secret.is_some() {
                return Some(format!("{field}.projected.sources[{j}].secret"));
            }
        }
    }
    None
}

/// kubelet's VisitPodConfigmapNames, first hit: the containers' env, then the volumes.
fn first_config_map(spec: &PodSpec) -> Option<String> {
    for (field, c) in containers(spec) {
        for (j, from) in c.env_from.iter().flatten().enumerate() {
            if from.config_map_ref.is_some() {
                return Some(format!("{field}.envFrom[{j}].configMapRef"));
            }
        }
        for (j, e) in c.env.iter().flatten().enumerate() {
            if e.value_from
                .as_ref()
                .is_some_and(|f| f.config_map_key_ref.is_some())
            {
                return Some(format!("{field}.env[{j}].valueFrom.configMapKeyRef"));
            }
        }
    }
    if let Some(field) = ephemeral_env_refs(spec, false) {
        return Some(field);
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}]");
        if v.config_map.is_some() {
            return Some(format!("{field}.configMap"));
        }
        for (j, s) in projected_sources(v).enumerate() {
            if s.config_map.is_some() {
                return Some(format!("{field}.projected.sources[{j}].configMap"));
            }
        }
    }
    None
}

fn projected_sources(
    v: &Volume,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::VolumeProjection> {
    v.projected.iter().flat_map(|p| p.sources.iter().flatten())
}

/// The reference a volume makes through its source, in kubelet's switch order.
fn volume_reference(v: &Volume, field: &str) -> Result<Option<(String, String)>, (String, String)> {
    let local = v.aws_elastic_block_store.is_some()
        || v.azure_disk.is_some()
        || v.cephfs.is_some()
        || v.cinder.is_some()
        || v.downward_api.is_some()
        || v.empty_dir.is_some()
        || v.fc.is_some()
        || v.flex_volume.is_some()
        || v.flocker.is_some()
        || v.gce_persistent_disk.is_some()
        || v.git_repo.is_some()
        || v.host_path.is_some()
        || v.image.is_some()
        || v.iscsi.is_some()
        || v.nfs.is_some()
        || v.photon_persistent_disk.is_some()
        || v.portworx_volume.is_some()
        || v.quobyte.is_some()
        || v.rbd.is_some()
        || v.scale_io.is_some()
        || v.storageos.is_some()
        || v.vsphere_volume.is_some();
    let hit =
        |what: &str, resource: &str| Ok(Some((format!("{field}.{what}"), resource.to_string())));
    if local {
        return Ok(None);
    }
    if v.config_map.is_some() {
        return hit("configMap", "configmaps (via configmap volumes)");
    }
    if v.secret.is_some() {
        return hit("secret", "secrets (via secret volumes)");
    }
    if v.csi.is_some() {
        return hit("csi", "csidrivers (via CSI volumes)");
    }
    if v.glusterfs.is_some() {
        return hit("glusterfs", "endpoints (via glusterFS volumes)");
    }
    if v.persistent_volume_claim.is_some() {
        return hit("persistentVolumeClaim", "persistentvolumeclaims");
    }
    if v.ephemeral.is_some() {
        return hit(
            "ephemeral",
            "persistentvolumeclaims (via ephemeral volumes)",
        );
    }
    if v.azure_file.is_some() {
        return hit("azureFile", "secrets (via azureFile volumes)");
    }
    if let Some(projected) = &v.projected {
        for (j, s) in projected.sources.iter().flatten().enumerate() {
            let at = format!("projected.sources[{j}]");
            let resource = if s.config_map.is_some() {
                "configmaps (via projected volumes)"
            } else if s.secret.is_some() {
                "secrets (via projected volumes)"
            } else if s.service_account_token.is_some() {
                "serviceaccounts (via projected volumes)"
            } else if s.cluster_trust_bundle.is_some() {
                "clustertrustbundles"
            } else if s.pod_certificate.is_some() {
                "podcertificates"
            } else if s.downward_api.is_some() {
                continue;
            } else {
                return Err((
                    format!("{field}.{at}"),
                    format!("unknown source for projected volume {:?}", v.name),
                ));
            };
            return Ok(Some((format!("{field}.{at}"), resource.to_string())));
        }
        return Ok(None);
    }
    Err((
        field.to_string(),
        format!("unknown volume type for volume  {:?}", v.name),
    ))
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

    fn found(spec: &str) -> Option<(String, String)> {
        api_object_reference(&pod(spec)).unwrap()
    }

    #[test]
    fn each_reference_is_named_as_kubelet_names_it() {
        let cases = [
            (
                "  serviceAccountName: builder\n",
                "spec.serviceAccountName",
                "serviceaccounts",
            ),
            (
                "  serviceAccount: builder\n",
                "spec.serviceAccount",
                "serviceaccounts",
            ),
            (
                "  imagePullSecrets: [{name: regcred}]\n",
                "spec.imagePullSecrets",
                "secrets",
            ),
            (
                "  initContainers:\n  - {name: i, image: i, envFrom: [{secretRef: {name: s}}]}\n",
                "spec.initContainers[0].envFrom[0].secretRef",
                "secrets",
            ),
            (
                "  volumes: [{name: v, secret: {secretName: s}}]\n",
                "spec.volumes[0].secret",
                "secrets",
            ),
            (
                "  volumes: [{name: v, configMap: {name: c}}]\n",
                "spec.volumes[0].configMap",
                "configmaps",
            ),
            (
                "  volumes: [{name: v, projected: {sources: [{downwardAPI: {items: []}}, {configMap: {name: c}}]}}]\n",
                "spec.volumes[0].projected.sources[1].configMap",
                "configmaps",
            ),
            (
                "  volumes: [{name: v, projected: {sources: [{serviceAccountToken: {path: t}}]}}]\n",
                "spec.volumes[0].projected.sources[0]",
                "serviceaccounts (via projected volumes)",
            ),
            (
                "  resourceClaims: [{name: gpu, resourceClaimName: gpu}]\n",
                "spec.resourceClaims",
                "resourceclaims",
            ),
            (
                "  volumes: [{name: v, persistentVolumeClaim: {claimName: data}}]\n",
                "spec.volumes[0].persistentVolumeClaim",
                "persistentvolumeclaims",
            ),
            (
                "  volumes: [{name: v, csi: {driver: d}}]\n",
                "spec.volumes[0].csi",
                "csidrivers (via CSI volumes)",
            ),
            (
                "  volumes: [{name: v, ephemeral: {volumeClaimTemplate: {spec: {}}}}]\n",
                "spec.volumes[0].ephemeral",
                "persistentvolumeclaims (via ephemeral volumes)",
            ),
        ];
        for (spec, field, resource) in cases {
            assert_eq!(
                found(spec),
                Some((field.to_string(), resource.to_string())),
                "{spec}"
            );
        }
    }

    #[test]
    fn the_containers_env_is_found_whichever_list_holds_it() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec:\n  containers:\n  - name: a\n    image: i\n    env:\n    - {name: X, value: '1'}\n    - name: C\n      valueFrom: {configMapKeyRef: {name: c, key: k}}\n",
        )
        .unwrap();
        assert_eq!(
            api_object_reference(&p).unwrap(),
            Some((
                "spec.containers[0].env[1].valueFrom.configMapKeyRef".to_string(),
                "configmaps".to_string()
            ))
        );
    }

    #[test]
    fn a_service_account_wins_over_a_secret_as_in_kubelet() {
        assert_eq!(
            found("  serviceAccountName: sa\n  imagePullSecrets: [{name: s}]\n")
                .unwrap()
                .1,
            "serviceaccounts"
        );
    }

    #[test]
    fn local_sources_and_the_downward_api_are_allowed() {
        assert_eq!(
            found(
                "  volumes:\n  - {name: a, emptyDir: {}}\n  - {name: b, hostPath: {path: /tmp}}\n  - {name: c, downwardAPI: {items: []}}\n  - {name: d, projected: {sources: [{downwardAPI: {items: []}}]}}\n"
            ),
            None
        );
        assert_eq!(found(""), None);
    }

    #[test]
    fn a_volume_with_no_source_is_an_error() {
        let err = api_object_reference(&pod("  volumes: [{name: v}]\n")).unwrap_err();
        assert_eq!(err.0, "spec.volumes[0]");
        assert!(err.1.contains("unknown volume type"), "{err:?}");
    }
}
