//! glibc malloc settings for a long-running agent. By default glibc raises its mmap
//! threshold after the first large free, so the big buffers of parsing the kernel's BTF at
//! startup (tens of MiB, freed at once) stay in the heap, and every thread gets an arena
//! of its own that keeps what it freed. The agent's RSS then sat at its startup peak and
//! grew with each burst of pod work. Fixed thresholds hand large blocks back to the kernel
//! when freed; one arena keeps free space in one place, where trimming can return it.

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
