//! `podlapse kernel-events`: load the probes and print what the kernel reports, one
//! line (or JSON object) per event, then how many events were lost.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::agent::probes::{Probes, start_probes, unavailable_note};
use crate::ebpf::{
    DEFAULT_CGROUP_PREFIXES, DEFAULT_CNI_BIN_DIR, DEFAULT_RINGBUF_BYTES, KernelEvent, LostEvents,
    NetnsAttach, NetnsHookChoice, ProbeConfig, ProbeSummary, ProbesObject, ProgramStats,
};

/// How often losses are reported while the probes run.
const LOSS_REPORT_EVERY: Duration = Duration::from_secs(5);

/// Flags of every command that loads the probes.
#[derive(Debug, Clone, clap::Args)]
pub struct EbpfArgs {
    /// The probes object. Default: $PODLAPSE_PROBES, else the object built with podlapse
    /// and embedded in this binary.
    #[arg(long, value_name = "PATH")]
    pub probes: Option<PathBuf>,
    /// Fail when the probes cannot run, instead of continuing without kernel events.
    #[arg(long)]
    pub require_ebpf: bool,
    /// Print the probes' own diagnostics (aya-log) on stderr.
    #[arg(long)]
    pub ebpf_log: bool,
    /// Size of the kernel's event ring buffer: a power of two, at least one page.
    #[arg(long, default_value_t = DEFAULT_RINGBUF_BYTES, value_name = "BYTES")]
    pub ringbuf_bytes: u32,
    /// Cgroup path prefix whose cgroup events are kept (repeatable).
    #[arg(long = "cgroup-prefix", value_name = "PATH", default_values_t = DEFAULT_CGROUP_PREFIXES.map(String::from))]
    pub cgroup_prefixes: Vec<String>,
    /// The directory whose executables are CNI plugins. Default: where the runtime says
    /// it runs them (its CRI status info), else /opt/cni/bin.
    #[arg(long, value_name = "DIR")]
    pub cni_bin_dir: Option<String>,
    /// Also report network namespaces created by clone/clone3 with CLONE_NEWNET. Off by
    /// default: containerd and runc use unshare and setns, and the clone tracepoints
    /// slow down every fork on the node.
    #[arg(long)]
    pub clone_netns: bool,
    /// Load the namespace programs but attach them only while a caller holds their gate,
    /// as the agent does around the CRI calls that create or enter pod namespaces; the
    /// node's own execs and exits are reported only then too. kernel-events itself
    /// holds it never, so it then reports no namespace events and only the execs and
    /// exits of pods, the runtime and CNI plugins: this is for measuring the agent's
    /// overhead between those calls.
    #[arg(long, hide = true)]
    pub netns_on_demand: bool,
    /// What reports network namespace creation and entry: kprobes on the kernel
    /// functions that do them, where the kernel allows (they cost only when called),
    /// else the unshare and setns syscall tracepoints (which slow every syscall on the
    /// node while attached). `kprobes` fails where they do not attach.
    #[arg(long, value_enum, default_value_t = NetnsHooksArg::Auto, value_name = "HOOKS")]
    pub netns_hooks: NetnsHooksArg,
}

/// `--netns-hooks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetnsHooksArg {
    /// kprobes where the kernel allows them, else tracepoints.
    Auto,
    /// kprobes on unshare_nsproxy_namespaces and netns_install.
    Kprobes,
    /// The unshare and setns syscall tracepoints.
    Tracepoints,
}

impl From<NetnsHooksArg> for NetnsHookChoice {
    fn from(a: NetnsHooksArg) -> Self {
        match a {
            NetnsHooksArg::Auto => NetnsHookChoice::Auto,
            NetnsHooksArg::Kprobes => NetnsHookChoice::KernelFunctions,
            NetnsHooksArg::Tracepoints => NetnsHookChoice::SyscallTracepoints,
        }
    }
}

impl EbpfArgs {
    pub fn probe_config(&self) -> ProbeConfig {
        let mut config = ProbeConfig::new(ProbesObject::locate(self.probes.as_deref()));
        config.ringbuf_bytes = self.ringbuf_bytes;
        config.cgroup_prefixes = self.cgroup_prefixes.clone();
        config.cni_bin_dir = self
            .cni_bin_dir
            .clone()
            .unwrap_or_else(|| DEFAULT_CNI_BIN_DIR.to_string());
        config.clone_netns = self.clone_netns;
        config.netns_hooks = self.netns_hooks.into();
        if self.netns_on_demand {
            config.netns_attach = NetnsAttach::OnDemand;
        }
        if self.ebpf_log {
            config.ebpf_log = Some(Box::new(StderrLog));
        }
        config
    }

    /// Starts the probes, or says once why they cannot run. `Ok(None)`: continue
    /// without kernel events. `Err`: the message is out; exit with the code.
    pub fn start(&self) -> Result<Option<Started>, ExitCode> {
        self.start_with(self.probe_config())
    }

