//! `podtrace observe`: record the pods another CRI client runs, with the probes, as a
//! trace in `run`'s format marked as observed. It calls no mutating CRI method and
//! touches no cgroup; its only outputs are the trace and what it prints.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::CriArgs;
use super::kernel_events::EbpfArgs;
use crate::ebpf::now_ktime_ns;
use crate::observe::{EventsMode, ObserveConfig, RuntimeView, Watcher, observe, use_stream};
use crate::syncloop::clock::wall_now;
use crate::timeline::KernelFilter;
use crate::trace::{Footer, Header, ObservedHeader, SCHEMA_VERSION, TraceRecord, TraceWriter};

/// Between lists beside the event stream.
const RELIST: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, clap::Args)]
pub struct ObserveArgs {
    /// Where to write the trace (JSON Lines, docs/trace-format.md).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// Stop after this many seconds (default: until SIGINT or SIGTERM).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// How to learn of the runtime's changes: its event stream (CRI GetContainerEvents),
    /// or lists every --poll-ms. `auto` streams on containerd 2.x only: containerd 1.x
    /// gives each event to one subscriber, so streaming there would take events from the
    /// kubelet.
    #[arg(long, value_enum, default_value_t = EventsMode::Auto)]
    pub cri_events: EventsMode,
    /// Between lists when polling, in milliseconds.
    #[arg(long, default_value_t = 200, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub poll_ms: u64,
    /// The node's name in the trace. Default: the host name.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Do not load the kernel probes: the runtime's view only.
    #[arg(long, conflicts_with = "require_ebpf")]
    pub no_ebpf: bool,
    #[command(flatten)]
    pub ebpf: EbpfArgs,
    #[command(flatten)]
    pub cri: CriArgs,
}

pub async fn run(args: ObserveArgs) -> ExitCode {
    let (mut sigint, mut sigterm) = match super::stop_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let client = match args.cri.connect().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("podtrace: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shape = crate::cri::NodeShape::detect(&client, None, false)
        .await
        .ok();
    let view = RuntimeView::new(client);
    let version = match view.version().await {
        Ok(v) => v,
        Err(e) => {
            eprintln!("podtrace: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stream = use_stream(
        args.cri_events,
        &version.runtime_name,
        &version.runtime_version,
    );
    let mut sources = Vec::new();
    match &stream {
        Ok(()) => sources.push("cri:events".to_string()),
        Err(why) => {
            eprintln!(
                "podtrace: polling the runtime every {} ms: {why}",
                args.poll_ms
            );
            sources.push("cri:polling".to_string());
        }
    }
    let mut ebpf = args.ebpf.clone();
    if ebpf.cni_bin_dir.is_none() {
        ebpf.cni_bin_dir = shape.and_then(|s| s.cni_bin_dirs.first().cloned());
    }
    let started = if args.no_ebpf {
        None
    } else {
        match ebpf.start() {
            Ok(s) => s,
            Err(code) => return code,
        }
    };
    if started.is_some() {
        sources.insert(0, "kernel".to_string());
    }
    let (started_wall_ns, started_ns) = (wall_now(), now_ktime_ns());
    let node = args.node_name.clone().unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into())
            .to_lowercase()
    });
    let header = Header {
        schema_version: SCHEMA_VERSION,
        podtrace_version: env!("CARGO_PKG_VERSION").to_string(),
        node,
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        runtime_name: version.runtime_name.clone(),
        runtime_version: version.runtime_version.clone(),
        config: serde_json::json!({
            "mode": "observe",
            "cri_events": sources.iter().any(|s| s == "cri:events"),
            "poll_ms": args.poll_ms,
        }),
        started_wall_ns,
        started_ns,
        observed: Some(ObservedHeader {
            sources: sources.clone(),
            poll_ms: stream.is_err().then_some(args.poll_ms),
        }),
    };
    let writer = match TraceWriter::create(&args.trace, header).await {
        Ok(w) => w,
        Err(e) => {
            eprintln!("podtrace: --trace {}: {e}", args.trace.display());
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let sink = writer.sink();
    let (probes, forwarder) = match started {
        Some((probes, mut events)) => {
            let sink = sink.clone();
            let forwarder = crate::event_thread::spawn(async move {
                let mut filter = KernelFilter::new();
                let mut keep = Vec::new();
                while let Some(e) = events.recv().await {
                    filter.offer(e, &mut keep);
                    for e in keep.drain(..) {
                        sink.send(TraceRecord::Kernel(e));
                    }
                }
            });
            (Some(probes), Some(forwarder))
        }
        None => (None, None),
    };
    eprintln!(
        "podtrace: observing {} {} ({}) into {}",
        version.runtime_name,
        version.runtime_version,
        sources.join(", "),
        args.trace.display()
    );
    let deadline = args.duration.map(|s| Duration::from_secs_f64(s.max(0.0)));
    let stop = async {
        let timer = async {
            match deadline {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = timer => {},
            _ = sigint.recv() => {},
            _ = sigterm.recv() => {},
        }
    };
    let mut watcher = Watcher::new(started_wall_ns, started_ns);
    let config = ObserveConfig {
        poll: Duration::from_millis(args.poll_ms),
        relist: RELIST,
    };
    let observed = sink.clone();
    let summary = observe(
        &view,
        stream.is_ok(),
        config,
        &mut watcher,
        now_ktime_ns,
        move |r| observed.send(TraceRecord::Observed(r)),
        stop,
    )
    .await;
    let mut footer = Footer {
        ebpf: probes.is_some(),
        ..Footer::default()
    };
    if let Some(probes) = probes {
        super::recorder::stop_probes(probes, &mut footer).await;
    }
    if let Some(f) = forwarder {
        let _ = f.await;
    }
    footer.ended_ns = now_ktime_ns();
    let stats = writer.stats();
    if let Err(e) = writer.finish(footer).await {
        eprintln!("podtrace: writing {}: {e}", args.trace.display());
        return ExitCode::FAILURE;
    }
    for (error, count) in &summary.runtime_errors {
        eprintln!("podtrace: the runtime failed {count} look(s): {error}");
    }
    eprintln!(
        "podtrace: observed {} pods ({} changes) into {}",
        summary.pods.len(),
        summary.records,
        args.trace.display()
    );
    if stats.dropped() > 0 || stats.unwritten() > 0 {
        eprintln!(
            "podtrace: trace {}: {} records dropped, {} unwritten ({})",
            args.trace.display(),
            stats.dropped(),
            stats.unwritten(),
            stats.failure().unwrap_or("the writer fell behind")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
