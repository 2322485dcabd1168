//! One check per fault. Each reads a pod's facts and returns a finding with its
//! evidence, or nothing. The order they are tried in (`findings`) is their importance:
//! the first cause in the pipeline that stopped the pod is its verdict.

use podlapse_core::record::{ContainerState, CriMethod};

use super::facts::{CniRun, Facts, PodFacts};
use super::model::{Cause, Finding};
use super::network;
use crate::cni::words;
use crate::cri::CriCall;
use crate::timeline::{CniReply, Stage, StageKind, StageName};

/// What host-local (and other IPAM plugins) say when their range is used up.
const IPAM_EXHAUSTED: &str = words::IPAM_EXHAUSTED_SHORT;
/// Sandbox attempts of an observed pod listed one by one in a verdict; earlier ones are
/// counted.
const MAX_ATTEMPTS_SHOWN: usize = 4;
/// kubelet's message for a container restarted after it exited.
const RESTARTING_FAILED: &str = "restarting failed container";

fn finding(
    cause: Cause,
    stage: impl Into<StageName>,
    summary: String,
    evidence: Vec<String>,
) -> Finding {
    Finding {
        cause,
        stage: stage.into(),
        summary,
        evidence,
    }
}

/// Every finding for the pod, most important first.
pub(super) fn findings(p: &PodFacts<'_>, f: &Facts<'_>) -> Vec<Finding> {
    let checks: [&dyn Fn() -> Option<Finding>; 8] = [
        &|| not_admitted(p),
        &|| network_not_ready(p, f),
        &|| sandbox_failed(p, f),
        &|| observed_sandbox_failed(p, f),
        &|| image_pull_failed(p),
        &|| crash_loop(p, f),
        &|| sandbox_recreated(p),
        &|| leaked_ip(p, f),
    ];
    checks.iter().filter_map(|c| c()).collect()
}

/// No CRI call was ever made for the pod, and it was turned away.
fn not_admitted(p: &PodFacts<'_>) -> Option<Finding> {
    if !p.calls.is_empty() {
        return None;
    }
    let rejected: Vec<String> = p
        .events
        .iter()
        .filter(|e| e.event.reason != "NetworkNotReady")
        .map(|e| {
            format!(
                "{} event {}: {}",
                p.at(e.at_ns),
                e.event.reason,
                e.event.message
            )
        })
        .collect();
    if rejected.is_empty() {
        return None;
    }
    Some(finding(
        Cause::NotAdmitted,
        StageKind::Admitted,
        "the pod was not admitted: no pod worker ever asked the runtime for anything".into(),
        rejected,
    ))
}