    /// [`EbpfArgs::start`] with `config`, made from [`EbpfArgs::probe_config`].
    pub fn start_with(&self, config: ProbeConfig) -> Result<Option<Started>, ExitCode> {
        match start_probes(config, self.require_ebpf) {
            Ok(Probes::Running(started)) => Ok(Some(*started)),
            Ok(Probes::Unavailable(e)) => {
                eprintln!("podlapse: {}", unavailable_note(&e));
                Ok(None)
            }
            Err(e) => Err(super::agent_failed(&e)),
        }
    }
}

pub use crate::agent::probes::Started;

#[derive(Debug, Clone, clap::Args)]
pub struct KernelEventsArgs {
    /// Stop after this many seconds (default: until interrupted).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Read and count the events but print only the summary (with --json, it also holds
    /// each program's run time and count, which the kernel keeps while
    /// kernel.bpf_stats_enabled is set).
    #[arg(long)]
    pub summary_only: bool,
    #[command(flatten)]
    pub ebpf: EbpfArgs,
}

/// Where the runtime runs its CNI plugins, when it answers within a moment; `None` when
/// it is not there (kernel-events also watches nodes without a runtime).
async fn runtime_cni_bin_dir() -> Option<String> {
    let endpoint = crate::cri::Endpoint::from_env(None).ok()?;
    let timeouts = crate::cri::Timeouts {
        request: Duration::from_secs(2),
        pull: Duration::from_secs(2),
    };
    let client = tokio::time::timeout(
        Duration::from_secs(3),
        crate::cri::CriClient::connect(endpoint, timeouts),
    )
    .await
    .ok()?
    .ok()?;
    let shape = crate::cri::NodeShape::detect(&client, None, false)
        .await
        .ok()?;
    shape.cni_bin_dirs.first().cloned()
}

