//! The lab's private containerd: its config, start-up, and removing its workloads through
//! `ctr` before it is stopped.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::error::LabError;
use super::paths::LabPaths;
use super::process::{self, exec, exec_ok};
use super::{IMAGE_PAUSE, REGISTRY_ADDR};
use crate::poll::Poll;

const PART: &str = "containerd";
pub(crate) const PROGRAM: &str = "containerd";
/// Names another containerd binary to run (a runtime developer's own build, or the
/// system's 1.x), instead of the pinned containerd 2.x the lab unpacks.
pub const PROGRAM_ENV: &str = "PODLAPSE_LAB_CONTAINERD";

/// The containerd the lab runs, and the programs that come with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    pub containerd: PathBuf,
    /// The `ctr` of the same build (its API matches the daemon's).
    pub ctr: PathBuf,
    /// Searched first on the daemon's `$PATH`, so containerd starts its own build's shim.
    pub bin_dir: PathBuf,
    /// What `containerd --version` said, e.g. `2.1.9+unknown`.
    pub version: String,
    pub major: u32,
    pub runc: PathBuf,
}

/// The containerd binary the lab runs: `$PODLAPSE_LAB_CONTAINERD`, else the pinned
/// containerd 2.x unpacked under the lab root (present once `up` unpacked it).
pub fn program(paths: &LabPaths) -> PathBuf {
    match std::env::var(PROGRAM_ENV) {
        Ok(p) if !p.is_empty() => process::find_program(&p).unwrap_or_else(|| PathBuf::from(p)),
        _ => paths.runtime_bin_dir().join(PROGRAM),
    }
}

/// The `ctr` beside the lab's containerd, else the one on `$PATH`.
pub fn ctr_program(paths: &LabPaths) -> Option<PathBuf> {
    let beside = program(paths).with_file_name("ctr");
    if beside.is_file() {
        return Some(beside);
    }
    process::find_program("ctr")
}

/// Before anything starts: the containerd the lab will run can be had. The pinned
/// containerd 2.x is downloaded into the package cache (outside the lab root) if needed.
pub(crate) fn preflight(progress: &dyn Fn(&str)) -> Result<(), LabError> {
    match std::env::var(PROGRAM_ENV) {
        Ok(p) if !p.is_empty() => process::require_program(PART, &p).map(drop),
        _ => crate::debs::fetch(&[crate::debs::CONTAINERD], progress)
            .map(drop)
            .map_err(|source| LabError::RuntimePackages { source }),
    }
}

/// Unpacks the pinned containerd 2.x into the lab root (from the package cache, which
/// [`preflight`] filled), unless `$PODLAPSE_LAB_CONTAINERD` names another or it is unpacked
/// already, and says which containerd the lab runs.
pub(crate) fn prepare(paths: &LabPaths, progress: &dyn Fn(&str)) -> Result<Runtime, LabError> {
    let own = std::env::var(PROGRAM_ENV).is_ok_and(|p| !p.is_empty());
    if !own && !paths.runtime_bin_dir().join(PROGRAM).is_file() {
        let debs = crate::debs::fetch(&[crate::debs::CONTAINERD], progress)
            .map_err(|source| LabError::RuntimePackages { source })?;
        crate::debs::unpack(&debs[0], &paths.runtime_dir())
            .map_err(|source| LabError::RuntimePackages { source })?;
    }
    let containerd = process::require_program(PART, &program(paths).to_string_lossy())?;
    let ctr = match ctr_program(paths) {
        Some(c) => c,
        None => process::require_program(PART, "ctr")?,
    };
    let runc = process::require_program(PART, "runc")?;
    let mut cmd = Command::new(&containerd);
    cmd.arg("--version");
    let out = exec_ok(PART, cmd, None, Duration::from_secs(10))?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let (version, major) = parse_version(&said).ok_or_else(|| LabError::CommandFailed {
        part: PART.to_owned(),
        command: format!("{} --version", containerd.display()),
        status: "0".into(),
        stderr: format!(
            "unrecognised version {:?}; set {PROGRAM_ENV} to a containerd 1.6 or later",
            said.trim()
        ),
    })?;
    let bin_dir = containerd
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    Ok(Runtime {
        containerd,
        ctr,
        bin_dir,
        version,
        major,
        runc,
    })
}

