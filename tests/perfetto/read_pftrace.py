"""Reads a Perfetto trace with Perfetto's own generated definitions (the `perfetto`
package on PyPI) and prints what it holds as JSON, for the Rust tests to check:

- tracks: uuid, name, parent, and the process or thread it describes;
- slices: rebuilt from each track's begin and end events, in the order the packets
  carry them (a track is a stack: an end closes the slice most recently begun);
- instants, counter values, flows, the declared clock;
- problems: anything a reader would reject (an end with no open slice, a slice left
  open, an event on a track never described, time going back on a track).

Usage: read_pftrace.py FILE
"""

import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

TYPE = pb.TrackEvent.Type


def annotation_value(a):
    kind = a.WhichOneof("value")
    return getattr(a, kind) if kind else None


def main(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    tracks = {}
    slices, instants, counters, problems = [], [], [], []
    clock = None
    event_clocks = set()
    open_slices = {}
    last_ts = {}
    for i, packet in enumerate(trace.packet):
        data = packet.WhichOneof("data")
        if data == "clock_snapshot":
            snap = packet.clock_snapshot
            clock = {
                "primary_trace_clock": snap.primary_trace_clock,
                "clocks": [c.clock_id for c in snap.clocks],
            }
        elif data == "track_descriptor":
            d = packet.track_descriptor
            track = {"uuid": d.uuid, "name": d.name}
            if d.HasField("parent_uuid"):
                track["parent"] = d.parent_uuid
            if d.HasField("process"):
                track["process"] = {"pid": d.process.pid, "name": d.process.process_name}
            if d.HasField("thread"):
                track["thread"] = {
                    "pid": d.thread.pid,
                    "tid": d.thread.tid,
                    "name": d.thread.thread_name,
                }
            if d.HasField("counter"):
                track["counter"] = True
            tracks[d.uuid] = track
        elif data == "track_event":
            e = packet.track_event
            ts = packet.timestamp
            event_clocks.add(packet.timestamp_clock_id)
            uuid = e.track_uuid
            if uuid not in tracks:
                problems.append(f"packet {i}: event on undescribed track {uuid}")
            if ts < last_ts.get(uuid, 0):
                problems.append(f"packet {i}: time goes back on track {uuid}")
            last_ts[uuid] = ts
            stack = open_slices.setdefault(uuid, [])
            if e.type == TYPE.TYPE_SLICE_BEGIN:
                stack.append(
                    {
                        "track": uuid,
                        "name": e.name,
                        "ts": ts,
                        "categories": list(e.categories),
                        "flow_ids": list(e.flow_ids),
                        "terminating_flow_ids": list(e.terminating_flow_ids),
                        "args": {
                            a.name: annotation_value(a) for a in e.debug_annotations
                        },
                    }
                )
            elif e.type == TYPE.TYPE_SLICE_END:
                if not stack:
                    problems.append(f"packet {i}: end with no open slice on {uuid}")
                    continue
                s = stack.pop()
                s["dur"] = ts - s["ts"]
                slices.append(s)
            elif e.type == TYPE.TYPE_INSTANT:
                instants.append({"track": uuid, "name": e.name, "ts": ts})
            elif e.type == TYPE.TYPE_COUNTER:
                counters.append({"track": uuid, "ts": ts, "value": e.counter_value})
            else:
                problems.append(f"packet {i}: event of type {e.type}")
    for uuid, stack in open_slices.items():
        for s in stack:
            problems.append(f"slice {s['name']} on track {uuid} never ended")
    json.dump(
        {
            "clock": clock,
            "event_clocks": sorted(event_clocks),
            "tracks": list(tracks.values()),
            "slices": slices,
            "instants": instants,
            "counters": counters,
            "problems": problems,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main(sys.argv[1])
