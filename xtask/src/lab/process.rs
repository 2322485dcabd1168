//! Running helper programs, starting detached daemons, and finding and stopping processes
//! through `/proc`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::Duration;

use super::error::LabError;
use crate::poll::Poll;
use crate::text::last_lines;

/// Directories searched besides `$PATH`: sudo and cron often drop the sbin ones, where
/// iptables, ip and runc live.
const EXTRA_BIN_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// `$PATH` for the daemons: the CNI bridge plugin looks `iptables` up on it, and the shims
/// look up `runc`.
pub(crate) fn daemon_path_env() -> String {
    let mut dirs: Vec<String> = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect();
    for d in EXTRA_BIN_DIRS {
        if !dirs.iter().any(|x| x == d) {
            dirs.push((*d).to_owned());
        }
    }
    dirs.join(":")
}

/// The full path of `program`, looked up like a shell would (plus the sbin directories).
pub fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_executable(&p).then_some(p);
    }
    daemon_path_env()
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub(crate) fn require_program(part: &str, program: &str) -> Result<PathBuf, LabError> {
    find_program(program).ok_or_else(|| LabError::MissingProgram {
        part: part.to_owned(),
        program: program.to_owned(),
        searched: if program.contains('/') {
            program.to_owned()
        } else {
            daemon_path_env()
        },
    })
}

pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion (killing it after `timeout`) and returns its output whatever its
/// exit status.
pub(crate) fn exec(
    part: &str,
    mut cmd: Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output, LabError> {
    let command = describe(&cmd);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| LabError::Spawn {
        part: part.to_owned(),
        command: command.clone(),
        source,
    })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A child that exits early closes the pipe; its exit status then tells the story.
        let _ = pipe.write_all(input);
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(source)) => Err(LabError::Spawn {
            part: part.to_owned(),
            command,
            source,
        }),
        Err(_) => {
            signal(pid, libc::SIGKILL);
            // The waiting thread reaps it; give it a moment so no zombie outlives this call.
            let _ = rx.recv_timeout(Duration::from_secs(2));
            Err(LabError::CommandTimedOut {
                part: part.to_owned(),
                command,
                timeout,
            })
        }
    }
}

/// Like [`exec`], but a non-zero exit is an error carrying the program's stderr.
pub(crate) fn exec_ok(
    part: &str,
    cmd: Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output, LabError> {
    let command = describe(&cmd);
    let output = exec(part, cmd, stdin, timeout)?;
    if output.status.success() {
        Ok(output)
    } else {
        let mut stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        if stderr.is_empty() {
            stderr = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        }
        Err(LabError::CommandFailed {
            part: part.to_owned(),
            command,
            status: output.status.to_string(),
            stderr,
        })
    }
}

/// Starts a daemon in a session of its own, stdin closed, stdout and stderr appended to
/// `log`, so that it survives the process that started it (and that process's terminal).
pub(crate) fn spawn_daemon<I, S>(
    part: &str,
    program: &Path,
    args: I,
    cwd: &Path,
    log: &Path,
    env: &[(&str, String)],
) -> Result<u32, LabError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let log_file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| LabError::io(part, "open log", log, e))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| LabError::io(part, "open log", log, e))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env("PATH", daemon_path_env())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err);
    // SAFETY: setsid and close_range are async-signal-safe system calls and touch no
    // memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            // A daemon outlives whoever started it: it keeps none of the caller's
            // descriptors but its stdio (a caller's lock file held open by the lab's
            // daemons would stay locked until `down`). Marked close-on-exec rather than
            // closed, so the pipe that reports a failed exec still works; a kernel
            // before 5.11 refuses the flag, and the daemon then inherits as before.
            const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC);
            Ok(())
        });
    }
    let command = describe(&cmd);
    let child = cmd.spawn().map_err(|source| LabError::Spawn {
        part: part.to_owned(),
        command,
        source,
    })?;
    let pid = child.id();
    // Kept so that `is_alive` can reap it should it die while this process still runs (a
    // test that calls `up` and `down`); once this process exits, init adopts it.
    SPAWNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(child);
    Ok(pid)
}

/// Daemons this process started and has not yet reaped.
static SPAWNED: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// Reaps whichever of this process's daemons have exited. Only those: waiting on arbitrary
/// pids could steal the exit status of a child some caller is waiting for.
fn reap_spawned() {
    let mut spawned = SPAWNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    spawned.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
}

/// The last `lines` lines of a log file (at most the last 16 KiB of it).
/// What a daemon's log gained after byte `start` (the log's length before the daemon was
/// spawned), read lossily; empty when the log cannot be read.
pub(crate) fn log_since(path: &Path, start: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    // A log shorter than before was replaced; all of it is this start's.
    let from = if len < start { 0 } else { start };
    if f.seek(SeekFrom::Start(from)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return "(no log)".to_owned();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let tail = last_lines(&text, lines);
    if tail.is_empty() {
        "(log is empty)".to_owned()
    } else {
        tail.join("\n")
    }
}

/// Sends `sig` to `pid`; returns whether `kill` succeeded.
pub fn signal(pid: u32, sig: i32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Whether `pid` is a running process. Zombies count as dead: they hold no mounts,
/// namespaces or files, only a pid until their parent (often init, which on this VM reaps a
/// second or two later) collects them. Daemons this process started are reaped first.
pub fn is_alive(pid: u32) -> bool {
    reap_spawned();
    match proc_stat(pid) {
        Some(stat) => !matches!(stat.state, 'Z' | 'X' | 'x'),
        None => false,
    }
}

pub(crate) struct ProcStat {
    pub comm: String,
    pub state: char,
    pub ppid: u32,
}

pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses `/proc/<pid>/stat`; the command name is parenthesised and may itself contain
/// spaces and parentheses, so the fields after it are found from the last `)`.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(ProcStat { comm, state, ppid })
}

/// The command line with arguments joined by spaces (empty for kernel threads and zombies).
pub fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            let s = String::from_utf8_lossy(&raw).replace('\0', " ");
            s.trim_end().to_owned()
        })
        .unwrap_or_default()
}

