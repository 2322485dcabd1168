use podlapse_core::record::escaped::escape;
use podlapse_core::record::{Comm, EventMeta};

use super::*;

const MS: u64 = 1_000_000;

fn meta(at: u64) -> EventMeta {
    EventMeta {
        ktime_ns: at,
        cpu: 0,
        pid: 40,
        tgid: 40,
        comm: Comm::new("bridge"),
        cgroup_id: 1,
    }
}

fn chunk(at: u64, offset: u64, count: u64, bytes: &[u8]) -> CniOutput {
    CniOutput {
        meta: meta(at),
        offset,
        count,
        len: bytes.len() as u32,
        data: escape(bytes),
        unreadable: false,
        end: false,
        writes: None,
        captured: None,
    }
}

fn end(at: u64, total: u64, captured: u32) -> CniOutput {
    CniOutput {
        meta: meta(at),
        offset: total,
        count: 0,
        len: 0,
        data: String::new(),
        unreadable: false,
        end: true,
        writes: Some(1),
        captured: Some(captured),
    }
}

fn hook(at: u64, change: WriteHookChange, reason: &str) -> CniWriteHook {
    CniWriteHook {
        meta: meta(at),
        change,
        hook: "tracepoint:syscalls:sys_enter_write".into(),
        reason: reason.into(),
    }
}

/// Attached at 1 ms, detached at 500 ms.
fn attached() -> HookHistory {
    HookHistory::new(&[
        hook(MS, WriteHookChange::Attached, "RunPodSandbox"),
        hook(500 * MS, WriteHookChange::Detached, "idle"),
    ])
}

const ERROR: &[u8] = br#"{
    "code": 999,
    "msg": "invalid net sysctl key: \"kernel.podlapse_lab_fail\""
}"#;

#[test]
fn chunks_out_of_order_are_put_back_in_order() {
    let text = br#"{"cniVersion":"1.0.0","ips":[{"address":"10.88.0.7/16","interface":2}]}"#;
    let (a, b) = text.split_at(30);
    let first = chunk(10 * MS, 0, text.len() as u64, a);
    let second = chunk(10 * MS, 30, text.len() as u64, b);
    let total = end(11 * MS, text.len() as u64, text.len() as u32);
    let (reply, capture) = assemble(
        &[&total, &second, &first],
        2 * MS,
        Some(12 * MS),
        &attached(),
    );
    assert_eq!(reply.addresses().collect::<Vec<_>>(), ["10.88.0.7/16"]);
    let capture = capture.unwrap();
    let n = text.len() as u64;
    assert_eq!(
        (capture.written, capture.captured, capture.cut),
        (n, n, false)
    );
    assert_eq!(capture.hook, "tracepoint:syscalls:sys_enter_write");
}

#[test]
fn an_error_in_one_write_is_the_plugins_error() {
    let c = chunk(10 * MS, 0, ERROR.len() as u64, ERROR);
    let e = end(11 * MS, ERROR.len() as u64, ERROR.len() as u32);
    let (reply, _) = assemble(&[&c, &e], 2 * MS, Some(12 * MS), &attached());
    assert_eq!(
        reply.summary(),
        "error 999: invalid net sysctl key: \"kernel.podlapse_lab_fail\""
    );
}

#[test]
fn output_past_the_bound_is_counted_and_said_to_be_cut() {
    // A plugin that wrote a megabyte: the probes copied the first 1024 bytes in four
    // chunks of one write, and counted the rest.
    let big = vec![b'x'; 1024];
    let chunks: Vec<CniOutput> = (0..4)
        .map(|i| chunk(10 * MS, i * 256, 1 << 20, &big[..256]))
        .collect();
    let total = end(20 * MS, 1 << 20, 1024);
    let mut all: Vec<&CniOutput> = chunks.iter().collect();
    all.push(&total);
    let (reply, capture) = assemble(&all, 2 * MS, Some(21 * MS), &attached());
    let capture = capture.unwrap();
    assert_eq!(
        (capture.written, capture.captured, capture.cut),
        (1 << 20, 1024, true)
    );
    let CniReply::Unparsed { why, text } = reply else {
        panic!("not unparsed");
    };
    assert_eq!(why, "cut after 1024 bytes, before the reply ended");
    assert_eq!(text.len(), 1024);
}

