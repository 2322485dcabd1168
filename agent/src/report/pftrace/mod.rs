//! Perfetto's native trace format: a protobuf `Trace` of `TracePacket`s, built with the
//! generated Perfetto protos of `tracing-perfetto-sdk-schema`.
//!
//! - A process track per pod (`namespace/name (trace)`), carrying the pod's own stages,
//!   and a thread track per container, carrying that container's stages. A stage that
//!   overlaps another without nesting goes on a child track, `... (overlapping n)`.
//! - Stages are slices: a begin and an end event at the stage's start and end, on
//!   CLOCK_MONOTONIC (the clock the trace records), which a clock snapshot declares the
//!   trace's clock; every event packet names it. Their details are debug annotations.
//! - Kernel events are instants on the pod's `kernel` track (or on the trace's node
//!   process, for events tied to no pod).
//! - A flow leads from each CRI call to each kernel stage that began inside it.
//! - Counters on the node process: pods starting, CRI calls in flight, pods in each
//!   kind of wait, kernel events lost.
//!
//! Everything is derived from the timeline and the records: the same traces always give
//! the same bytes.

mod annotations;
mod counters;
mod slices;

use prost::Message;
use tracing_perfetto_sdk_schema as pb;
use tracing_perfetto_sdk_schema::trace_packet::{Data, OptionalTrustedPacketSequenceId};
use tracing_perfetto_sdk_schema::track_descriptor::StaticOrDynamicName;
use tracing_perfetto_sdk_schema::track_event::{CounterValueField, NameField, Type};

use super::TraceInput;
use super::chrome_json::{kernel_name, stage_args};
use super::lanes::lanes;
use crate::timeline::{PodTimeline, attribute};
use crate::trace::TraceRecord;
use slices::{Edge, Flows};

/// The one packet sequence the file is written as.
const SEQUENCE: u32 = 1;
/// `BuiltinClock::Monotonic`: CLOCK_MONOTONIC, the clock the probes and CRI spans use.
const MONOTONIC: u32 = pb::BuiltinClock::Monotonic as u32;
/// Thread IDs are `pid * TIDS + n`, unique across the file's processes.
const TIDS: i32 = 100;

/// The `.pftrace` bytes for `inputs`.
pub fn perfetto_trace(inputs: &[TraceInput]) -> Vec<u8> {
    let mut b = Builder::default();
    for input in inputs {
        b.trace(input);
    }
    b.finish()
}

#[derive(Default)]
struct Builder {
    descriptors: Vec<pb::TrackDescriptor>,
    /// Event packets with their time; made per track in the order the track needs.
    events: Vec<(u64, pb::TracePacket)>,
    next_uuid: u64,
    next_pid: i32,
    next_flow: u64,
}

impl Builder {
    fn uuid(&mut self) -> u64 {
        self.next_uuid += 1;
        self.next_uuid
    }

    fn track(&mut self, mut d: pb::TrackDescriptor, name: String) -> u64 {
        let uuid = self.uuid();
        d.uuid = Some(uuid);
        d.static_or_dynamic_name = Some(StaticOrDynamicName::Name(name));
        self.descriptors.push(d);
        uuid
    }

    fn process(&mut self, name: String) -> (u64, i32) {
        self.next_pid += 1;
        let pid = self.next_pid;
        let process = pb::ProcessDescriptor {
            pid: Some(pid),
            process_name: Some(name.clone()),
            ..Default::default()
        };
        let d = pb::TrackDescriptor {
            process: Some(process),
            ..Default::default()
        };
        (self.track(d, name), pid)
    }

    fn thread(&mut self, pid: i32, n: i32, name: String) -> u64 {
        let thread = pb::ThreadDescriptor {
            pid: Some(pid),
            tid: Some(pid * TIDS + n),
            thread_name: Some(name.clone()),
            ..Default::default()
        };
        let d = pb::TrackDescriptor {
            thread: Some(thread),
            ..Default::default()
        };
        self.track(d, name)
    }

    fn child(&mut self, parent: u64, name: String) -> u64 {
        let d = pb::TrackDescriptor {
            parent_uuid: Some(parent),
            ..Default::default()
        };
        self.track(d, name)
    }

    fn counter(&mut self, parent: u64, name: String) -> u64 {
        let d = pb::TrackDescriptor {
            parent_uuid: Some(parent),
            counter: Some(pb::CounterDescriptor::default()),
            ..Default::default()
        };
        self.track(d, name)
    }

    fn event(&mut self, at_ns: u64, e: pb::TrackEvent) {
        let packet = pb::TracePacket {
            timestamp: Some(at_ns),
            timestamp_clock_id: Some(MONOTONIC),
            data: Some(Data::TrackEvent(e)),
            ..Default::default()
        };
        self.events.push((at_ns, packet));
    }

    fn trace(&mut self, input: &TraceInput) {
        let mut pod_tracks: Vec<(&str, u64)> = Vec::new();
        for p in &input.timeline.pods {
            let name = if p.name.is_empty() {
                p.uid.clone()
            } else {
                format!("{}/{}", p.namespace, p.name)
            };
            let (track, pid) = self.process(format!("{name} ({})", input.name));
            pod_tracks.push((p.uid.as_str(), track));
            self.pod(p, track, pid);
        }
        let (node, _) = self.process(format!("node ({})", input.name));
        self.kernel_events(input, &pod_tracks, node);
        let start = input
            .records
            .iter()
            .filter_map(TraceRecord::at_ns)
            .chain(input.timeline.pods.iter().filter_map(|p| p.seen_ns))
            .min()
            .unwrap_or(0);
        for series in counters::series(start, &input.timeline.pods, &input.records) {
            let track = self.counter(node, series.name);
            for (at, value) in series.points {
                let e = pb::TrackEvent {
                    r#type: Some(Type::Counter as i32),
                    track_uuid: Some(track),
                    counter_value_field: Some(CounterValueField::CounterValue(value)),
                    ..Default::default()
                };
                self.event(at, e);
            }
        }
    }

