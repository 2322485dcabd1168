//! The lab's private containerd: its config, start-up, and removing its workloads through
//! `ctr` before it is stopped.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::error::LabError;
use super::paths::LabPaths;
use super::process::{self, exec, exec_ok};
use super::{IMAGE_PAUSE, REGISTRY_ADDR};

const PART: &str = "containerd";
pub(crate) const PROGRAM: &str = "containerd";
/// Names another containerd binary to run, so runtime developers can put their own build
/// under podtrace.
pub const PROGRAM_ENV: &str = "PODTRACE_LAB_CONTAINERD";

/// The containerd binary the lab runs: `$PODTRACE_LAB_CONTAINERD`, else `containerd`.
pub(crate) fn program() -> String {
    std::env::var(PROGRAM_ENV)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| PROGRAM.to_owned())
}
pub(crate) const SHIM: &str = "containerd-shim-runc-v2";
pub(crate) const CRI_NAMESPACE: &str = "k8s.io";
/// The CRI plugin's directory name under containerd's root and state.
pub(crate) const CRI_PLUGIN: &str = "io.containerd.grpc.v1.cri";
pub(crate) const CNI_BIN_DIR: &str = "/usr/lib/cni";
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const CTR_TIMEOUT: Duration = Duration::from_secs(15);
/// `sun_path` is 108 bytes including the terminating NUL.
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// Snapshotters that can only log that they cannot run here. (The deprecated v1 runtime
/// must stay: the tasks service, and with it the CRI plugin, fail to load without it.)
const DISABLED_PLUGINS: &[&str] = &[
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
];