/// The version of the containerd the lab runs (or would run), and its major number; None
/// when it is not unpacked yet or does not say.
pub fn version(paths: &LabPaths) -> Option<(String, u32)> {
    let out = Command::new(program(paths))
        .arg("--version")
        .output()
        .ok()?;
    parse_version(&String::from_utf8_lossy(&out.stdout))
}

/// `containerd github.com/containerd/containerd/v2 2.1.9+unknown` -> ("2.1.9+unknown", 2);
/// 1.x builds say `containerd github.com/containerd/containerd 1.6.20~ds1 ...`.
pub(crate) fn parse_version(said: &str) -> Option<(String, u32)> {
    let version = said.split_whitespace().nth(2)?.trim_start_matches('v');
    let major = version.split('.').next()?.parse().ok()?;
    Some((version.to_owned(), major))
}

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

/// The containerd config for the lab, in the format of the runtime's major version:
/// version 3 (2.x's plugin ids) for containerd 2, version 2 for containerd 1.x.
pub(crate) fn config_toml(paths: &LabPaths, runtime: &Runtime) -> String {
    if runtime.major >= 2 {
        config_v3(paths, &runtime.runc)
    } else {
        config_v2(paths, &runtime.runc)
    }
}

/// The part of the config both versions share: where containerd keeps everything (all
/// under the lab root, so this instance shares nothing with a system containerd).
fn config_head(version: u32, paths: &LabPaths, disabled: &[&str]) -> String {
    let disabled: Vec<String> = disabled.iter().map(q).collect();
    format!(
        r#"version = {version}
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
"#,
        root = p(&paths.containerd_root()),
        state = p(&paths.containerd_state()),
        temp = p(&paths.containerd_tmp()),
        disabled = disabled.join(", "),
        grpc = p(&paths.cri_socket()),
        ttrpc = p(&paths.containerd_ttrpc_socket()),
    )
}

