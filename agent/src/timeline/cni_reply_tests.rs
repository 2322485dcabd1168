use super::*;

/// host-local 1.1.1's result for an ADD, as it printed it (Go's indented JSON).
const HOST_LOCAL_RESULT: &str = r#"{
    "cniVersion": "1.0.0",
    "ips": [
        {
            "address": "10.1.0.2/30",
            "gateway": "10.1.0.1"
        }
    ],
    "dns": {}
}"#;

/// host-local 1.1.1 with its range used up.
const HOST_LOCAL_FULL: &str = r#"{
    "code": 999,
    "msg": "failed to allocate for range 0: no IP addresses available in range set: 10.1.0.1-10.1.0.2"
}"#;

/// tuning 1.1.1 told to set a sysctl outside `net.`.
const TUNING_REFUSED: &str = r#"{
    "code": 999,
    "msg": "invalid net sysctl key: \"kernel.podlapse_lab_fail\""
}"#;

/// bridge's result: the bridge, the host's veth and the pod's interface, with the
/// address on the third.
const BRIDGE_RESULT: &str = r#"{
    "cniVersion": "1.0.0",
    "interfaces": [
        {
            "name": "cni0",
            "mac": "2a:9e:1f:3c:44:01"
        },
        {
            "name": "veth1a2b3c4d",
            "mac": "6e:01:02:03:04:05"
        },
        {
            "name": "eth0",
            "mac": "8a:0b:0c:0d:0e:0f",
            "sandbox": "/var/run/netns/cni-1234"
        }
    ],
    "ips": [
        {
            "interface": 2,
            "address": "10.88.0.7/16",
            "gateway": "10.88.0.1"
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0"
        }
    ],
    "dns": {}
}"#;

#[test]
fn a_bridge_result_gives_its_address_and_interfaces() {
    let reply = CniReply::parse(BRIDGE_RESULT.as_bytes(), false);
    assert_eq!(
        reply,
        CniReply::Result {
            ips: vec![CniIp {
                address: "10.88.0.7/16".into(),
                interface: Some(2),
            }],
            interfaces: vec!["cni0".into(), "veth1a2b3c4d".into(), "eth0".into()],
        }
    );
    assert_eq!(reply.summary(), "ip 10.88.0.7/16");
    assert_eq!(reply.addresses().collect::<Vec<_>>(), ["10.88.0.7/16"]);
}

#[test]
fn an_ipam_result_has_addresses_and_no_interfaces() {
    let reply = CniReply::parse(HOST_LOCAL_RESULT.as_bytes(), false);
    let CniReply::Result { ips, interfaces } = &reply else {
        panic!("{reply:?}");
    };
    assert_eq!(ips[0].address, "10.1.0.2/30");
    assert_eq!(ips[0].interface, None);
    assert!(interfaces.is_empty());
}

#[test]
fn plugin_errors_keep_their_code_and_message() {
    let reply = CniReply::parse(HOST_LOCAL_FULL.as_bytes(), false);
    assert_eq!(
        reply.summary(),
        "error 999: failed to allocate for range 0: no IP addresses available in range set: \
         10.1.0.1-10.1.0.2"
    );
    let reply = CniReply::parse(TUNING_REFUSED.as_bytes(), false);
    assert_eq!(
        reply,
        CniReply::Error {
            code: 999,
            msg: "invalid net sysctl key: \"kernel.podlapse_lab_fail\"".into(),
            details: String::new(),
        }
    );
    // libcni's Error with cniVersion and details, on one line.
    let reply = CniReply::parse(
        br#"{"cniVersion":"1.0.0","code": 11, "msg": "failed to allocate for range 0: no IP addresses available in range set: 10.1.0.2-10.1.0.2", "details": "range set full"}"#,
        false,
    );
    assert!(
        matches!(&reply, CniReply::Error { code: 11, details, .. } if details == "range set full"),
        "{reply:?}"
    );
    assert!(reply.summary().starts_with("error 11: failed to allocate"));
    assert!(reply.summary().ends_with("(range set full)"));
}

#[test]
fn old_results_name_their_addresses_ip4_and_ip6() {
    let reply = CniReply::parse(
        br#"{"cniVersion":"0.2.0","ip4":{"ip":"10.1.0.9/24","gateway":"10.1.0.1"},"ip6":{"ip":"fd00::9/64"}}"#,
        false,
    );
    assert_eq!(
        reply.addresses().collect::<Vec<_>>(),
        ["10.1.0.9/24", "fd00::9/64"]
    );
}

#[test]
fn a_reply_cut_short_is_unparsed_and_says_where() {
    let text = &BRIDGE_RESULT.as_bytes()[..200];
    let reply = CniReply::parse(text, true);
    let CniReply::Unparsed { why, text: kept } = &reply else {
        panic!("{reply:?}");
    };
    assert_eq!(why, "cut after 200 bytes, before the reply ended");
    assert_eq!(kept.as_bytes(), text);
    // Cut only after the object ended (trailing bytes missing): still a reply.
    let reply = CniReply::parse(HOST_LOCAL_FULL.as_bytes(), true);
    assert!(
        matches!(reply, CniReply::Error { code: 999, .. }),
        "{reply:?}"
    );
}

#[test]
fn output_that_is_no_reply_is_kept_as_text() {
    let reply = CniReply::parse(b"panic: runtime error\n\xff\xfe", false);
    let CniReply::Unparsed { why, text } = &reply else {
        panic!("{reply:?}");
    };
    assert!(why.starts_with("not JSON"), "{why}");
    assert_eq!(text, "panic: runtime error\n\\xff\\xfe");
    for (out, why) in [
        (&b"[1, 2]"[..], "JSON, but not an object"),
        (
            b"{\"hello\": 1}",
            "JSON, but neither a CNI result nor an error",
        ),
        (b"", "the plugin wrote nothing to its standard output"),
        (b"  \n", "the plugin wrote nothing to its standard output"),
    ] {
        assert_eq!(
            CniReply::parse(out, false),
            CniReply::Unparsed {
                why: why.into(),
                text: podlapse_core::record::escaped::escape(out),
            }
        );
    }
}

#[test]
fn replies_serialise_tagged_by_kind() {
    let reply = CniReply::parse(TUNING_REFUSED.as_bytes(), false);
    let json = serde_json::to_value(&reply).unwrap();
    assert_eq!(json["kind"], "error");
    assert_eq!(json["code"], 999);
    assert!(json.get("details").is_none());
    let back: CniReply = serde_json::from_value(json).unwrap();
    assert_eq!(back, reply);
    let none = CniReply::NotCaptured {
        why: "probes off".into(),
    };
    let json = serde_json::to_value(&none).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"kind": "not_captured", "why": "probes off"})
    );
    assert_eq!(none.summary(), "output not captured: probes off");
}