pub(crate) fn cwd(pid: u32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/cwd")).ok()
}

/// The cgroup paths of a process, one per hierarchy.
pub(crate) fn cgroups(pid: u32) -> Vec<String> {
    fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| {
            t.lines()
                .filter_map(|l| l.splitn(3, ':').nth(2).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Every pid in `/proc`, ascending.
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// This process and its ancestors: never to be signalled, whatever their command lines say.
pub(crate) fn self_and_ancestors() -> BTreeSet<u32> {
    let mut set = BTreeSet::new();
    let mut pid = std::process::id();
    while pid > 1 && set.insert(pid) {
        match proc_stat(pid) {
            Some(s) => pid = s.ppid,
            None => break,
        }
    }
    set
}

/// Every live descendant of `roots` (not the roots themselves).
pub(crate) fn descendants(roots: &BTreeSet<u32>) -> BTreeSet<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for pid in all_pids() {
        if let Some(s) = proc_stat(pid) {
            children.entry(s.ppid).or_default().push(pid);
        }
    }
    let mut out = BTreeSet::new();
    let mut stack: Vec<u32> = roots.iter().copied().collect();
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if out.insert(c) {
                stack.push(c);
            }
        }
    }
    out
}

/// Waits until none of `pids` is alive, up to `timeout`; returns those still alive.
pub(crate) fn wait_gone(pids: &BTreeSet<u32>, timeout: Duration) -> BTreeSet<u32> {
    let mut alive = BTreeSet::new();
    Poll::new("the processes to exit", timeout, Duration::from_millis(25)).holds(|| {
        alive = pids.iter().copied().filter(|&p| is_alive(p)).collect();
        alive.is_empty()
    });
    alive
}

/// SIGTERM, then SIGKILL for whatever is still alive after `grace`. Returns the pids that
/// survived even SIGKILL.
pub(crate) fn terminate(pids: &BTreeSet<u32>, grace: Duration) -> BTreeSet<u32> {
    for &p in pids {
        signal(p, libc::SIGTERM);
    }
    let left = wait_gone(pids, grace);
    kill_now(&left)
}

/// SIGKILL and wait (briefly) for the kernel to finish them off.
pub(crate) fn kill_now(pids: &BTreeSet<u32>) -> BTreeSet<u32> {
    for &p in pids {
        signal(p, libc::SIGKILL);
    }
    wait_gone(pids, Duration::from_secs(5))
}

/// A one-line description of a process for reports: `pid 42 (cmdline)`.
pub(crate) fn describe_pid(pid: u32) -> String {
    let cmd = cmdline(pid);
    if cmd.is_empty() {
        let comm = proc_stat(pid).map(|s| s.comm).unwrap_or_default();
        format!("pid {pid} [{comm}]")
    } else {
        format!("pid {pid} ({})", truncate(&cmd, 160))
    }
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

/// Which process listens on TCP `port` of 127.0.0.1 or of every address, if it can be found.
pub(crate) fn tcp_listener_holder(port: u16) -> Option<String> {
    let mut inodes = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = fs::read_to_string(table) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for pid in all_pids() {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok())
                && inodes.contains(&inode)
            {
                return Some(describe_pid(pid));
            }
        }
    }
    Some("a process this user cannot see".to_owned())
}

/// Socket inodes in a `/proc/net/tcp{,6}` table that listen on `port` on loopback or on the
/// wildcard address (either blocks binding 127.0.0.1:`port`).
fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    let blocking_addrs = [
        "0100007F",
        "00000000",
        "00000000000000000000000000000000",
        "00000000000000000000000001000000",
        "0000000000000000FFFF00000100007F",
    ];
    let want_port = format!("{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, p) = f.get(1)?.split_once(':')?;
            let state = f.get(3)?;
            let inode = f.get(9)?.parse().ok()?;
            (p == want_port && *state == LISTEN && blocking_addrs.contains(&addr)).then_some(inode)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm() {
        let s = parse_stat("123 (a (b) c) S 77 123 123 0 -1").unwrap();
        assert_eq!(s.comm, "a (b) c");
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 77);
    }

    #[test]
    fn finds_listeners_on_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1388 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1388 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000     0        0 999 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1389 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0
   3: 0A000001:1388 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listening_inodes(table, 5000), vec![4242]);
    }

    #[test]
    fn exec_reports_failure_and_timeout() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo oops >&2; exit 3"]);
        let err = exec_ok("test", c, None, Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("oops"), "{err}");

        let mut c = Command::new("sleep");
        c.arg("5");
        let err = exec("test", c, None, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, LabError::CommandTimedOut { .. }), "{err}");

        let mut c = Command::new("cat");
        c.arg("-");
        let out = exec_ok("test", c, Some(b"hello"), Duration::from_secs(5));
        assert_eq!(out.unwrap().stdout, b"hello");
    }
}