    /// The pod's stages: its own on its process track, each container's on a thread.
    fn pod(&mut self, p: &PodTimeline, process: u64, pid: i32) {
        let flows = slices::flows(&p.stages, &mut self.next_flow);
        let mut containers: Vec<Option<&str>> = vec![None];
        for s in &p.stages {
            if let Some(c) = s.container.as_deref()
                && !containers.contains(&Some(c))
            {
                containers.push(Some(c));
            }
        }
        for (n, container) in containers.into_iter().enumerate() {
            let mine = p
                .stages
                .iter()
                .filter(|s| s.container.as_deref() == container);
            let home = match container {
                None => process,
                Some(c) => self.thread(pid, n as i32, c.to_string()),
            };
            let home_name = container.unwrap_or("stages");
            for (lane, stages) in lanes(mine).into_iter().enumerate() {
                let track = if lane == 0 {
                    home
                } else {
                    self.child(home, format!("{home_name} (overlapping {lane})"))
                };
                for edge in slices::edges(&stages) {
                    let e = self.edge(p, &flows, track, edge);
                    self.event(edge.at_ns(), e);
                }
            }
        }
    }

    fn edge(&self, p: &PodTimeline, flows: &Flows, track: u64, edge: Edge<'_>) -> pb::TrackEvent {
        let Edge::Begin(s) = edge else {
            return pb::TrackEvent {
                r#type: Some(Type::SliceEnd as i32),
                track_uuid: Some(track),
                ..Default::default()
            };
        };
        let index = p
            .stages
            .iter()
            .position(|x| std::ptr::eq(x, s))
            .expect("a lane's stage is one of the pod's");
        pb::TrackEvent {
            r#type: Some(Type::SliceBegin as i32),
            track_uuid: Some(track),
            name_field: Some(NameField::Name(s.stage.to_string())),
            categories: vec![s.source.to_string()],
            debug_annotations: annotations::annotations(&stage_args(s)),
            flow_ids: flows.out.get(&index).cloned().unwrap_or_default(),
            terminating_flow_ids: flows.into.get(&index).copied().into_iter().collect(),
            ..Default::default()
        }
    }

    /// Each kernel event as an instant on its pod's `kernel` track, or the node's.
    fn kernel_events(&mut self, input: &TraceInput, pods: &[(&str, u64)], node: u64) {
        let attribution = attribute(&input.records);
        let mut kernel_tracks: Vec<(u64, u64)> = Vec::new();
        for (i, r) in input.records.iter().enumerate() {
            let TraceRecord::Kernel(k) = r else {
                continue;
            };
            let parent = attribution
                .owner(i)
                .and_then(|o| pods.iter().find(|(uid, _)| *uid == o.pod_uid))
                .map_or(node, |(_, track)| *track);
            let track = match kernel_tracks.iter().find(|(p, _)| *p == parent) {
                Some((_, t)) => *t,
                None => {
                    let t = self.child(parent, "kernel".into());
                    kernel_tracks.push((parent, t));
                    t
                }
            };
            let args = serde_json::to_value(k).unwrap_or_default();
            let e = pb::TrackEvent {
                r#type: Some(Type::Instant as i32),
                track_uuid: Some(track),
                name_field: Some(NameField::Name(kernel_name(k))),
                categories: vec!["kernel".into()],
                debug_annotations: annotations::annotations(&args),
                ..Default::default()
            };
            self.event(k.ktime_ns(), e);
        }
    }

    /// The clock snapshot first, then every track, then the events in time order (each
    /// track's own order kept where times are equal).
    fn finish(mut self) -> Vec<u8> {
        let first = self.events.iter().map(|(at, _)| *at).min().unwrap_or(0);
        let clock = pb::ClockSnapshot {
            clocks: vec![pb::clock_snapshot::Clock {
                clock_id: Some(MONOTONIC),
                timestamp: Some(first),
                ..Default::default()
            }],
            primary_trace_clock: Some(MONOTONIC as i32),
        };
        let mut packets = vec![pb::TracePacket {
            timestamp: Some(first),
            timestamp_clock_id: Some(MONOTONIC),
            first_packet_on_sequence: Some(true),
            sequence_flags: Some(
                pb::trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32,
            ),
            data: Some(Data::ClockSnapshot(clock)),
            ..Default::default()
        }];
        packets.extend(self.descriptors.into_iter().map(|d| pb::TracePacket {
            data: Some(Data::TrackDescriptor(d)),
            ..Default::default()
        }));
        self.events.sort_by_key(|(at, _)| *at);
        packets.extend(self.events.into_iter().map(|(_, p)| p));
        for p in &mut packets {
            p.optional_trusted_packet_sequence_id = Some(
                OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(SEQUENCE),
            );
        }
        pb::Trace { packet: packets }.encode_to_vec()
    }
}