/// A TOML basic string.
fn q(s: impl AsRef<str>) -> String {
    let mut out = String::from("\"");
    for c in s.as_ref().chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\u{:04X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn p(path: &Path) -> String {
    q(path.to_string_lossy())
}

/// containerd config (version 2). Every path containerd or its shims write is under the
/// lab root, so this instance shares nothing with a system containerd.
pub(crate) fn config_toml(paths: &LabPaths, runc: &Path) -> String {
    let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
    let disabled: Vec<String> = DISABLED_PLUGINS.iter().map(q).collect();
    format!(
        r#"version = 2
root = {root}
state = {state}
temp = {temp}
oom_score = 0
disabled_plugins = [{disabled}]

[grpc]
  address = {grpc}

[ttrpc]
  address = {ttrpc}

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {opt}

  [plugins."io.containerd.runtime.v1.linux"]
    runtime_root = {runc_v1_root}

  [{cri}]
    sandbox_image = {sandbox}
    # The VM withholds CAP_SYS_RESOURCE: the sandbox's oom_score_adj of -998 would fail.
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    # "0": any free port, so two labs or a system containerd never clash.
    stream_server_port = "0"
    disable_tcp_service = true
    # Pod network namespaces under the lab's state dir instead of /var/run/netns.
    netns_mounts_under_state_dir = true
    enable_selinux = false

    [{cri}.containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"

      [{cri}.containerd.runtimes.runc]
        # Required once options are given, or every sandbox fails with
        # "container.Runtime.Name must be set".
        runtime_type = "io.containerd.runc.v2"

        [{cri}.containerd.runtimes.runc.options]
          BinaryName = {runc}
          Root = {runc_root}
          SystemdCgroup = false

    [{cri}.cni]
      bin_dir = {cni_bin}
      conf_dir = {cni_conf}
      max_conf_num = 1

    [{cri}.registry]
      config_path = {certs}
"#,
        root = p(&paths.containerd_root()),
        state = p(&paths.containerd_state()),
        temp = p(&paths.containerd_tmp()),
        disabled = disabled.join(", "),
        grpc = p(&paths.cri_socket()),
        ttrpc = p(&paths.containerd_ttrpc_socket()),
        opt = p(&paths.containerd_opt()),
        sandbox = q(IMAGE_PAUSE),
        runc = p(runc),
        runc_root = p(&paths.runc_root()),
        runc_v1_root = p(&paths.runc_root().join("v1")),
        cni_bin = q(CNI_BIN_DIR),
        cni_conf = p(&paths.cni_conf_dir()),
        certs = p(&paths.certs_dir()),
    )
}

/// `certs.d/127.0.0.1:5000/hosts.toml`: the local registry speaks plain HTTP. containerd
/// 1.6 rejects a hosts file without a `[host]` table ("invalid `host` tree") and falls back
/// to its defaults, so the registry is listed as a host as well as the server.
pub fn hosts_toml() -> String {
    let url = q(format!("http://{REGISTRY_ADDR}"));
    format!("server = {url}\n\n[host.{url}]\n  capabilities = [\"pull\", \"resolve\"]\n")
}

/// Fails if something already serves the CRI socket path, or the path cannot be a socket.
pub(crate) fn check_socket_free(paths: &LabPaths) -> Result<(), LabError> {
    for sock in [paths.cri_socket(), paths.containerd_ttrpc_socket()] {
        let len = sock.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(LabError::SocketPathTooLong {
                part: PART.to_owned(),
                path: sock,
                len,
                max: MAX_SOCKET_PATH,
            });
        }
    }
    let sock = paths.cri_socket();
    if UnixStream::connect(&sock).is_ok() {
        return Err(LabError::SocketInUse { path: sock });
    }
    Ok(())
}

/// Writes the config and the registry hosts file, starts containerd detached and waits until
/// it answers with its CRI plugin loaded. The CNI conflist must already be in place.
pub(crate) fn start(paths: &LabPaths) -> Result<u32, LabError> {
    let program = process::require_program(PART, &program())?;
    let runc = process::require_program(PART, "runc")?;
    let ctr = process::require_program(PART, "ctr")?;
    for dir in [paths.containerd_dir(), paths.containerd_tmp()] {
        fs::create_dir_all(&dir).map_err(|e| LabError::io(PART, "create", &dir, e))?;
    }
    let hosts = paths.registry_hosts_toml();
    if let Some(dir) = hosts.parent() {
        fs::create_dir_all(dir).map_err(|e| LabError::io(PART, "create", dir, e))?;
    }
    fs::write(&hosts, hosts_toml()).map_err(|e| LabError::io(PART, "write", &hosts, e))?;
    let config = paths.containerd_config();
    fs::write(&config, config_toml(paths, &runc))
        .map_err(|e| LabError::io(PART, "write", &config, e))?;

    let log = paths.containerd_log();
    let pid = process::spawn_daemon(
        PART,
        &program,
        [std::ffi::OsStr::new("--config"), config.as_os_str()],
        &paths.containerd_dir(),
        &log,
    )?;

    let started = Instant::now();
    let sock = paths.cri_socket();
    let mut last = String::from("socket not created yet");
    loop {
        if !process::is_alive(pid) {
            return Err(LabError::DaemonExited {
                part: PART.to_owned(),
                log_tail: process::log_tail(&log, 20),
                log,
            });
        }
        if sock.exists() {
            match cri_plugin_status(&ctr, &sock) {
                Ok(status) if status == "ok" => break,
                // A plugin that failed to load stays failed; waiting longer cannot help.
                Ok(status) if status == "error" => {
                    let text = fs::read_to_string(&log).unwrap_or_default();
                    let why = text
                        .lines()
                        .rev()
                        .find(|l| l.contains("failed to load plugin io.containerd.grpc.v1.cri"))
                        .unwrap_or("see the log");
                    return Err(not_ready(
                        format!("the CRI plugin failed to load: {why}"),
                        started,
                        &log,
                    ));
                }
                Ok(status) => last = format!("CRI plugin status is {status:?}"),
                Err(e) => last = e.to_string(),
            }
        }
        if started.elapsed() >= READY_TIMEOUT {
            return Err(not_ready(last, started, &log));
        }
        thread::sleep(Duration::from_millis(50));
    }

    // The CRI plugin loads even without a usable CNI config and only says so in its log;
    // pods would then fail much later with a less helpful error.
    let text = fs::read_to_string(&log).unwrap_or_default();
    if let Some(line) = text.lines().find(|l| l.contains("failed to load cni")) {
        return Err(not_ready(
            format!("CNI config not loaded: {line}"),
            started,
            &log,
        ));
    }
    Ok(pid)
}

fn not_ready(what: String, started: Instant, log: &Path) -> LabError {
    LabError::NotReady {
        part: PART.to_owned(),
        what,
        waited: started.elapsed(),
        log: log.to_owned(),
        log_tail: process::log_tail(log, 20),
    }
}

fn ctr_cmd(ctr: &Path, sock: &Path) -> Command {
    let mut cmd = Command::new(ctr);
    cmd.arg("--address")
        .arg(sock)
        .args(["--namespace", CRI_NAMESPACE]);
    cmd
}

/// The STATUS column of the CRI plugin in `ctr plugins ls`.
fn cri_plugin_status(ctr: &Path, sock: &Path) -> Result<String, LabError> {
    let mut cmd = ctr_cmd(ctr, sock);
    cmd.args(["plugins", "ls"]);
    let out = exec_ok(PART, cmd, None, Duration::from_secs(5))?;
    Ok(parse_plugin_status(
        &String::from_utf8_lossy(&out.stdout),
        "io.containerd.grpc.v1",
        "cri",
    )
    .unwrap_or_else(|| "missing".to_owned()))
}

/// Finds `TYPE ID PLATFORMS STATUS` for one plugin in `ctr plugins ls` output.
pub(crate) fn parse_plugin_status(text: &str, ty: &str, id: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 3 && f[0] == ty && f[1] == id).then(|| f[f.len() - 1].to_owned())
    })
}