/// containerd 2.x's config (version 3): the CRI plugin is split into
/// `io.containerd.cri.v1.images` (pinned sandbox image, registry hosts) and
/// `io.containerd.cri.v1.runtime` (runtimes, CNI with `bin_dirs`), and the gRPC-facing
/// `io.containerd.grpc.v1.cri` keeps only the streaming server.
fn config_v3(paths: &LabPaths, runc: &Path) -> String {
    let images = r#"plugins."io.containerd.cri.v1.images""#;
    let runtime = r#"plugins."io.containerd.cri.v1.runtime""#;
    let mut disabled = DISABLED_PLUGINS.to_vec();
    // NRI would serve a socket in /var/run/nri, outside the lab root; the lab has no use
    // for it.
    disabled.push("io.containerd.nri.v1.nri");
    format!(
        r#"{head}
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {opt}

  [{images}]
    snapshotter = "overlayfs"

    [{images}.pinned_images]
      sandbox = {sandbox}

    [{images}.registry]
      config_path = {certs}

  [plugins."io.containerd.transfer.v1.local"]
    config_path = {certs}

  [{runtime}]
    # The VM withholds CAP_SYS_RESOURCE: the sandbox's oom_score_adj of -998 would fail.
    restrict_oom_score_adj = true
    # Pod network namespaces under the lab's state dir instead of /var/run/netns.
    netns_mounts_under_state_dir = true
    enable_selinux = false
    enable_cdi = false

    [{runtime}.containerd]
      default_runtime_name = "runc"

      [{runtime}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

        [{runtime}.containerd.runtimes.runc.options]
          BinaryName = {runc}
          Root = {runc_root}
          SystemdCgroup = false

    [{runtime}.cni]
      bin_dirs = [{cni_bin}]
      conf_dir = {cni_conf}
      max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    # "0": any free port, so two labs or a system containerd never clash.
    stream_server_port = "0"
    disable_tcp_service = true
"#,
        head = config_head(3, paths, &disabled),
        opt = p(&paths.containerd_opt()),
        sandbox = q(IMAGE_PAUSE),
        runc = p(runc),
        runc_root = p(&paths.runc_root()),
        cni_bin = q(CNI_BIN_DIR),
        cni_conf = p(&paths.cni_conf_dir()),
        certs = p(&paths.certs_dir()),
    )
}

/// containerd 1.x's config (version 2), for a lab run on `$PODLAPSE_LAB_CONTAINERD`.
fn config_v2(paths: &LabPaths, runc: &Path) -> String {
    let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
    format!(
        r#"{head}
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
        head = config_head(2, paths, DISABLED_PLUGINS),
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
/// The daemon's environment: its own build's directory first on `$PATH` (containerd looks
/// its shim up there), and, for a containerd that traces (2.x), OTLP export of its spans
/// to [`super::RUNTIME_OTLP_ADDR`], where podlapse's runtime-span receiver or a test's
/// collector listens. Only spans under a sampled parent are exported.
fn daemon_env(runtime: &Runtime) -> Vec<(&'static str, String)> {
    let mut env = vec![(
        "PATH",
        format!(
            "{}:{}",
            runtime.bin_dir.display(),
            process::daemon_path_env()
        ),
    )];
    if runtime.major >= 2 {
        env.extend([
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://{}", super::RUNTIME_OTLP_ADDR),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_owned()),
            ("OTEL_EXPORTER_OTLP_INSECURE", "true".to_owned()),
            ("OTEL_SERVICE_NAME", "containerd".to_owned()),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_off".to_owned()),
        ]);
    }
    env
}

pub(crate) fn start(paths: &LabPaths, progress: &dyn Fn(&str)) -> Result<u32, LabError> {
    let runtime = prepare(paths, progress)?;
    progress(&format!(
        "containerd {} ({})",
        runtime.version,
        runtime.containerd.display()
    ));
    let ctr = runtime.ctr.clone();
    for dir in [paths.containerd_dir(), paths.containerd_tmp()] {
        fs::create_dir_all(&dir).map_err(|e| LabError::io(PART, "create", &dir, e))?;
    }
    let hosts = paths.registry_hosts_toml();
    if let Some(dir) = hosts.parent() {
        fs::create_dir_all(dir).map_err(|e| LabError::io(PART, "create", dir, e))?;
    }
    fs::write(&hosts, hosts_toml()).map_err(|e| LabError::io(PART, "write", &hosts, e))?;
    let config = paths.containerd_config();
    fs::write(&config, config_toml(paths, &runtime))
        .map_err(|e| LabError::io(PART, "write", &config, e))?;

    let log = paths.containerd_log();
    // The log is appended to across restarts; only what this start writes says whether it
    // loaded the CNI config.
    let log_start = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let pid = process::spawn_daemon(
        PART,
        &runtime.containerd,
        [std::ffi::OsStr::new("--config"), config.as_os_str()],
        &paths.containerd_dir(),
        &log,
        &daemon_env(&runtime),
    )?;

    let started = Instant::now();
    let sock = paths.cri_socket();
    let mut last = String::from("socket not created yet");
    let ready = Poll::new(
        "containerd's CRI plugin",
        READY_TIMEOUT,
        Duration::from_millis(50),
    )
    .since(started)
    .within(|| {
        if !process::is_alive(pid) {
            return Err(LabError::DaemonExited {
                part: PART.to_owned(),
                log_tail: process::log_tail(&log, 20),
                log: log.clone(),
            });
        }
        if sock.exists() {
            match cri_plugin_status(&ctr, &sock) {
                Ok(status) if status == "ok" => return Ok(Some(())),
                // A plugin that failed to load stays failed; waiting longer cannot help.
                Ok(status) if status == "error" => {
                    let text = process::log_since(&log, log_start);
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
        Ok(None)
    })?;
    if ready.is_none() {
        return Err(not_ready(last, started, &log));
    }

    // The CRI plugin loads even without a usable CNI config and only says so in its log;
    // pods would then fail much later with a less helpful error.
    let text = process::log_since(&log, log_start);
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
    let Some(ctr) = ctr_program(paths) else {
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
    let Some(ctr) = ctr_program(paths) else {
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

    fn runtime(major: u32) -> Runtime {
        Runtime {
            containerd: "/lab/runtime/usr/bin/containerd".into(),
            ctr: "/lab/runtime/usr/bin/ctr".into(),
            bin_dir: "/lab/runtime/usr/bin".into(),
            version: format!("{major}.0.0"),
            major,
            runc: "/usr/sbin/runc".into(),
        }
    }

    const UNDER_ROOT: &[&str] = &[
        "root = \"/var/lib/podlapse-lab/containerd/root\"\n",
        "state = \"/var/lib/podlapse-lab/containerd/state\"\n",
        "address = \"/var/lib/podlapse-lab/containerd/containerd.sock\"\n",
        "address = \"/var/lib/podlapse-lab/containerd/containerd.sock.ttrpc\"\n",
        "path = \"/var/lib/podlapse-lab/containerd/opt\"\n",
        "restrict_oom_score_adj = true\n",
        "stream_server_port = \"0\"\n",
        "netns_mounts_under_state_dir = true\n",
        "runtime_type = \"io.containerd.runc.v2\"\n",
        "BinaryName = \"/usr/sbin/runc\"\n",
        "Root = \"/var/lib/podlapse-lab/containerd/runc\"\n",
        "conf_dir = \"/var/lib/podlapse-lab/cni/net.d\"\n",
        "config_path = \"/var/lib/podlapse-lab/certs.d\"\n",
    ];

    #[test]
    fn containerd_1_gets_a_version_2_config_with_everything_under_root() {
        let paths = LabPaths::new("/var/lib/podlapse-lab");
        let c = config_toml(&paths, &runtime(1));
        for needle in UNDER_ROOT.iter().chain(&[
            "version = 2\n",
            "sandbox_image = \"127.0.0.1:5000/podlapse/pause:3.10\"\n",
            "bin_dir = \"/usr/lib/cni\"\n",
        ]) {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
        assert!(c.contains(r#"[plugins."io.containerd.grpc.v1.cri".cni]"#));
        assert!(
            c.contains(r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]"#)
        );
    }

    #[test]
    fn containerd_2_gets_a_version_3_config_with_its_plugin_ids() {
        let paths = LabPaths::new("/var/lib/podlapse-lab");
        let c = config_toml(&paths, &runtime(2));
        for needle in UNDER_ROOT.iter().chain(&[
            "version = 3\n",
            "sandbox = \"127.0.0.1:5000/podlapse/pause:3.10\"\n",
            "bin_dirs = [\"/usr/lib/cni\"]\n",
            "\"io.containerd.nri.v1.nri\"",
        ]) {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
        for table in [
            r#"[plugins."io.containerd.cri.v1.images".pinned_images]"#,
            r#"[plugins."io.containerd.cri.v1.images".registry]"#,
            r#"[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]"#,
            r#"[plugins."io.containerd.cri.v1.runtime".cni]"#,
        ] {
            assert!(c.contains(table), "missing {table} in\n{c}");
        }
        // 2.x refuses a config that sets both, and warns on the 1.x keys.
        assert!(!c.contains("bin_dir ="), "{c}");
        assert!(!c.contains("sandbox_image"), "{c}");
    }

    #[test]
    fn versions_of_both_module_paths_are_read() {
        assert_eq!(
            parse_version("containerd github.com/containerd/containerd/v2 2.1.9+unknown \n"),
            Some(("2.1.9+unknown".to_owned(), 2))
        );
        assert_eq!(
            parse_version("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1"),
            Some(("1.6.20~ds1".to_owned(), 1))
        );
        assert_eq!(parse_version("containerd"), None);
        assert_eq!(parse_version("containerd x y.z"), None);
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
abc123       127.0.0.1:5000/podlapse/pause:3.10    io.containerd.runc.v2
def456       127.0.0.1:5000/podlapse/app:1.0       io.containerd.runc.v2
";
        assert_eq!(
            parse_ids(containers),
            vec![
                ("abc123".to_owned(), IMAGE_PAUSE.to_owned()),
                (
                    "def456".to_owned(),
                    "127.0.0.1:5000/podlapse/app:1.0".to_owned()
                )
            ]
        );
        assert!(parse_ids("TASK    PID    STATUS\n").is_empty());
    }
}