/// The runtime said NetworkReady=false, so the network gate held the pod back.
fn network_not_ready(p: &PodFacts<'_>, f: &Facts<'_>) -> Option<Finding> {
    if p.calls_named(CriMethod::RunPodSandbox).any(|c| c.ok()) || p.host_network() {
        return None;
    }
    let gated: Vec<_> = p.events_named("NetworkNotReady").collect();
    let last = gated.last().map_or(u64::MAX, |e| e.at_ns);
    let status = f.network_not_ready_before(last);
    if gated.is_empty() && (status.is_none() || p.timeline.stage(StageKind::Running).is_some()) {
        return None;
    }
    let mut evidence = Vec::new();
    if let Some(s) = status {
        let network = s.response.network_ready();
        let why = [
            network.and_then(|n| n.reason.as_ref()),
            network.and_then(|n| n.message.as_ref()),
        ]
        .into_iter()
        .flatten()
        .filter(|v| !v.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(": ");
        evidence.push(format!(
            "{} CRI Status: NetworkReady=false{}",
            p.at(s.end_ns),
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        ));
    }
    match (gated.first(), gated.last()) {
        (Some(only), _) if gated.len() == 1 => evidence.push(format!(
            "{} event NetworkNotReady: {}",
            p.at(only.at_ns),
            only.event.message
        )),
        (Some(first), Some(last)) => evidence.push(format!(
            "{} event NetworkNotReady, {} times until {}: {}",
            p.at(first.at_ns),
            gated.len(),
            p.at(last.at_ns),
            last.event.message
        )),
        _ => {}
    }
    if p.calls_named(CriMethod::RunPodSandbox).next().is_none() {
        evidence.push("no RunPodSandbox was called for the pod".into());
    }
    Some(finding(
        Cause::NetworkNotReady,
        StageKind::SandboxRequested,
        "the runtime reports NetworkReady=false (no CNI configuration loaded), so no sandbox was requested".into(),
        evidence,
    ))
}

/// The stages that ran during a RunPodSandbox call.
fn during<'a>(p: &'a PodFacts<'_>, call: &CriCall) -> impl Iterator<Item = &'a Stage> {
    let (from, to) = (call.start_ns, call.end_ns);
    p.timeline
        .stages
        .iter()
        .filter(move |s| s.start_ns >= from && s.start_ns <= to)
}

/// `plugin type="tuning"` in the runtime's error text.
fn plugin_in_message(message: &str) -> Option<&str> {
    let rest = message.split("plugin type=\"").nth(1)?;
    rest.split('"').next().filter(|s| !s.is_empty())
}

fn exit_text(s: &Stage) -> String {
    match (s.exit_code, s.signal) {
        (_, Some(sig)) => format!("was killed by signal {sig}"),
        (Some(c), None) => format!("exited with code {c}"),
        (None, None) => "did not exit while recorded".into(),
    }
}

/// One plugin run as evidence: when it ended, how, its pid, and who delegated to it.
fn plugin_run(p: &PodFacts<'_>, s: &Stage) -> String {
    format!(
        "{} {} ADD {} (kernel, pid {}){}{}",
        p.at(s.end_ns),
        s.stage,
        exit_text(s),
        s.pid.map_or("?".into(), |x| x.to_string()),
        s.detail
            .split(", ")
            .find(|d| d.starts_with("delegated by"))
            .map(|d| format!(", {d}"))
            .unwrap_or_default(),
        said_text(s)
    )
}

/// What the plugin printed, as its own words: `; it said: error 11: ...`.
fn said_text(s: &Stage) -> String {
    match &s.reply {
        Some(CniReply::Error { .. }) => format!("; it said: {}", reply_summary(s)),
        Some(r @ (CniReply::Unparsed { .. } | CniReply::NotCaptured { .. })) => {
            format!("; {}", r.summary())
        }
        Some(CniReply::Result { .. }) | None => String::new(),
    }
}

/// The plugin's reply for people, with what the capture cut.
fn reply_summary(s: &Stage) -> String {
    let Some(r) = &s.reply else {
        return String::new();
    };
    let cut = s
        .capture
        .as_ref()
        .filter(|c| c.cut)
        .map(|c| format!(" (the first {} of {} bytes)", c.captured, c.written))
        .unwrap_or_default();
    format!("{}{cut}", r.summary())
}

/// The plugin's error message, when it printed one.
fn error_msg(s: &Stage) -> Option<&str> {
    match &s.reply {
        Some(CniReply::Error { msg, .. }) => Some(msg.as_str()),
        _ => None,
    }
}

/// The last RunPodSandbox failed: narrow down where, from the kernel's view of that
/// attempt and the runtime's error text.
fn sandbox_failed(p: &PodFacts<'_>, f: &Facts<'_>) -> Option<Finding> {
    let runs: Vec<&CriCall> = p.calls_named(CriMethod::RunPodSandbox).collect();
    let last = *runs.last()?;
    if last.ok() {
        return None;
    }
    let failed = runs.iter().filter(|c| !c.ok()).count();
    let mut evidence = vec![format!(
        "{} RunPodSandbox failed ({} of {} attempt{} failed): {}: {}",
        p.at(last.end_ns),
        failed,
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
        last.code,
        last.message
    )];
    let stages: Vec<&Stage> = during(p, last).collect();
    let mut plugins: Vec<&Stage> = stages
        .iter()
        .copied()
        .filter(|s| *s.kind() == StageKind::CniPlugin && !s.ok)
        .collect();
    // The one that failed first is the cause; a plugin that delegated to it fails after.
    plugins.sort_by_key(|s| s.end_ns);
    evidence.extend(plugins.iter().map(|s| plugin_run(p, s)));
    let event_text = p
        .events_named("FailedCreatePodSandBox")
        .last()
        .map(|e| e.event.message.clone())
        .unwrap_or_default();
    let said = format!("{}\n{event_text}", last.message);
    if let Some(found) = runtime_words(p, f, last, &stages, &said, &mut evidence) {
        return Some(found);
    }
    let exhausted = said.contains(IPAM_EXHAUSTED)
        || plugins
            .iter()
            .any(|s| error_msg(s).is_some_and(|m| m.contains(IPAM_EXHAUSTED)));
    let ipam = plugins.iter().find(|s| s.detail.contains("delegated by"));
    if exhausted || ipam.is_some() {
        if let Some(pool) = f
            .network_near(last.end_ns, pool_full)
            .and_then(|n| n.ipam.as_ref())
        {
            let attempts: Vec<&str> = p.timeline.sandbox_ids.iter().map(String::as_str).collect();
            evidence.extend(network::pool_evidence(pool, &attempts, &f.owners));
        }
        let stage = ipam
            .map(|s| s.stage.clone())
            .or_else(|| plugins.first().map(|s| s.stage.clone()))
            .unwrap_or_else(|| StageKind::CniAdd.into());
        let plugin = stage
            .cni_plugin()
            .map_or_else(|| stage.to_string(), str::to_string);
        let summary = if exhausted {
            format!("IPAM exhaustion: {plugin} has no free IP address in its range")
        } else {
            format!("the IPAM plugin {plugin} failed")
        };
        return Some(finding(
            if exhausted {
                Cause::IpamExhausted
            } else {
                Cause::CniPluginFailed
            },
            stage,
            summary,
            evidence,
        ));
    }
    if let Some(s) = plugins.first() {
        return Some(finding(
            Cause::CniPluginFailed,
            s.stage.clone(),
            with_words(
                format!(
                    "CNI plugin {} {} during ADD",
                    s.stage.cni_plugin().unwrap_or_default(),
                    exit_text(s)
                ),
                s,
            ),
            evidence,
        ));
    }
    if let Some(plugin) = plugin_in_message(&last.message) {
        evidence.push("the kernel saw no failing plugin exit (no probes, or events lost)".into());
        return Some(finding(
            Cause::CniPluginFailed,
            StageName::of(StageKind::CniPlugin, plugin),
            format!("CNI plugin {plugin} failed during ADD, by the runtime's account"),
            evidence,
        ));
    }
    let netns = stages.iter().any(|s| *s.kind() == StageKind::NetnsCreated);
    if f.kernel && !netns {
        evidence.push("the kernel saw no network namespace created during the call".into());
        return Some(finding(
            Cause::NetnsNotCreated,
            StageKind::NetnsCreated,
            "the sandbox failed before its network namespace was created".into(),
            evidence,
        ));
    }
    Some(finding(
        Cause::SandboxFailed,
        StageKind::SandboxRequested,
        "RunPodSandbox failed".into(),
        evidence,
    ))
}

/// The runtime's own words for a fault before or after the plugins ran: no network
/// configuration loaded, a plugin that is not installed, a result without an address.
fn runtime_words(
    p: &PodFacts<'_>,
    f: &Facts<'_>,
    last: &CriCall,
    stages: &[&Stage],
    said: &str,
    evidence: &mut Vec<String>,
) -> Option<Finding> {
    let node = f.network_near(last.end_ns, |n| {
        n.not_ready() || !n.missing_plugins.is_empty()
    });
    if said.contains(words::NOT_INITIALIZED) {
        evidence.extend(node.map(network::not_ready_evidence).unwrap_or_default());
        return Some(finding(
            Cause::NetworkNotReady,
            StageKind::SandboxRequested,
            "the runtime refused the sandbox: no CNI network configuration is loaded (cni plugin not initialized)".into(),
            std::mem::take(evidence),
        ));
    }
    if let Some((plugin, dirs)) = words::missing_plugin(said) {
        evidence.push(chain_text(p, stages, &plugin));
        if let Some(n) = node.filter(|n| !n.missing_plugins.is_empty()) {
            evidence.extend(network::missing_evidence(n));
        }
        return Some(finding(
            Cause::CniPluginMissing,
            StageName::of(StageKind::CniPlugin, &plugin),
            format!(
                "CNI plugin {plugin} is not installed: the runtime found no executable for it in [{}]",
                dirs.join(" ")
            ),
            std::mem::take(evidence),
        ));
    }
    if said.contains(words::NO_NETWORK_INFO) {
        evidence.push(chain_text(p, stages, ""));
        if let Some(n) = node {
            evidence.push(format!(
                "the runtime uses network {}",
                network::network_of(n)
            ));
        }
        return Some(finding(
            Cause::CniNoAddress,
            StageKind::CniAdd,
            "every CNI plugin succeeded, but the result gave the pod's interface no address".into(),
            std::mem::take(evidence),
        ));
    }
    None
}

/// What the kernel saw of the attempt's chain: which plugins ran and how they ended, and
/// that `missing` (when named) never ran.
fn chain_text(p: &PodFacts<'_>, stages: &[&Stage], missing: &str) -> String {
    let ran: Vec<String> = stages
        .iter()
        .filter(|s| *s.kind() == StageKind::CniPlugin)
        .map(|s| {
            format!(
                "{} ({})",
                s.stage.cni_plugin().unwrap_or_default(),
                exit_text(s).replace("exited with code", "exit")
            )
        })
        .collect();
    let at = stages.first().map(|s| p.at(s.start_ns)).unwrap_or_default();
    match (ran.is_empty(), missing.is_empty()) {
        (true, true) => "the kernel saw no CNI plugin run during the call".into(),
        (true, false) => {
            format!("the kernel saw no CNI plugin run during the call, {missing} never exec'd")
        }
        (false, true) => format!("{at} the kernel saw the chain run: {}", ran.join(", ")),
        (false, false) => format!(
            "{at} the kernel saw the chain stop before {missing}: {} ran, {missing} never exec'd",
            ran.join(", ")
        ),
    }
}

/// Another client's pod (an observed trace: no CRI call of its own) whose last sandbox
/// attempt never became ready: the attempts the kernel saw, each by the sandbox ID its
/// CNI plugins were given, and what stopped the last one: the plugin that failed (the
/// IPAM plugin on a used-up pool among them), a plugin of the network that is not
/// installed, or a chain that succeeded without giving the pod an address. The
/// runtime's error text went to the client that asked: when that client is a kubelet
/// whose spans the observer receives, its failed RunPodSandbox carries the text and the
/// verdict quotes it; else the node's network as the observer looked at it stands in.
fn observed_sandbox_failed(p: &PodFacts<'_>, f: &Facts<'_>) -> Option<Finding> {
    if !p.calls.is_empty() {
        return None;
    }
    let t = p.timeline;
    let cni = |id: &str| {
        let mut v: Vec<&Stage> = t
            .stages
            .iter()
            .filter(|s| *s.kind() == StageKind::CniPlugin && s.sandbox_id.as_deref() == Some(id))
            .collect();
        v.sort_by_key(|s| s.end_ns);
        v
    };
    let attempts: Vec<&String> = t
        .sandbox_ids
        .iter()
        .filter(|id| !cni(id).is_empty())
        .collect();
    let last = *attempts.last()?;
    let ready = t.stages.iter().any(|s| {
        s.stage.is(&StageKind::SandboxReady) && s.sandbox_id.as_deref() == Some(last.as_str())
    });
    if ready {
        return None;
    }
    let failing = |id: &str| cni(id).into_iter().find(|s| !s.ok);
    // The verdict rests on the last attempt a plugin failed in by exiting: a later one
    // whose plugin has not exited is under way (the client still retries, or the
    // recording stopped during it), not an explanation. Only when no plugin ever exited
    // failing is one that never exited the cause (a plugin that hangs).
    let exited_failing = |id: &str| {
        cni(id)
            .into_iter()
            .find(|s| !s.ok && (s.exit_code.is_some() || s.signal.is_some()))
    };
    let kubelet_said = kubelet_sandbox_error(p);
    let mut evidence = vec![format!(
        "{} sandbox attempt{} the kernel saw, none of them ready; the runtime kept none{}",
        attempts.len(),
        if attempts.len() == 1 { "" } else { "s" },
        if kubelet_said.is_some() {
            ""
        } else {
            " (its error went to the client that asked)"
        }
    )];
    evidence.extend(kubelet_said);
    // The last few attempts, each on a line: a client retrying for minutes makes many.
    let shown = attempts.len().saturating_sub(MAX_ATTEMPTS_SHOWN);
    if shown > 0 {
        evidence.push(format!("({shown} earlier attempts not listed)"));
    }
    for id in &attempts[shown..] {
        evidence.push(match failing(id) {
            Some(s) => format!("sandbox {}: {}", short(id), plugin_run(p, s)),
            None => format!(
                "sandbox {}: {}",
                short(id),
                chain_text(p, &cni(id), "").replace("the kernel saw the chain run", "ran")
            ),
        });
    }
    // A plugin that exited with a code of its own says why; one killed by a signal was
    // most often stopped by the runtime when the client gave up on the call.
    let coded = |id: &str| exited_failing(id).filter(|s| s.exit_code.is_some_and(|c| c != 0));
    let failed = attempts
        .iter()
        .rev()
        .find_map(|id| coded(id))
        .or_else(|| attempts.iter().rev().find_map(|id| exited_failing(id)))
        .or_else(|| failing(last));
    let Some(failed) = failed else {
        return chain_without_failure(p, f, last, &cni(last), evidence);
    };
    let plugin = failed.stage.cni_plugin().unwrap_or_default();
    let ipam = failed.detail.contains("delegated by");
    let pool = f
        .network_near(failed.end_ns, pool_full)
        .and_then(|n| n.ipam.as_ref())
        .filter(|_| ipam);
    let said_exhausted = error_msg(failed).is_some_and(|m| m.contains(IPAM_EXHAUSTED));
    let full = pool.is_some_and(|p| p.sets.iter().any(|s| s.full()));
    if let Some(pool) = pool {
        let ids: Vec<&str> = attempts.iter().map(|s| s.as_str()).collect();
        evidence.extend(network::pool_evidence(pool, &ids, &f.owners));
        if said_exhausted && !full {
            evidence.push(
                "the pool as last looked at, before it filled: the next look (once a second) shows who holds it"
                    .into(),
            );
        }
    }
    if said_exhausted || full {
        {
            return Some(finding(
                Cause::IpamExhausted,
                failed.stage.clone(),
                with_words(
                    format!(
                        "IPAM exhaustion: {plugin} has no free IP address in its range{}",
                        match pool.map_or(0, |p| p.leaked) {
                            0 => String::new(),
                            n => format!(" ({n} held by sandboxes that no longer exist)"),
                        }
                    ),
                    failed,
                ),
                evidence,
            ));
        }
    }
    let summary = if ipam {
        format!("the IPAM plugin {plugin} failed")
    } else {
        format!("CNI plugin {plugin} {} during ADD", exit_text(failed))
    };
    Some(finding(
        Cause::CniPluginFailed,
        failed.stage.clone(),
        with_words(summary, failed),
        evidence,
    ))
}

/// The kubelet's own words for its last failed RunPodSandbox, from its client span
/// (`kubelet_call:RunPodSandbox`): the runtime's error as the kubelet got it, which is
/// the failing plugin's message wrapped by the runtime.
fn kubelet_sandbox_error(p: &PodFacts<'_>) -> Option<String> {
    let call = p
        .stages(StageKind::KubeletCall)
        .filter(|s| !s.ok && s.stage.name() == Some("RunPodSandbox"))
        .max_by_key(|s| s.start_ns)?;
    Some(format!("{} {}", p.at(call.start_ns), call.detail))
}

/// A look whose pool has a range set used up.
fn pool_full(n: &crate::trace::NodeNetworkRecord) -> bool {
    n.ipam
        .as_ref()
        .is_some_and(|p| p.sets.iter().any(|s| s.full()))
}

/// A summary with the plugin's own message, when it printed one.
fn with_words(summary: String, s: &Stage) -> String {
    match error_msg(s) {
        Some(m) if !m.is_empty() => format!("{summary}; it said: {m}"),
        _ => summary,
    }
}

/// The last attempt's plugins all exited 0 and the runtime tore its network down again
/// (a CNI DEL followed) without the sandbox ever being ready: the network named a plugin
/// that is not there (the chain stopped before it), or the chain gave no address.
fn chain_without_failure(
    p: &PodFacts<'_>,
    f: &Facts<'_>,
    last: &str,
    chain: &[&Stage],
    mut evidence: Vec<String>,
) -> Option<Finding> {
    let exited_ok = chain.iter().all(|s| s.ok && s.exit_code == Some(0));
    if !exited_ok || !f.deleted_after_add(last) {
        // Under way, or the recording ended during it.
        return None;
    }
    let end = chain.iter().map(|s| s.end_ns).max().unwrap_or(0);
    let node = f.network_near(end, |n| !n.missing_plugins.is_empty());
    let ran = |plugin: &str| chain.iter().any(|s| s.stage.cni_plugin() == Some(plugin));
    if let Some(n) = node {
        let missing: Vec<&String> = n.missing_plugins.iter().filter(|m| !ran(m)).collect();
        if let Some(plugin) = missing.first() {
            evidence.push(chain_text(p, chain, plugin));
            evidence.push(format!(
                "sandbox {}: the runtime ran CNI DEL after the ADD, so the attempt failed",
                short(last)
            ));
            evidence.extend(network::missing_evidence(n));
            return Some(finding(
                Cause::CniPluginMissing,
                StageName::of(StageKind::CniPlugin, plugin.as_str()),
                format!(
                    "CNI plugin {plugin} is not installed: network {} names it and no plugin directory has it [{}]",
                    network::network_of(n),
                    n.bin_dirs.join(" ")
                ),
                evidence,
            ));
        }
    }
    // Only loopback (the runtime's own network) ran: nothing says why the rest did not.
    let network_ran = chain
        .iter()
        .any(|s| s.stage.cni_plugin() != Some("loopback"));
    // The pause process started: what failed came after the network.
    let paused = p
        .timeline
        .stages
        .iter()
        .any(|s| s.stage.is(&StageKind::PauseExec) && s.sandbox_id.as_deref() == Some(last));
    if !network_ran || paused {
        return None;
    }
    // What the runtime got: the last plugin of the chain prints the chain's result.
    let final_reply = chain
        .iter()
        .rfind(|s| !s.detail.contains("delegated by") && s.stage.cni_plugin() != Some("loopback"));
    if let Some(s) = final_reply {
        match &s.reply {
            Some(CniReply::Result { ips, interfaces }) if ips.is_empty() => evidence.push(format!(
                "{} {}'s result, the chain's last and what the runtime got, has no address (interfaces: {})",
                p.at(s.end_ns),
                s.stage.cni_plugin().unwrap_or_default(),
                interfaces.join(", ")
            )),
            // An address came back: what failed was not the result.
            Some(CniReply::Result { .. }) => return None,
            Some(r) => evidence.push(format!(
                "{}'s result: {}",
                s.stage.cni_plugin().unwrap_or_default(),
                r.summary()
            )),
            None => {}
        }
    }
    evidence.push(format!(
        "sandbox {}: every plugin exited 0, then the runtime ran CNI DEL and the sandbox never became ready",
        short(last)
    ));
    if let Some(n) = node {
        evidence.push(format!(
            "the runtime uses network {}",
            network::network_of(n)
        ));
    }
    Some(finding(
        Cause::CniNoAddress,
        StageKind::CniAdd,
        "every CNI plugin succeeded, but the sandbox never became ready: the result gave the pod's interface no address".into(),
        evidence,
    ))
}

/// An image whose last pull failed, for a container never created since.
fn image_pull_failed(p: &PodFacts<'_>) -> Option<Finding> {
    let failed: Vec<&Stage> = p.stages(StageKind::ImagePull).filter(|s| !s.ok).collect();
    let last = *failed.last()?;
    let container = last.container.clone().unwrap_or_default();
    let created_since = p
        .stages(StageKind::ContainerCreate)
        .any(|s| s.ok && s.container.as_deref() == Some(&container) && s.start_ns > last.end_ns);
    if created_since {
        return None;
    }
    let mut evidence = vec![format!(
        "{} PullImage failed ({} failed pull{}): {}: {}",
        p.at(last.start_ns),
        failed.len(),
        if failed.len() == 1 { "" } else { "s" },
        last.code.map_or("?", |c| c.as_str()),
        last.detail
    )];
    let backoffs: Vec<_> = p
        .events_named("BackOff")
        .filter(|e| {
            e.event.container.as_deref() == Some(&container)
                || e.event.message.contains("pulling image")
        })
        .collect();
    if let Some(b) = backoffs.last() {
        evidence.push(format!(
            "{} event BackOff ({} time{}): {}",
            p.at(b.at_ns),
            backoffs.len(),
            if backoffs.len() == 1 { "" } else { "s" },
            b.event.message
        ));
    }
    Some(finding(
        Cause::ImagePullFailed,
        last.stage.clone(),
        format!("the image of container {container} cannot be pulled"),
        evidence,
    ))
}

/// A container that keeps exiting after it starts and is restarted with back-off.
fn crash_loop(p: &PodFacts<'_>, f: &Facts<'_>) -> Option<Finding> {
    let backoffs: Vec<_> = p
        .events_named("BackOff")
        .filter(|e| e.event.message.contains(RESTARTING_FAILED))
        .collect();
    let mut by_starts: Vec<(String, usize)> = Vec::new();
    for c in p.calls_named(CriMethod::StartContainer).filter(|c| c.ok()) {
        match by_starts.iter_mut().find(|(n, _)| *n == c.container) {
            Some((_, k)) => *k += 1,
            None => by_starts.push((c.container.clone(), 1)),
        }
    }
    let container = backoffs
        .iter()
        .find_map(|e| e.event.container.clone())
        .or_else(|| {
            backoffs.first().and_then(|e| {
                by_starts
                    .iter()
                    .find(|(n, _)| e.event.message.contains(&format!("container={n} ")))
                    .map(|(n, _)| n.clone())
            })
        })?;
    let starts = by_starts
        .iter()
        .find(|(n, _)| *n == container)
        .map_or(0, |(_, k)| *k);
    let mut evidence = vec![format!(
        "StartContainer succeeded {starts} time{}",
        if starts == 1 { "" } else { "s" }
    )];
    // The container's main process, as the kernel saw it end.
    let ends: Vec<(u64, Option<i32>, Option<i32>)> = p
        .stages(StageKind::AppFirstExec)
        .filter(|s| s.container.as_deref() == Some(&container))
        .filter_map(|s| f.exit_of(s.pid?, s.start_ns))
        .collect();
    if !ends.is_empty() {
        let text: Vec<String> = ends
            .iter()
            .map(|(t, code, signal)| match (code, signal) {
                (_, Some(sig)) => format!("{} signal {sig}", p.at(*t)),
                (Some(c), None) => format!("{} exit {c}", p.at(*t)),
                (None, None) => format!("{} exit", p.at(*t)),
            })
            .collect();
        evidence.push(format!(
            "the kernel saw its process end: {}",
            text.join(", ")
        ));
    }
    let exited = p
        .calls_named(CriMethod::ContainerStatus)
        .filter(|c| {
            c.container == container && c.response.container_state() == Some(ContainerState::Exited)
        })
        .last();
    let mut code = ends.last().and_then(|(_, c, _)| *c).map(|c| c.to_string());
    if let Some(c) = exited {
        code = c.response.exit_code().map(|c| c.to_string()).or(code);
        evidence.push(format!(
            "{} runtime: exited with code {}{}",
            p.at(c.end_ns),
            code.as_deref().unwrap_or("?"),
            c.response
                .reason()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ));
    }
    if let Some(b) = backoffs.last() {
        evidence.push(format!(
            "{} event BackOff ({} time{}): {}",
            p.at(b.at_ns),
            backoffs.len(),
            if backoffs.len() == 1 { "" } else { "s" },
            b.event.message
        ));
    }
    Some(finding(
        Cause::CrashLoop,
        StageName::of(StageKind::ContainerStart, &container),
        format!(
            "crash loop: container {container} exits after it starts{} and is restarted with back-off",
            code.map(|c| format!(" (exit code {c})"))
                .unwrap_or_default()
        ),
        evidence,
    ))
}

/// Three or more sandboxes created, and the pod's IP changed between them.
fn sandbox_recreated(p: &PodFacts<'_>) -> Option<Finding> {
    let created: Vec<&CriCall> = p
        .calls_named(CriMethod::RunPodSandbox)
        .filter(|c| c.ok())
        .collect();
    if created.len() < 3 {
        return None;
    }
    let ips: Vec<(&Stage, &str)> = p
        .stages(StageKind::SandboxReady)
        .filter_map(|s| s.detail.strip_prefix("ip ").map(|ip| (s, ip)))
        .collect();
    let mut distinct: Vec<&str> = ips.iter().map(|(_, ip)| *ip).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 2 {
        return None;
    }
    let evidence = ips
        .iter()
        .map(|(s, ip)| {
            format!(
                "{} sandbox {} ready with IP {ip}",
                p.at(s.start_ns),
                short(s.sandbox_id.as_deref().unwrap_or("?"))
            )
        })
        .collect();
    Some(finding(
        Cause::SandboxRecreated,
        StageKind::SandboxRequested,
        format!(
            "the sandbox was created {} times and the pod's IP changed {} times",
            created.len(),
            distinct.len() - 1
        ),
        evidence,
    ))
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// A sandbox whose CNI ADD ran, that went away (stopped, removed, or failed to come
/// up), with no CNI DEL after the ADD: the IP it was given is never released.
fn leaked_ip(p: &PodFacts<'_>, f: &Facts<'_>) -> Option<Finding> {
    if !f.kernel {
        return None;
    }
    let mut evidence = Vec::new();
    let mut leaked = Vec::new();
    for id in &p.timeline.sandbox_ids {
        let Some(runs) = f.cni.get(id.as_str()) else {
            continue;
        };
        let Some(add) = runs.iter().rfind(|r| r.command == "ADD") else {
            continue;
        };
        let deleted = runs
            .iter()
            .any(|r| r.command == "DEL" && r.at_ns >= add.at_ns);
        if deleted {
            continue;
        }
        let gone = gone_at(p, id, add);
        let Some((t, how)) = gone else {
            continue;
        };
        let ip = p
            .stages(StageKind::SandboxReady)
            .find(|s| s.sandbox_id.as_deref() == Some(id.as_str()))
            .and_then(|s| s.detail.strip_prefix("ip "))
            .map(|ip| format!(" (IP {ip})"))
            .unwrap_or_default();
        let plugins: Vec<&str> = runs
            .iter()
            .filter(|r| r.command == "ADD")
            .map(|r| r.plugin.as_str())
            .collect();
        evidence.push(format!(
            "{} CNI ADD for sandbox {}{ip}: {}; {} {how}; no CNI DEL for it was seen",
            p.at(add.at_ns),
            short(id),
            plugins.join(", "),
            p.at(t),
        ));
        leaked.push(id.clone());
    }
    if leaked.is_empty() {
        return None;
    }
    if f.lost_events > 0 {
        evidence.push(format!(
            "the probes lost {} events in this recording: a DEL may be among them",
            f.lost_events
        ));
    }
    Some(finding(
        Cause::LeakedIp,
        StageKind::CniAdd,
        format!(
            "{} sandbox{} went away after CNI ADD without a CNI DEL: {} IP{} still allocated",
            leaked.len(),
            if leaked.len() == 1 { "" } else { "es" },
            if leaked.len() == 1 { "its" } else { "their" },
            if leaked.len() == 1 { " is" } else { "s are" },
        ),
        evidence,
    ))
}

/// When and how sandbox `id` went away after `add`, if it did while recorded.
fn gone_at(p: &PodFacts<'_>, id: &str, add: &CniRun) -> Option<(u64, &'static str)> {
    let stopped = p
        .calls
        .iter()
        .find(|c| {
            (c.method == CriMethod::StopPodSandbox || c.method == CriMethod::RemovePodSandbox)
                && c.ok()
                && c.sandbox_id == id
                && c.end_ns >= add.at_ns
        })
        .map(|c| {
            (
                c.end_ns,
                if c.method == CriMethod::StopPodSandbox {
                    "StopPodSandbox returned"
                } else {
                    "RemovePodSandbox returned"
                },
            )
        });
    // A sandbox the runtime never returned was torn down by the failed call itself.
    let failed = p
        .calls_named(CriMethod::RunPodSandbox)
        .find(|c| !c.ok() && c.start_ns <= add.at_ns && add.at_ns <= c.end_ns)
        .map(|c| (c.end_ns, "RunPodSandbox failed and returned"));
    stopped.or(failed)
}