/// Whether containerd answers on the lab socket right now.
pub(crate) fn responsive(paths: &LabPaths) -> bool {
    let sock = paths.cri_socket();
    let Some(ctr) = process::find_program("ctr") else {
        return false;
    };
    if UnixStream::connect(&sock).is_err() {
        return false;
    }
    let mut cmd = ctr_cmd(&ctr, &sock);
    cmd.arg("version");
    exec(PART, cmd, None, Duration::from_secs(5)).is_ok_and(|o| o.status.success())
}

/// First-column ids of a `ctr ... ls` table, skipping its header.
pub(crate) fn parse_ids(text: &str) -> Vec<(String, String)> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let id = f.next()?.to_owned();
            let second = f.next().unwrap_or("").to_owned();
            Some((id, second))
        })
        .collect()
}

/// Stops and deletes every task and container in the CRI namespace through containerd, so
/// the shims exit on their own and take their rootfs mounts and sockets with them.
/// Returns `(removed, problems)`; anything missed here is swept up after containerd stops.
pub(crate) fn remove_workloads(paths: &LabPaths) -> (Vec<String>, Vec<String>) {
    let mut removed = Vec::new();
    let mut problems = Vec::new();
    let Some(ctr) = process::find_program("ctr") else {
        return (removed, problems);
    };
    if !responsive(paths) {
        return (removed, problems);
    }
    let sock = paths.cri_socket();
    let run = |args: &[&str]| {
        let mut cmd = ctr_cmd(&ctr, &sock);
        cmd.args(args);
        exec(PART, cmd, None, CTR_TIMEOUT)
    };
    let tasks = match run(&["tasks", "ls"]) {
        Ok(o) if o.status.success() => parse_ids(&String::from_utf8_lossy(&o.stdout)),
        _ => Vec::new(),
    };
    for (id, _) in &tasks {
        let _ = run(&["tasks", "kill", "--all", "--signal", "SIGKILL", id]);
    }
    for (id, _) in &tasks {
        match run(&["tasks", "delete", "--force", id]) {
            Ok(o) if o.status.success() => {}
            // The CRI plugin deletes a task itself as soon as it sees it exit.
            Ok(o) if String::from_utf8_lossy(&o.stderr).contains("not found") => {}
            Ok(o) => problems.push(format!(
                "ctr tasks delete {id}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => problems.push(e.to_string()),
        }
    }
    let containers = match run(&["containers", "ls"]) {
        Ok(o) if o.status.success() => parse_ids(&String::from_utf8_lossy(&o.stdout)),
        _ => Vec::new(),
    };
    for (id, image) in &containers {
        let sandboxes = paths.containerd_root().join(CRI_PLUGIN).join("sandboxes");
        let kind = if sandboxes.join(id).is_dir() {
            "sandbox"
        } else {
            "container"
        };
        match run(&["containers", "delete", id]) {
            Ok(o) if o.status.success() => removed.push(format!("{kind} {id} ({image})")),
            Ok(o) if String::from_utf8_lossy(&o.stderr).contains("not found") => {}
            Ok(o) => problems.push(format!(
                "ctr containers delete {id}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => problems.push(e.to_string()),
        }
    }
    (removed, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_points_everything_under_root() {
        let paths = LabPaths::new("/var/lib/podtrace-lab");
        let c = config_toml(&paths, Path::new("/usr/sbin/runc"));
        for needle in [
            "version = 2\n",
            "root = \"/var/lib/podtrace-lab/containerd/root\"\n",
            "state = \"/var/lib/podtrace-lab/containerd/state\"\n",
            "address = \"/var/lib/podtrace-lab/containerd/containerd.sock\"\n",
            "address = \"/var/lib/podtrace-lab/containerd/containerd.sock.ttrpc\"\n",
            "path = \"/var/lib/podtrace-lab/containerd/opt\"\n",
            "sandbox_image = \"127.0.0.1:5000/podtrace/pause:3.10\"\n",
            "restrict_oom_score_adj = true\n",
            "stream_server_port = \"0\"\n",
            "netns_mounts_under_state_dir = true\n",
            "runtime_type = \"io.containerd.runc.v2\"\n",
            "Root = \"/var/lib/podtrace-lab/containerd/runc\"\n",
            "bin_dir = \"/usr/lib/cni\"\n",
            "conf_dir = \"/var/lib/podtrace-lab/cni/net.d\"\n",
            "config_path = \"/var/lib/podtrace-lab/certs.d\"\n",
        ] {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
        assert!(c.contains(r#"[plugins."io.containerd.grpc.v1.cri".cni]"#));
        assert!(
            c.contains(r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]"#)
        );
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(q(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(q("x\ny"), r#""x\ny""#);
    }

    #[test]
    fn hosts_file_uses_plain_http() {
        assert_eq!(
            hosts_toml(),
            "server = \"http://127.0.0.1:5000\"\n\n\
             [host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
    }

    #[test]
    fn parses_ctr_tables() {
        let plugins =
            "TYPE                            ID                       PLATFORMS      STATUS
io.containerd.content.v1        content                  -              ok
io.containerd.grpc.v1           cri                      linux/amd64    ok
io.containerd.snapshotter.v1    btrfs                    linux/amd64    skip
";
        assert_eq!(
            parse_plugin_status(plugins, "io.containerd.grpc.v1", "cri").as_deref(),
            Some("ok")
        );
        assert_eq!(
            parse_plugin_status(plugins, "io.containerd.grpc.v1", "nope"),
            None
        );
        let containers = "CONTAINER    IMAGE                                 RUNTIME
abc123       127.0.0.1:5000/podtrace/pause:3.10    io.containerd.runc.v2
def456       127.0.0.1:5000/podtrace/app:1.0       io.containerd.runc.v2
";
        assert_eq!(
            parse_ids(containers),
            vec![
                ("abc123".to_owned(), IMAGE_PAUSE.to_owned()),
                (
                    "def456".to_owned(),
                    "127.0.0.1:5000/podtrace/app:1.0".to_owned()
                )
            ]
        );
        assert!(parse_ids("TASK    PID    STATUS\n").is_empty());
    }
}
