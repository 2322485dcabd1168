//! The decoder of the probes' ring-buffer records on any bytes. It must not panic; an
//! event it decodes must print, and must read back from the JSON a trace stores it as.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podlapse::ebpf::KernelEvent;
use podlapse::ebpf::event::decode;

fuzz_target!(|data: &[u8]| {
    let Ok(event) = decode(data) else {
        return;
    };
    let _ = event.to_string();
    let json = serde_json::to_string(&event).expect("an event serializes");
    let back: KernelEvent = serde_json::from_str(&json).expect("an event reads back");
    assert_eq!(back, event, "an event changes through the trace: {json}");
});