#[test]
fn a_gap_stops_the_output_where_it_is() {
    let a = chunk(10 * MS, 0, 600, &[b'{'; 256]);
    // The chunk at 256 was lost; the one at 512 cannot be placed.
    let c = chunk(10 * MS, 512, 600, &[b' '; 88]);
    let (reply, capture) = assemble(&[&a, &c], 2 * MS, Some(12 * MS), &attached());
    let capture = capture.unwrap();
    assert_eq!(
        (capture.written, capture.captured, capture.cut),
        (600, 256, true)
    );
    assert!(matches!(reply, CniReply::Unparsed { .. }), "{reply:?}");
}

#[test]
fn overlapping_and_binary_chunks_do_not_break_the_assembly() {
    let a = chunk(10 * MS, 0, 4, b"\xff\xfe\x00a");
    let again = chunk(10 * MS, 0, 4, b"\xff\xfe\x00a");
    let b = chunk(10 * MS, 2, 4, b"\x00ab");
    let (reply, capture) = assemble(&[&a, &again, &b], 2 * MS, Some(12 * MS), &attached());
    assert_eq!(capture.unwrap().captured, 5);
    let CniReply::Unparsed { text, .. } = reply else {
        panic!("not unparsed");
    };
    assert_eq!(text, "\\xff\\xfe\u{0}ab");
}

#[test]
fn a_forged_offset_far_out_is_not_followed() {
    let far = chunk(10 * MS, u64::MAX - 10, 4, b"abcd");
    let (reply, capture) = assemble(&[&far], 2 * MS, Some(12 * MS), &attached());
    // Nothing placeable: an empty capture of a huge output, not a crash.
    assert!(matches!(
        reply,
        CniReply::NotCaptured { .. } | CniReply::Unparsed { .. }
    ));
    if let Some(c) = capture {
        assert_eq!(c.captured, 0);
    }
}

#[test]
fn nothing_written_with_the_hook_attached_is_an_empty_reply() {
    let e = end(11 * MS, 0, 0);
    let (reply, capture) = assemble(&[&e], 2 * MS, Some(12 * MS), &attached());
    assert_eq!(
        reply,
        CniReply::Unparsed {
            why: "the plugin wrote nothing to its standard output".into(),
            text: String::new(),
        }
    );
    assert_eq!(capture.unwrap().written, 0);
}

#[test]
fn without_a_capture_the_reply_says_why() {
    let late = HookHistory::new(&[hook(7 * MS, WriteHookChange::Attached, "bridge exec'd")]);
    let (reply, capture) = assemble(&[], 2 * MS, Some(12 * MS), &late);
    assert_eq!(
        reply,
        CniReply::NotCaptured {
            why: "the write hook was attached 5.0 ms after this plugin started, after its output"
                .into()
        }
    );
    assert!(capture.is_none());
    let (reply, _) = assemble(&[], 2 * MS, Some(4 * MS), &late);
    assert_eq!(
        reply.summary(),
        "output not captured: the write hook was attached 3.0 ms after this plugin exited"
    );
    let refused = HookHistory::new(&[hook(MS, WriteHookChange::Refused, "EPERM")]);
    let (reply, _) = assemble(&[], 2 * MS, Some(12 * MS), &refused);
    assert_eq!(
        reply.summary(),
        "output not captured: the write hook was not attached: the kernel refused it: EPERM"
    );
    let (reply, _) = assemble(&[], 2 * MS, Some(12 * MS), &HookHistory::default());
    assert!(reply.summary().contains("no write hook in this recording"));
    let (reply, _) = assemble(&[], 2 * MS, Some(12 * MS), &attached());
    assert!(reply.summary().contains("the probes lost it"), "{reply:?}");
    let before = HookHistory::new(&[
        hook(0, WriteHookChange::Attached, "x"),
        hook(MS, WriteHookChange::Detached, "idle"),
    ]);
    let (reply, _) = assemble(&[], 2 * MS, Some(12 * MS), &before);
    assert!(
        reply
            .summary()
            .contains("not attached while this plugin ran")
    );
}
