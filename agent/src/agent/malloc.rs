//! glibc malloc settings for a long-running agent. By default glibc raises its mmap
//! threshold after the first large free, so the big buffers of parsing the kernel's BTF at
//! startup (tens of MiB, freed at once) stay in the heap, and every thread gets an arena
//! of its own that keeps what it freed. The agent's RSS then sat at its startup peak and
//! grew with each burst of pod work. Fixed thresholds hand large blocks back to the kernel
//! when freed; one arena keeps free space in one place, where trimming can return it.
//!
//! glibc also gives every thread a cache of freed small blocks (up to seven of each size)
//! that neither trimming nor another thread can touch. Measured under pod churn, those
//! caches held a few hundred KiB per runtime thread, scattered over pages that stayed
//! resident for nothing else: most of what the agent kept after its pods were gone. The
//! agent runs with them off; they are a tunable that only the environment sets, read
//! when the process starts, hence [`exec_without_thread_caches`].

/// Blocks at least this large are mmapped and returned to the kernel when freed.
const MMAP_THRESHOLD: i32 = 128 * 1024;
/// Free memory at the top of the heap beyond this is returned to the kernel.
const TRIM_THRESHOLD: i32 = 256 * 1024;
const ARENA_MAX: i32 = 1;
/// How often a long-running agent returns free heap pages: kubelet's housekeeping period.
/// A pass over a heap of tens of MiB takes well under a millisecond.
pub const TRIM_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// Applies the settings; call before the first thread starts.
pub fn tune() {
    // SAFETY: mallopt only changes allocator parameters; it is called before any other
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
    }
}

/// The glibc tunable that sizes each thread's cache of freed blocks.
const TCACHE_TUNABLE: &str = "glibc.malloc.tcache_count";

/// `GLIBC_TUNABLES` with the thread caches turned off, or `None` when `current` already
/// sets their size (the user's choice stands, and the agent is already re-executed).
fn tunables_without_thread_caches(current: Option<&str>) -> Option<String> {
    match current.filter(|c| !c.is_empty()) {
        Some(c)
            if c.split(':')
                .any(|t| t.split('=').next() == Some(TCACHE_TUNABLE)) =>
        {
            None
        }
        Some(c) => Some(format!("{c}:{TCACHE_TUNABLE}=0")),
        None => Some(format!("{TCACHE_TUNABLE}=0")),
    }
}

/// Re-executes this program, with the same arguments and the thread caches off, unless
/// the environment already sizes them. Call first thing in a long-running command,
/// before any thread starts. On success this does not return; if the exec fails the
/// agent goes on with the caches, which costs memory only.
pub fn exec_without_thread_caches() {
    use std::os::unix::process::CommandExt;
    let current = std::env::var("GLIBC_TUNABLES").ok();
    let Some(tunables) = tunables_without_thread_caches(current.as_deref()) else {
        return;
    };
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(argv0)
        .args(args)
        .env("GLIBC_TUNABLES", tunables)
        .exec();
    tracing::debug!("running with glibc's thread caches: re-executing failed: {err}");
}

/// Returns the free pages of every arena to the kernel, after a one-off burst such as
/// loading the probes.
pub fn trim() {
    // SAFETY: malloc_trim is thread-safe and only releases memory that is free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims every `period`, for as long as the agent runs. Pod work frees memory in bursts
/// (a sync's CRI answers, a removed pod's state) from pages that small allocations
/// still share, which glibc's own trimming, at the top of the heap only, cannot return.
pub async fn trim_every(period: std::time::Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        trim();
    }
}

#[cfg(test)]
mod tests {
    use super::tunables_without_thread_caches as tunables;

    #[test]
    fn thread_caches_are_turned_off_once_and_other_tunables_kept() {
        assert_eq!(
            tunables(None).as_deref(),
            Some("glibc.malloc.tcache_count=0")
        );
        assert_eq!(
            tunables(Some("")).as_deref(),
            Some("glibc.malloc.tcache_count=0")
        );
        assert_eq!(
            tunables(Some("glibc.malloc.arena_max=2")).as_deref(),
            Some("glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0")
        );
        // Already set (by the user, or by the first exec): left alone, no second exec.
        assert_eq!(tunables(Some("glibc.malloc.tcache_count=0")), None);
        assert_eq!(
            tunables(Some("glibc.malloc.arena_max=2:glibc.malloc.tcache_count=3")),
            None
        );
        // A tunable whose name merely starts the same is not the one.
        assert!(tunables(Some("glibc.malloc.tcache_count_x=1")).is_some());
    }
}