pub async fn run(mut args: KernelEventsArgs) -> ExitCode {
    if args.ebpf.cni_bin_dir.is_none() {
        args.ebpf.cni_bin_dir = runtime_cni_bin_dir().await;
    }
    // Before the probes announce themselves: whoever waits for that line may interrupt
    // right after, and an interrupt must end the run cleanly, with its summary.
    let (mut sigint, mut sigterm) = match super::stop_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let (probes, mut events) = match args.ebpf.start() {
        Ok(Some(started)) => started,
        Ok(None) => {
            print_summary(args.json, None, &[], None, serde_json::Value::Null);
            return ExitCode::SUCCESS;
        }
        Err(code) => return code,
    };
    eprintln!(
        "podlapse: watching kernel events: {} programs attached from {} (ring buffer {} bytes, CNI plugins in {})",
        probes.attached().len(),
        probes.object(),
        probes.ringbuf_bytes(),
        args.ebpf
            .cni_bin_dir
            .as_deref()
            .unwrap_or(DEFAULT_CNI_BIN_DIR)
    );
    eprintln!(
        "podlapse: network namespace events from {}",
        probes.netns_hooks()
    );
    if let Some(gate) = probes.netns_gate()
        && !gate.programs().is_empty()
    {
        eprintln!(
            "podlapse: on demand, not attached: {}",
            gate.programs().join(", ")
        );
    }
    for (program, why) in probes.skipped() {
        eprintln!("podlapse: optional probe {program} not attached: {why}");
    }
    match (probes.cni_output_gate(), probes.cni_output_off()) {
        (Some(gate), _) => eprintln!(
            "podlapse: CNI plugins' output from a {}, attached while a plugin runs",
            gate.hook()
        ),
        (None, why) => eprintln!(
            "podlapse: CNI plugins' output not captured: {}",
            why.unwrap_or("no write hook")
        ),
    }

    let deadline = args
        .duration
        .map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    let mut report = tokio::time::interval(LOSS_REPORT_EVERY);
    report.tick().await;
    let mut reported_lost = 0u64;
    let mut stdout = std::io::stdout().lock();
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                // Everything that arrived with it, before polling the other branches
                // again: they are for once in a while, events come in batches.
                let mut open = true;
                for event in std::iter::once(event).chain(std::iter::from_fn(|| events.try_recv().ok())) {
                    if !args.summary_only && write_event(&mut stdout, args.json, &event).is_err() {
                        // stdout closed (a pipe reader went away): nobody is listening.
                        open = false;
                        break;
                    }
                }
                if !open {
                    break;
                }
            }
            _ = report.tick() => {
                if let Ok(lost) = probes.lost()
                    && lost.total > reported_lost
                {
                    eprintln!(
                        "podlapse: {} kernel events lost in the last {}s ({} in total; ring buffer of {} bytes full)",
                        lost.total - reported_lost,
                        LOSS_REPORT_EVERY.as_secs(),
                        lost.total,
                        probes.ringbuf_bytes()
                    );
                    reported_lost = lost.total;
                }
            }
            _ = &mut sleep => break,
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
    }
    // Read before stopping: the programs detach when the probes stop.
    let programs = probes.program_stats().unwrap_or_else(|e| {
        eprintln!("podlapse: {e}");
        Vec::new()
    });
    let hooks = probes.netns_hooks().kind();
    if let Some(gate) = probes.cni_output_gate() {
        gate.detach("the watcher is stopping");
    }
    let cni_output = cni_output_summary(&probes);
    // Events the reader drains while stopping still reach the channel: print them too.
    let stopping = probes.stop();
    tokio::pin!(stopping);
    let summary = loop {
        tokio::select! {
            summary = &mut stopping => break summary,
            Some(event) = events.recv() => {
                if !args.summary_only {
                    let _ = write_event(&mut stdout, args.json, &event);
                }
            }
        }
    };
    while let Ok(event) = events.try_recv() {
        if !args.summary_only {
            let _ = write_event(&mut stdout, args.json, &event);
        }
    }
    drop(stdout);
    match summary {
        Ok(summary) => {
            if summary.lost.total > 0 {
                eprintln!(
                    "podlapse: {} kernel events lost (ring buffer of {} bytes full)",
                    summary.lost.total, args.ebpf.ringbuf_bytes
                );
            }
            print_summary(
                args.json,
                Some(&summary),
                &programs,
                Some(hooks),
                cni_output,
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("podlapse: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_event(out: &mut impl Write, json: bool, event: &KernelEvent) -> std::io::Result<()> {
    if json {
        serde_json::to_writer(&mut *out, event).map_err(std::io::Error::other)?;
        out.write_all(b"\n")
    } else {
        writeln!(out, "{event}")
    }
}

/// What the summary says of the capture of CNI plugins' output: the write hook (`hook`,
/// its short name; `how`, which and why that one), whether it is attached now and how
/// often it was, or why there is none (`off`).
fn cni_output_summary(probes: &crate::ebpf::KernelProbes) -> serde_json::Value {
    match probes.cni_output_gate() {
        Some(gate) => serde_json::json!({
            "hook": gate.hook().name(),
            "how": gate.hook().to_string(),
            "attached": gate.is_attached(),
            "attaches": gate.attaches(),
            "refused": gate.failure(),
        }),
        None => serde_json::json!({ "off": probes.cni_output_off() }),
    }
}

/// The last line: how many events were read and lost, or that there were none to read.
/// `netns_hooks`: [`crate::ebpf::NetnsHooks::kind`] of the probes that ran;
/// `cni_output`: [`cni_output_summary`].
fn print_summary(
    json: bool,
    summary: Option<&ProbeSummary>,
    programs: &[ProgramStats],
    netns_hooks: Option<&str>,
    cni_output: serde_json::Value,
) {
    let lost = summary.map(|s| s.lost.clone()).unwrap_or_default();
    if json {
        let doc = serde_json::json!({
            "kind": "summary",
            "ebpf": summary.is_some(),
            "events": summary.map_or(0, |s| s.events),
            "undecodable": summary.map_or(0, |s| s.undecodable),
            "lost": lost.total,
            "lost_by_kind": lost.by_kind,
            "programs": programs,
            "bpf_stats": bpf_stats(programs),
            "netns_hooks": netns_hooks,
            "cni_output": cni_output,
        });
        println!("{doc}");
    } else {
        println!("{}", summary_line(summary.map(|s| s.events), &lost));
    }
}

/// Whether the programs' run times and counts are measurements or zeros the kernel did
/// not count.
fn bpf_stats(programs: &[ProgramStats]) -> crate::ebpf::BpfStatsState {
    let moved = programs
        .iter()
        .any(|p| p.run_count > 0 || p.run_time_ns > 0);
    crate::ebpf::BpfStatsState::read(Path::new(crate::ebpf::BPF_STATS_SYSCTL), moved)
}

fn summary_line(events: Option<u64>, lost: &LostEvents) -> String {
    let Some(events) = events else {
        return "kernel events: unavailable".to_string();
    };
    let mut line = format!("events: {events}, lost events: {}", lost.total);
    if !lost.by_kind.is_empty() {
        let kinds: Vec<String> = lost
            .by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        line.push_str(&format!(" ({})", kinds.join(", ")));
    }
    line
}

/// The probes' aya-log records, on stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        eprintln!("podlapse: probe {}: {}", record.level(), record.args());
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_losses_by_kind() {
        let mut lost = LostEvents::default();
        assert_eq!(summary_line(Some(3), &lost), "events: 3, lost events: 0");
        lost.total = 7;
        lost.by_kind.insert("exec", 5);
        lost.by_kind.insert("exit", 2);
        assert_eq!(
            summary_line(Some(3), &lost),
            "events: 3, lost events: 7 (exec 5, exit 2)"
        );
        assert_eq!(summary_line(None, &lost), "kernel events: unavailable");
    }
}
