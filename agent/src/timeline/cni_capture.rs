//! From a plugin run's `cni_output` records to its output and its reply: the chunks put
//! back in order, what was cut and why, and, when nothing was captured, why not (the
//! write hook's `cni_write_hook` records say when it was attached). Pure.

use podlapse_core::record::{CniOutput, CniWriteHook, WriteHookChange};

use super::cni_reply::{CniCapture, CniReply};

/// The most bytes put back together per run, whatever the records claim: the probes
/// copy at most `CNI_OUTPUT_MAX` (1024), so this bounds only a forged or corrupt trace.
pub const MAX_ASSEMBLED: u64 = 64 * 1024;

/// When the write hook was attached, from its records over the whole recording.
#[derive(Debug, Default)]
pub struct HookHistory {
    /// (attached at, detached at, hook), in time order; the last may be still attached.
    windows: Vec<(u64, Option<u64>, String)>,
    /// (at, why) of each refusal.
    refusals: Vec<(u64, String)>,
}

impl HookHistory {
    /// The history of `records`, in time order.
    pub fn new<'a>(records: impl IntoIterator<Item = &'a CniWriteHook>) -> HookHistory {
        let mut h = HookHistory::default();
        for r in records {
            let at = r.meta.ktime_ns;
            match r.change {
                WriteHookChange::Attached => {
                    if !h.windows.last().is_some_and(|(_, to, _)| to.is_none()) {
                        h.windows.push((at, None, r.hook.clone()));
                    }
                }
                WriteHookChange::Detached => {
                    if let Some((_, to @ None, _)) = h.windows.last_mut() {
                        *to = Some(at);
                    }
                }
                WriteHookChange::Refused => h.refusals.push((at, r.reason.clone())),
            }
        }
        h
    }

    /// Whether the recording says anything of the hook at all (a trace from before the
    /// capture does not).
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.refusals.is_empty()
    }

    /// The window attached at `at`, if any.
    fn covering(&self, at: u64) -> Option<&(u64, Option<u64>, String)> {
        self.windows
            .iter()
            .find(|(from, to, _)| *from <= at && to.is_none_or(|t| at <= t))
    }

    /// Why nothing of a run from `start` to `end` (its exit, if seen) was captured.
    fn why_not(&self, start: u64, end: Option<u64>) -> String {
        let ms = |ns: u64| format!("{:.1} ms", ns as f64 / 1e6);
        let until = end.unwrap_or(u64::MAX);
        if self.is_empty() {
            return "no write hook in this recording (the probes capture no output)".into();
        }
        if let Some((_, why)) = self
            .refusals
            .iter()
            .rev()
            .find(|(at, _)| *at <= until)
            .filter(|_| self.covering(start).is_none())
        {
            return format!("the write hook was not attached: the kernel refused it: {why}");
        }
        if self.covering(start).is_some() {
            // Attached from the start, yet nothing came: the records were lost.
            return "the write hook was attached, but no record of the output arrived (the \
                    probes lost it)"
                .into();
        }
        match self.windows.iter().find(|(from, ..)| *from > start) {
            Some((from, ..)) if *from <= until => format!(
                "the write hook was attached {} after this plugin started, after its output",
                ms(from - start)
            ),
            Some((from, ..)) => format!(
                "the write hook was attached {} after this plugin exited",
                ms(from - until)
            ),
            None => "the write hook was not attached while this plugin ran".into(),
        }
    }

    /// The hook attached at `at`, if one was.
    fn hook_at(&self, at: u64) -> String {
        self.covering(at)
            .map(|(_, _, hook)| hook.clone())
            .unwrap_or_default()
    }
}

/// The output of one plugin run, from `start` (its fork, or exec) to `end` (its exit,
/// if seen): its `chunks` (the run's `cni_output` records, any order) put back together
/// and read as a CNI reply, with how it was captured. No capture facts when nothing was
/// captured.
pub fn assemble(
    chunks: &[&CniOutput],
    start: u64,
    end: Option<u64>,
    hooks: &HookHistory,
) -> (CniReply, Option<CniCapture>) {
    let total = chunks.iter().find(|c| c.end).map(|c| c.offset);
    let mut data: Vec<(u64, Vec<u8>)> = chunks
        .iter()
        .filter(|c| !c.end && !c.unreadable && c.offset < MAX_ASSEMBLED)
        .map(|c| (c.offset, c.bytes()))
        .collect();
    if data.is_empty() && total.is_none_or(|t| t == 0) && !covered(hooks, chunks, start) {
        return (
            CniReply::NotCaptured {
                why: hooks.why_not(start, end),
            },
            None,
        );
    }
    data.sort_by_key(|(offset, _)| *offset);
    let mut out: Vec<u8> = Vec::new();
    for (offset, bytes) in &data {
        let at = out.len() as u64;
        if *offset > at {
            // A gap: what follows cannot be placed.
            break;
        }
        let skip = usize::try_from(at - offset).unwrap_or(usize::MAX);
        if let Some(rest) = bytes.get(skip..) {
            let room = usize::try_from(MAX_ASSEMBLED).unwrap_or(usize::MAX) - out.len();
            out.extend_from_slice(&rest[..rest.len().min(room)]);
        }
    }
    let seen_end = chunks
        .iter()
        .filter(|c| !c.end)
        .map(|c| c.offset.saturating_add(u64::from(c.len)))
        .max()
        .unwrap_or(0);
    let written = total.unwrap_or(seen_end).max(seen_end);
    let captured = out.len() as u64;
    let cut = written > captured;
    let first = chunks
        .iter()
        .map(|c| c.meta.ktime_ns)
        .min()
        .unwrap_or(start);
    let capture = CniCapture {
        written,
        captured,
        cut,
        hook: hooks.hook_at(first),
    };
    (CniReply::parse(&out, cut), Some(capture))
}

/// Whether the hook was attached over the whole run (so an empty total means the plugin
/// wrote nothing), or there is a total at all to go by.
fn covered(hooks: &HookHistory, chunks: &[&CniOutput], start: u64) -> bool {
    chunks.iter().any(|c| c.end) && hooks.covering(start).is_some()
}

#[cfg(test)]
#[path = "cni_capture_tests.rs"]
mod tests;
