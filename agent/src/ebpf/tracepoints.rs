//! Whether the tracepoints the programs attach to are on this kernel, looked up in
//! tracefs before a program is loaded. A tracepoint that moved (to another category) or
//! went is one line naming it, where it was looked for and where a tracepoint of its name
//! is now, rather than the bare ENOENT of the attach; a program the probes need makes the
//! node unable to run them (the agent goes on without kernel events and says why), one
//! they can do without is skipped with that line as its reason.

use std::path::{Path, PathBuf};

use super::error::EbpfError;

/// The tracefs mount the programs attach through, and the kernel's release for the line.
#[derive(Debug, Clone)]
pub(super) struct Tracefs {
    root: PathBuf,
    release: String,
}

impl Tracefs {
    pub(super) fn new(root: PathBuf, release: &str) -> Tracefs {
        Tracefs {
            root,
            release: release.trim().to_string(),
        }
    }

    /// `Ok` when `category:tracepoint` is on this kernel, else why `program` cannot attach.
    pub(super) fn check(
        &self,
        program: &'static str,
        category: &'static str,
        tracepoint: &'static str,
    ) -> Result<(), EbpfError> {
        let events = self.root.join("events");
        let looked = events.join(category).join(tracepoint);
        if looked.is_dir() {
            return Ok(());
        }
        Err(EbpfError::TracepointMissing {
            program,
            category,
            tracepoint,
            release: self.release.clone(),
            looked,
            elsewhere: category_of(&events, tracepoint),
        })
    }
}

/// The first category (in name order) that has a tracepoint named `tracepoint`.
fn category_of(events: &Path, tracepoint: &str) -> Option<String> {
    let mut categories: Vec<String> = std::fs::read_dir(events)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.path().join(tracepoint).is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    categories.sort();
    categories.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tracefs with these `category/tracepoint` directories under `events/`.
    fn tracefs(present: &[&str]) -> (tempfile::TempDir, Tracefs) {
        let dir = tempfile::tempdir().unwrap();
        for t in present {
            std::fs::create_dir_all(dir.path().join("events").join(t)).unwrap();
        }
        let t = Tracefs::new(dir.path().to_path_buf(), "7.9.0-test\n");
        (dir, t)
    }

    #[test]
    fn a_present_tracepoint_passes() {
        let (_dir, t) = tracefs(&["sched/sched_process_exec"]);
        t.check("sched_process_exec", "sched", "sched_process_exec")
            .unwrap();
    }

    #[test]
    fn a_tracepoint_that_moved_says_where_it_went_and_leaves_the_node_without_probes() {
        let (dir, t) = tracefs(&["sched/sched_process_exec", "cgroup2/cgroup_attach_task"]);
        let e = t
            .check("cgroup_attach_task", "cgroup", "cgroup_attach_task")
            .unwrap_err();
        let looked = dir.path().join("events/cgroup/cgroup_attach_task");
        assert_eq!(
            e.to_string(),
            format!(
                "kernel 7.9.0-test has no tracepoint cgroup:cgroup_attach_task (no {}), which \
                 program cgroup_attach_task attaches to; a tracepoint of that name is under \
                 cgroup2:, whose fields the program was not built for",
                looked.display()
            )
        );
        // The node cannot run the probes: the agent goes on without kernel events.
        assert!(e.is_unavailable());
    }

    #[test]
    fn a_tracepoint_that_went_is_named_without_a_guess() {
        let (_dir, t) = tracefs(&["syscalls/sys_enter_clone"]);
        let e = t
            .check("sys_enter_clone3", "syscalls", "sys_enter_clone3")
            .unwrap_err();
        let line = e.to_string();
        assert!(
            line.starts_with("kernel 7.9.0-test has no tracepoint syscalls:sys_enter_clone3"),
            "{line}"
        );
        assert!(!line.contains("under"), "{line}");
    }
}
