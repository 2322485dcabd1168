//! Trace and span IDs, derived from what the trace records so that the live export and
//! `podtrace export` of the recorded trace give the same IDs, and the `traceparent` a CRI
//! call carries names the span both exports make for it.
//!
//! - A pod's trace: from its UID.
//! - Its root span: from its UID.
//! - A CRI call's span: from its pod, method, container, attempt and start (the time the
//!   recording layer stamped before sending it).
//! - A stage's span: from its pod, name and start.

use sha2::{Digest, Sha256};

use crate::cri::CriCall;

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

fn nonzero<const N: usize>(mut id: [u8; N]) -> [u8; N] {
    // An all-zero ID is invalid in W3C trace context; a digest of zeros is as good as
    // impossible, but never send one.
    if id.iter().all(|b| *b == 0) {
        id[N - 1] = 1;
    }
    id
}

pub fn trace_id(pod_uid: &str) -> [u8; 16] {
    let d = digest(&[b"podtrace/trace", pod_uid.as_bytes()]);
    nonzero(d[..16].try_into().expect("16 of 32 bytes"))
}

pub fn root_span_id(pod_uid: &str) -> [u8; 8] {
    let d = digest(&[b"podtrace/pod", pod_uid.as_bytes()]);
    nonzero(d[..8].try_into().expect("8 of 32 bytes"))
}

pub fn call_span_id(call: &CriCall) -> [u8; 8] {
    let d = digest(&[
        b"podtrace/cri",
        call.pod_uid.as_bytes(),
        call.method.as_bytes(),
        call.container.as_bytes(),
        &call.attempt.to_le_bytes(),
        &call.start_ns.to_le_bytes(),
    ]);
    nonzero(d[..8].try_into().expect("8 of 32 bytes"))
}

pub fn stage_span_id(pod_uid: &str, stage: &str, start_ns: u64) -> [u8; 8] {
    let d = digest(&[
        b"podtrace/stage",
        pod_uid.as_bytes(),
        stage.as_bytes(),
        &start_ns.to_le_bytes(),
    ]);
    nonzero(d[..8].try_into().expect("8 of 32 bytes"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The W3C `traceparent` of a call made for a pod (sampled); None for a call of no pod
/// (the node's own: Version, Status, lists), which belongs to no pod's trace.
pub fn traceparent(call: &CriCall) -> Option<String> {
    if call.pod_uid.is_empty() {
        return None;
    }
    Some(format!(
        "00-{}-{}-01",
        hex(&trace_id(&call.pod_uid)),
        hex(&call_span_id(call))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(uid: &str, start_ns: u64) -> CriCall {
        CriCall {
            method: "RunPodSandbox".into(),
            pod_uid: uid.into(),
            container: String::new(),
            attempt: 0,
            sandbox_id: String::new(),
            container_id: String::new(),
            image: String::new(),
            start_ns,
            end_ns: start_ns + 5,
            code: "OK".into(),
            message: String::new(),
            response: crate::cri::ResponseFields::new(),
        }
    }

    #[test]
    fn a_calls_traceparent_names_its_pods_trace_and_its_own_span() {
        let c = call("uid-1", 42);
        let tp = traceparent(&c).unwrap();
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0], "00");
        assert_eq!(parts[1], hex(&trace_id("uid-1")));
        assert_eq!(parts[2], hex(&call_span_id(&c)));
        assert_eq!(parts[3], "01");
        // The same call always; another start, another span; the node's calls, none.
        assert_eq!(traceparent(&call("uid-1", 42)).unwrap(), tp);
        assert_ne!(call_span_id(&call("uid-1", 43)), call_span_id(&c));
        assert_ne!(trace_id("uid-2"), trace_id("uid-1"));
        assert_eq!(traceparent(&call("", 42)), None);
    }
}
