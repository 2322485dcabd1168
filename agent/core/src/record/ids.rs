//! Trace and span IDs, derived from what the trace records so that the live export and
//! `podlapse export` of the recorded trace give the same IDs, and the `traceparent` a CRI
//! call carries names the span both exports make for it.
//!
//! - A pod's trace: from its UID.
//! - Its root span: from its UID.
//! - A CRI call's span: from its pod, method, container, attempt and start (the time the
//!   recording layer stamped before sending it).
//! - A stage's span: from its pod, name and start.

use sha2::{Digest, Sha256};

use super::CriCall;

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
    let d = digest(&[b"podlapse/trace", pod_uid.as_bytes()]);
    nonzero(d[..16].try_into().expect("16 of 32 bytes"))
}

pub fn root_span_id(pod_uid: &str) -> [u8; 8] {
    let d = digest(&[b"podlapse/pod", pod_uid.as_bytes()]);
    nonzero(d[..8].try_into().expect("8 of 32 bytes"))
}

/// Lower-case hex of an ID, as OTLP's JSON and the trace's `runtime_span` records spell
/// IDs.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

pub fn call_span_id(call: &CriCall) -> [u8; 8] {
    let d = digest(&[
        b"podlapse/cri",
        call.pod_uid.as_bytes(),
        call.method.as_str().as_bytes(),
        call.container.as_bytes(),
        &call.attempt.to_le_bytes(),
        &call.start_ns.to_le_bytes(),
    ]);
    nonzero(d[..8].try_into().expect("8 of 32 bytes"))
}

pub fn stage_span_id(pod_uid: &str, stage: &str, start_ns: u64) -> [u8; 8] {
    let d = digest(&[
        b"podlapse/stage",
        pod_uid.as_bytes(),
        stage.as_bytes(),
        &start_ns.to_le_bytes(),
    ]);
    nonzero(d[..8].try_into().expect("8 of 32 bytes"))
}

/// The trace every call of no pod names (Version, Status, relists): fixed, so nothing
/// random goes into a context no one records. Such calls belong to no pod's trace.
pub fn node_trace_id() -> [u8; 16] {
    let d = digest(&[b"podlapse/node"]);
    nonzero(d[..16].try_into().expect("16 of 32 bytes"))
}

/// The span ID a call of no pod names in [`node_trace_id`]'s trace: from its method and
/// start.
fn node_call_span_id(call: &CriCall) -> [u8; 8] {
    let d = digest(&[
        b"podlapse/node-cri",
        call.method.as_str().as_bytes(),
        &call.start_ns.to_le_bytes(),
    ]);
    nonzero(d[..8].try_into().expect("8 of 32 bytes"))
}

/// The W3C `traceparent` a call carries to the runtime. A call podlapse exports
/// (`call.traced`, decided by [`super::TraceGate`]) names its own span in its pod's
/// trace, sampled (`-01`), so a tracing runtime makes its spans children of it. Every
/// other call carries an unsampled context (`-00`): a call of a pod outside its startup
/// names the span it would have had, a call of no pod a span in [`node_trace_id`]'s
/// trace. A runtime whose sampler follows its parent (containerd's does) then records
/// nothing for it, where with no context at all it would start a trace of its own.
pub fn traceparent(call: &CriCall) -> String {
    let (trace, span) = if call.pod_uid.is_empty() {
        (node_trace_id(), node_call_span_id(call))
    } else {
        (trace_id(&call.pod_uid), call_span_id(call))
    };
    let flags = if call.traced && !call.pod_uid.is_empty() {
        "01"
    } else {
        "00"
    };
    format!("00-{}-{}-{flags}", hex(&trace), hex(&span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::CriMethod;

    fn call(uid: &str, start_ns: u64) -> CriCall {
        CriCall::new(CriMethod::RunPodSandbox)
            .with_pod_uid(uid)
            .with_times(start_ns, start_ns + 5)
            .with_code(crate::record::GrpcCode::Ok)
    }

    #[test]
    fn a_calls_traceparent_names_its_pods_trace_and_its_own_span() {
        let mut c = call("uid-1", 42);
        c.traced = true;
        let tp = traceparent(&c);
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0], "00");
        assert_eq!(parts[1], hex(&trace_id("uid-1")));
        assert_eq!(parts[2], hex(&call_span_id(&c)));
        assert_eq!(parts[3], "01");
        // The same call always; another start, another span.
        let mut again = call("uid-1", 42);
        again.traced = true;
        assert_eq!(traceparent(&again), tp);
        assert_ne!(call_span_id(&call("uid-1", 43)), call_span_id(&c));
        assert_ne!(trace_id("uid-2"), trace_id("uid-1"));
    }

    #[test]
    fn a_call_podlapse_does_not_export_carries_an_unsampled_context() {
        // A pod's call outside its startup: the same IDs, not sampled.
        let c = call("uid-1", 42);
        let tp = traceparent(&c);
        assert_eq!(
            tp,
            format!(
                "00-{}-{}-00",
                hex(&trace_id("uid-1")),
                hex(&call_span_id(&c))
            )
        );
        // A call of no pod: the fixed node trace, never sampled, whatever it says.
        let mut node = call("", 42);
        node.traced = true;
        let tp = traceparent(&node);
        assert!(
            tp.starts_with(&format!("00-{}-", hex(&node_trace_id()))),
            "{tp}"
        );
        assert!(tp.ends_with("-00"), "{tp}");
        assert_eq!(traceparent(&node), tp, "deterministic");
        let later = call("", 43);
        assert_ne!(traceparent(&later), tp, "a span per call");
        assert_ne!(node_trace_id(), trace_id(""));
    }
}
