//! Whether the kernel counts its BPF programs' run time: [`ProgramStats`]' counters are
//! zero unless it does, and a zero must not read as "the programs cost nothing".
//!
//! The kernel counts while `kernel.bpf_stats_enabled` is 1 or while some process holds a
//! `BPF_ENABLE_STATS` descriptor; the sysctl shows only its own setting, so counters that
//! moved are the other evidence. A kernel without the sysctl (before 5.1) counts nothing.
//!
//! [`ProgramStats`]: super::ProgramStats

use std::path::Path;

/// Where the kernel shows its setting.
pub const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// What the kernel said about its BPF statistics over a run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BpfStatsState {
    /// The counters moved: the kernel counted (by the sysctl or a `BPF_ENABLE_STATS`
    /// holder).
    Counted,
    /// Nothing counted: the run times and counts are zeros, not measurements.
    NotCounted { why: String },
}

impl BpfStatsState {
    /// From the sysctl's text (`None`: no such file) and whether any program's counters
    /// moved.
    pub fn judge(sysctl: Option<&str>, counters_moved: bool) -> BpfStatsState {
        if counters_moved {
            return BpfStatsState::Counted;
        }
        let why = match sysctl.map(str::trim) {
            None => format!(
                "this kernel has no BPF statistics ({SYSCTL} is missing; it came in 5.1): \
                 the programs' run times and counts are not known"
            ),
            Some("0") => format!(
                "the kernel's BPF statistics are off ({SYSCTL} is 0 and no process holds \
                 BPF_ENABLE_STATS): set it to 1 for the programs' run times and counts"
            ),
            Some(v) => format!(
                "{SYSCTL} is {v:?}, yet no program's counters moved: the programs did not run"
            ),
        };
        BpfStatsState::NotCounted { why }
    }

    /// Reads the sysctl at `path`.
    pub fn read(path: &Path, counters_moved: bool) -> BpfStatsState {
        let text = std::fs::read_to_string(path).ok();
        BpfStatsState::judge(text.as_deref(), counters_moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_that_moved_were_counted_whatever_the_sysctl_says() {
        // A BPF_ENABLE_STATS holder counts with the sysctl at 0.
        assert_eq!(
            BpfStatsState::judge(Some("0\n"), true),
            BpfStatsState::Counted
        );
        assert_eq!(BpfStatsState::judge(None, true), BpfStatsState::Counted);
    }

    #[test]
    fn zero_counters_say_why_they_are_zero() {
        let why = |s: BpfStatsState| match s {
            BpfStatsState::NotCounted { why } => why,
            BpfStatsState::Counted => panic!("counted"),
        };
        let off = why(BpfStatsState::judge(Some("0\n"), false));
        assert!(off.contains("off") && off.contains(SYSCTL), "{off}");
        let absent = why(BpfStatsState::judge(None, false));
        assert!(absent.contains("no BPF statistics"), "{absent}");
        let idle = why(BpfStatsState::judge(Some("1\n"), false));
        assert!(idle.contains("did not run"), "{idle}");
    }

    #[test]
    fn a_missing_sysctl_file_reads_as_a_kernel_without_statistics() {
        let dir = std::env::temp_dir().join(format!("podlapse-bpf-stats-{}", std::process::id()));
        let state = BpfStatsState::read(&dir.join("bpf_stats_enabled"), false);
        assert!(matches!(state, BpfStatsState::NotCounted { why } if why.contains("5.1")));
    }
}
