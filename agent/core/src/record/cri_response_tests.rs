//! Typed responses read and write as the map of strings they once were: the same keys,
//! order and values, whatever a trace holds, and every field the recorder writes typed.

use std::net::IpAddr;

use super::*;

/// A CRI call record with `response` (JSON text) after its method.
fn line(method: &str, response: &str) -> String {
    format!(
        r#"{{"method":"{method}","attempt":0,"start_ns":1,"end_ns":2,"code":"OK","response":{response}}}"#
    )
}

/// Reads `line` the fast way (straight from the text) and through a JSON value (keys
/// sorted, strings owned), checks they agree and that it writes back as it was.
fn read(line: &str) -> CriCall {
    let fast: CriCall = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
    let value: serde_json::Value = serde_json::from_str(line).unwrap();
    let general: CriCall = serde_json::from_value(value).unwrap();
    assert_eq!(fast, general, "{line}");
    assert_eq!(serde_json::to_string(&fast).unwrap(), line);
    fast
}

/// Every shape of response the recorder writes (as the fixtures and the replay
/// benchmark's generator hold them): typed, nothing kept as text.
const RECORDED: &[(&str, &str)] = &[
    (
        "Version",
        r#"{"runtime_name":"containerd","runtime_version":"v2.1.4"}"#,
    ),
    ("Status", r#"{"NetworkReady":"true","RuntimeReady":"true"}"#),
    (
        "Status",
        r#"{"NetworkReady":"false","NetworkReady_message":"Network plugin returns error: cni plugin not initialized","NetworkReady_reason":"NetworkPluginNotReady","RuntimeReady":"true"}"#,
    ),
    (
        "Status",
        r#"{"ContainerdHasNoDeprecationWarnings":"true","NetworkReady":"true","RuntimeReady":"true"}"#,
    ),
    ("PodSandboxStatus", r#"{"ip":"10.244.77.9","state":"0"}"#),
    ("PodSandboxStatus", r#"{"ip":"fd00:10:244::5","state":"0"}"#),
    ("PodSandboxStatus", r#"{"ip":"","state":"1"}"#),
    ("PodSandboxStatus", r#"{"state":"1"}"#),
    ("ListPodSandbox", r#"{"count":"0"}"#),
    ("ListContainers", r#"{"count":"5"}"#),
    ("ContainerStatus", r#"{"exit_code":"0","state":"1"}"#),
    (
        "ContainerStatus",
        r#"{"exit_code":"143","reason":"Error","state":"2"}"#,
    ),
    (
        "ContainerStatus",
        r#"{"exit_code":"0","reason":"Completed","state":"2"}"#,
    ),
    (
        "ContainerStatus",
        r#"{"exit_code":"137","reason":"OOMKilled","state":"2"}"#,
    ),
    (
        "ContainerStatus",
        r#"{"exit_code":"128","reason":"StartError","state":"3"}"#,
    ),
    (
        "ContainerStatus",
        r#"{"exit_code":"-1","reason":"ContainerCannotRun","state":"0"}"#,
    ),
    ("ExecSync", r#"{"exit_code":"0"}"#),
    ("ExecSync", r#"{"exit_code":"-2147483648"}"#),
    ("ImageStatus", r#"{"present":"false"}"#),
    ("ImageStatus", r#"{"present":"true"}"#),
    ("PullImage", r#"{"auth":"false"}"#),
    (
        "PullImage",
        r#"{"auth":"true","image_ref":"sha256:796ed3ee7deb212ebc20b5863c8bcd3b3db0ddf010ff4ab7495113d82695dbaa"}"#,
    ),
    ("StopContainer", r#"{"timeout":"30"}"#),
    (
        "UpdateContainerResources",
        r#"{"cpu_quota":"-1","cpu_shares":"2","memory_limit_in_bytes":"134217728"}"#,
    ),
];

#[test]
fn every_response_the_recorder_writes_reads_typed_and_writes_back_the_same() {
    for (method, response) in RECORDED {
        let call = read(&line(method, response));
        assert!(!call.response.is_empty(), "{method} {response}");
        assert!(
            !call.response.has_unknown_fields(),
            "{method} {response}: {:?}",
            call.response
        );
    }
}

#[test]
fn readers_get_types() {
    let r = |m: &str, resp: &str| read(&line(m, resp)).response;
    let sandbox = r("PodSandboxStatus", r#"{"ip":"10.244.77.9","state":"0"}"#);
    assert_eq!(sandbox.pod_sandbox_state(), Some(PodSandboxState::Ready));
    assert_eq!(
        sandbox.pod_ip(),
        Some("10.244.77.9".parse::<IpAddr>().unwrap())
    );
    assert_eq!(sandbox.container_state(), None);
    let host = r("PodSandboxStatus", r#"{"ip":"","state":"1"}"#);
    assert_eq!(host.pod_sandbox_state(), Some(PodSandboxState::NotReady));
    assert_eq!(host.pod_ip(), None);
    let exited = r(
        "ContainerStatus",
        r#"{"exit_code":"1","reason":"Error","state":"2"}"#,
    );
    assert_eq!(exited.container_state(), Some(ContainerState::Exited));
    assert_eq!(exited.exit_code(), Some(1));
    assert_eq!(exited.reason(), Some(&ContainerReason::Error));
    assert_eq!(exited.pod_sandbox_state(), None);
    assert_eq!(r("ExecSync", r#"{"exit_code":"7"}"#).exit_code(), Some(7));
    assert_eq!(
        r("ImageStatus", r#"{"present":"true"}"#).image_present(),
        Some(true)
    );
    assert_eq!(
        r("PullImage", r#"{"auth":"false","image_ref":"sha256:ab"}"#).image_ref(),
        Some("sha256:ab")
    );
    assert_eq!(r("ListContainers", r#"{"count":"3"}"#).count(), Some(3));
    let status = r(
        "Status",
        r#"{"NetworkReady":"false","NetworkReady_message":"cni plugin not initialized","NetworkReady_reason":"NetworkPluginNotReady","RuntimeReady":"true"}"#,
    );
    let network = status.network_ready().unwrap();
    assert!(!network.status);
    assert_eq!(network.reason.as_deref(), Some("NetworkPluginNotReady"));
    assert_eq!(
        network.message.as_deref(),
        Some("cni plugin not initialized")
    );
    let runtime = status
        .condition(&RuntimeConditionType::RuntimeReady)
        .unwrap();
    assert!(runtime.status && runtime.reason.is_none());
}

#[test]
fn what_no_type_holds_is_kept_as_written_and_written_back_in_its_place() {
    for (method, response) in [
        // Keys a method has no field for.
        ("RunPodSandbox", r#"{"runtime_handler":"runc"}"#),
        (
            "ContainerStatus",
            r#"{"exit_code":"0","pid":"42","state":"1"}"#,
        ),
        ("ListContainers", r#"{"count":"1","zz":"last"}"#),
        // Values not spelled as the recorder spells them.
        ("ContainerStatus", r#"{"exit_code":"00","state":"+1"}"#),
        ("ContainerStatus", r#"{"exit_code":"1","state":"7"}"#),
        (
            "ContainerStatus",
            r#"{"exit_code":"99999999999","state":"2"}"#,
        ),
        ("PodSandboxStatus", r#"{"ip":"10.0.0.01","state":"0"}"#),
        ("PodSandboxStatus", r#"{"ip":"2001:DB8::1","state":"2"}"#),
        ("PodSandboxStatus", r#"{"ip":"not an ip","state":"-0"}"#),
        ("ImageStatus", r#"{"present":"True"}"#),
        ("ListPodSandbox", r#"{"count":"-1"}"#),
        ("ListPodSandbox", r#"{"count":"4294967296"}"#),
        ("ListContainers", r#"{"count":"1e3"}"#),
        ("ExecSync", r#"{"exit_code":"-01"}"#),
        ("ExecSync", r#"{"exit_code":"-"}"#),
        ("ExecSync", r#"{"exit_code":""}"#),
        ("ExecSync", r#"{"exit_code":"٣"}"#),
        ("StopContainer", r#"{"timeout":"0x1e"}"#),
        (
            "PodSandboxStatus",
            r#"{"ip":"::FFFF:10.0.0.1","state":"00"}"#,
        ),
        ("PodSandboxStatus", r#"{"ip":"2001:db8:0:0:0:0:0:1"}"#),
        ("StopContainer", r#"{"timeout":" 30"}"#),
        // A condition with no status, and details of a condition not given.
        (
            "Status",
            r#"{"NetworkReady":"yes","NetworkReady_reason":"r"}"#,
        ),
        ("Status", r#"{"Other_message":"m","RuntimeReady":"true"}"#),
        // Escapes, and keys around and between typed ones.
        (
            "Version",
            r#"{"a":"\"quoted\"\n","runtime_name":"x\u0001y","s":"1"}"#,
        ),
        (
            "PullImage",
            r#"{"auth":"false","b":"","image_ref":"r","z":"z"}"#,
        ),
        ("ExecSync", r#"{"":"empty key","exit_code":"1"}"#),
    ] {
        let call = read(&line(method, response));
        assert!(
            call.response.has_unknown_fields(),
            "{method} {response}: {:?}",
            call.response
        );
    }
}

#[test]
fn a_condition_whose_name_is_anothers_prefix_writes_in_name_order() {
    // "NetworkReadyX" sorts between "NetworkReady" and "NetworkReady_message".
    let call = read(&line(
        "Status",
        r#"{"NetworkReady":"false","NetworkReadyX":"true","NetworkReady_message":"m","NetworkReady_reason":"r"}"#,
    ));
    assert!(!call.response.has_unknown_fields());
    assert_eq!(
        call.response.network_ready().unwrap().message.as_deref(),
        Some("m")
    );
}

#[test]
fn a_response_before_its_method_reads_as_after_it() {
    for (method, response) in RECORDED {
        let before = format!(
            r#"{{"response":{response},"method":"{method}","start_ns":1,"end_ns":2,"code":"OK"}}"#
        );
        let call: CriCall = serde_json::from_str(&before).unwrap();
        assert_eq!(call, read(&line(method, response)), "{before}");
    }
}

#[test]
fn the_later_of_two_equal_keys_wins_as_in_a_map() {
    let call: CriCall = serde_json::from_str(&line(
        "ContainerStatus",
        r#"{"state":"2","exit_code":"1","state":"x","exit_code":"x","exit_code":"3"}"#,
    ))
    .unwrap();
    let written = serde_json::to_string(&call.response).unwrap();
    assert_eq!(written, r#"{"exit_code":"3","state":"x"}"#);
    let call: CriCall = serde_json::from_str(&line(
        "Status",
        r#"{"NetworkReady":"false","NetworkReady":"maybe"}"#,
    ))
    .unwrap();
    assert_eq!(call.response.network_ready(), None);
    let written = serde_json::to_string(&call.response).unwrap();
    assert_eq!(written, r#"{"NetworkReady":"maybe"}"#);
}

#[test]
fn a_response_that_is_not_a_map_of_strings_is_refused() {
    for response in [
        r#"{"count":5}"#,
        r#"{"count":null}"#,
        "null",
        r#"["count"]"#,
    ] {
        let text = line("ListContainers", response);
        assert!(serde_json::from_str::<CriCall>(&text).is_err(), "{text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(serde_json::from_value::<CriCall>(value).is_err(), "{text}");
    }
}

#[test]
fn a_call_reads_as_a_derived_struct_would() {
    let minimal = r#"{"method":"Version","start_ns":1,"end_ns":2,"code":"OK","type":"cri"}"#;
    let call: CriCall = serde_json::from_str(minimal).unwrap();
    assert_eq!(
        call,
        CriCall::new(CriMethod::Version)
            .with_times(1, 2)
            .with_code(GrpcCode::Ok)
    );
    for (text, error) in [
        (
            r#"{"start_ns":1,"end_ns":2,"code":"OK"}"#,
            "missing field `method`",
        ),
        (
            r#"{"method":"Version","end_ns":2,"code":"OK"}"#,
            "missing field `start_ns`",
        ),
        (
            r#"{"method":"Version","method":"Status","start_ns":1,"end_ns":2,"code":"OK"}"#,
            "duplicate field `method`",
        ),
        (
            r#"{"method":"Version","start_ns":1,"end_ns":2,"code":"OK","response":{},"response":{}}"#,
            "duplicate field `response`",
        ),
        (
            r#"{"method":"Reboot","start_ns":1,"end_ns":2,"code":"OK"}"#,
            "Reboot",
        ),
    ] {
        let err = serde_json::from_str::<CriCall>(text)
            .unwrap_err()
            .to_string();
        assert!(err.contains(error), "{text}: {err}");
    }
    // An empty response is no response.
    let empty = line("ListContainers", "{}");
    let call: CriCall = serde_json::from_str(&empty).unwrap();
    assert!(call.response.is_empty());
    assert!(!serde_json::to_string(&call).unwrap().contains("response"));
}

#[test]
fn the_recorders_constructors_write_what_the_map_of_strings_wrote() {
    let cases: Vec<(&str, CriResponse, &str)> = vec![
        (
            "PodSandboxStatus",
            CriResponse::pod_sandbox_status(0, Some("10.244.0.5")),
            r#"{"ip":"10.244.0.5","state":"0"}"#,
        ),
        (
            "PodSandboxStatus",
            CriResponse::pod_sandbox_status(1, Some("")),
            r#"{"ip":"","state":"1"}"#,
        ),
        (
            "PodSandboxStatus",
            CriResponse::pod_sandbox_status(0, None),
            r#"{"state":"0"}"#,
        ),
        (
            "PodSandboxStatus",
            CriResponse::pod_sandbox_status(9, Some("bogus")),
            r#"{"ip":"bogus","state":"9"}"#,
        ),
        (
            "ContainerStatus",
            CriResponse::container_status(2, 1, Some("Error")),
            r#"{"exit_code":"1","reason":"Error","state":"2"}"#,
        ),
        (
            "ContainerStatus",
            CriResponse::container_status(1, 0, None),
            r#"{"exit_code":"0","state":"1"}"#,
        ),
        (
            "ContainerStatus",
            CriResponse::container_status(5, 0, None),
            r#"{"exit_code":"0","state":"5"}"#,
        ),
        (
            "ListPodSandbox",
            CriResponse::listed(CriMethod::ListPodSandbox, 2),
            r#"{"count":"2"}"#,
        ),
        (
            "Status",
            StatusFields::new([
                RuntimeCondition::new(RuntimeConditionType::RuntimeReady, true),
                RuntimeCondition {
                    reason: Some(String::new()),
                    message: Some("not yet".into()),
                    ..RuntimeCondition::new(RuntimeConditionType::NetworkReady, false)
                },
            ])
            .into(),
            r#"{"NetworkReady":"false","NetworkReady_message":"not yet","NetworkReady_reason":"","RuntimeReady":"true"}"#,
        ),
        (
            "PullImage",
            PullImageFields {
                auth: Some(false),
                image_ref: None,
            }
            .into(),
            r#"{"auth":"false"}"#,
        ),
        (
            "UpdateContainerResources",
            UpdateContainerResourcesFields {
                cpu_quota: Some(0),
                cpu_shares: Some(1024),
                memory_limit_in_bytes: Some(0),
            }
            .into(),
            r#"{"cpu_quota":"0","cpu_shares":"1024","memory_limit_in_bytes":"0"}"#,
        ),
        (
            "StopContainer",
            StopContainerFields { timeout: None }.into(),
            "{}",
        ),
    ];
    for (method, response, written) in cases {
        assert_eq!(
            serde_json::to_string(&response).unwrap(),
            written,
            "{method}"
        );
        if written == "{}" {
            assert!(response.is_empty());
        } else {
            assert_eq!(read(&line(method, written)).response, response, "{written}");
        }
    }
}

#[test]
fn a_response_is_smaller_than_the_map_of_strings_it_replaces() {
    // One pointer, null when empty; the map was a vector of string pairs.
    assert_eq!(size_of::<CriResponse>(), size_of::<usize>());
    assert!(size_of::<CriResponse>() < size_of::<litemap::LiteMap<String, String>>());
}
