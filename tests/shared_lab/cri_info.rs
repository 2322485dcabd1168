//! `podlapse cri info` against the real lab runtime, and against endpoints that are not
//! one.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;

use podlapse_tests::{podlapse, podlapse_with_env, require_lab, stderr, stdout};
use xtask::lab::IMAGE_APP;

#[test]
fn lab_runtime_is_ready_with_network() {
    let lab = require_lab();
    let out = podlapse(&["cri", "info"]);
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "exit {}: {text}{}",
        out.status,
        stderr(&out)
    );
    assert!(text.contains("runtime:        containerd"), "{text}");
    assert!(text.contains("CRI API:        v1"), "{text}");
    assert!(text.contains("RuntimeReady    true"), "{text}");
    assert!(text.contains("NetworkReady    true"), "{text}");
    // With no flag and no env, the lab's socket is chosen and named.
    assert!(
        text.contains(&lab.cri_socket().display().to_string()),
        "{text}"
    );
    assert!(text.contains("(node lab)"), "{text}");
    // The node's shape comes from the runtime: the lab's runc runs with SystemdCgroup =
    // false, its CNI plugins are Debian's and its configuration is the lab's. The lab's
    // reference runtime is containerd 2.x, which answers RuntimeConfig and lists its
    // plugin directories as `binDirs`; a 1.x put under the lab with
    // PODLAPSE_LAB_CONTAINERD says them in its status info instead.
    let two = text.contains("runtime:        containerd 2.");
    let one = text.contains("runtime:        containerd 1.");
    assert!(
        two || (one && std::env::var_os(xtask::lab::CONTAINERD_ENV).is_some()),
        "the lab runs containerd 2.x unless told otherwise: {text}"
    );
    let (driver, cni) = if two {
        ("CRI RuntimeConfig", "cni.binDirs")
    } else {
        ("runtime status info (SystemdCgroup)", "cni.binDir")
    };
    assert!(
        text.contains(&format!("cgroup driver:  cgroupfs (from {driver})")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "CNI plugins:    /usr/lib/cni (from runtime status info {cni})"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "CNI config:     {} (from runtime status info cni.confDir)",
            lab.root.join("cni/net.d").display()
        )),
        "{text}"
    );
    if two {
        // 2.x's extra condition is shown, and decides nothing.
        assert!(
            text.contains("ContainerdHasNoDeprecationWarnings") && text.contains("(informational)"),
            "{text}"
        );
    }
    assert!(text.contains("cgroups:        v1"), "{text}");
    // What the probes will try first follows the kernel (this host's is built without
    // kprobes).
    let expected = if podlapse::ebpf::kprobes_present().is_ok() {
        "netns probes:   kprobes on the kernel functions"
    } else {
        "netns probes:   syscall tracepoints (this kernel has no kprobes"
    };
    assert!(text.contains(expected), "{text}");
}

/// The one line of error output, checked to be one line.
fn one_line_error(out: &std::process::Output) -> String {
    let err = stderr(out);
    let lines: Vec<_> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got:\n{err}");
    lines[0].to_string()
}

#[test]
fn missing_socket_fails_with_exit_2_naming_it() {
    let out = podlapse(&[
        "cri",
        "info",
        "--cri",
        "unix:///nonexistent/podlapse-test.sock",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let line = one_line_error(&out);
    assert!(
        line.contains("unix:///nonexistent/podlapse-test.sock"),
        "{line}"
    );
    assert!(line.contains("no socket"), "{line}");
}

#[test]
fn env_endpoint_is_used_when_no_flag() {
    let out = podlapse_with_env(
        &["cri", "info"],
        &[("PODLAPSE_CRI", "/nonexistent/from-env.sock")],
    );
    assert_eq!(out.status.code(), Some(2));
    let line = one_line_error(&out);
    assert!(line.contains("/nonexistent/from-env.sock"), "{line}");
}

#[test]
fn a_socket_that_is_not_cri_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("http.sock");
    let listener = UnixListener::bind(&path).unwrap();
    // A peer that answers every connection like an HTTP/1 server, then hangs up.
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let sock = path.display().to_string();
    let out = podlapse(&["cri", "info", "--cri", &sock]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let line = one_line_error(&out);
    assert!(line.contains(&sock), "{line}");
    assert!(line.contains("not a CRI v1 runtime"), "{line}");
}

#[test]
fn a_regular_file_is_not_a_socket() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().display().to_string();
    let out = podlapse(&["cri", "info", "--cri", &path]);
    assert_eq!(out.status.code(), Some(2));
    let line = one_line_error(&out);
    assert!(line.contains("is not a unix socket"), "{line}");
}

/// A containerd of the test's own whose default runtime is not runc: nothing says the
/// cgroup driver (containerd 1.6 has no RuntimeConfig; the status info names no
/// SystemdCgroup). It is the system's containerd 1.6 that setup installs: containerd 2.x
/// always answers RuntimeConfig, from the host's cgroups when no runtime names a driver,
/// so only a 1.x runtime can leave the driver unsaid. Stopped and its files removed when
/// dropped.
struct OtherRuntime {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl OtherRuntime {
    fn start() -> OtherRuntime {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let config = d.join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{opt}"
  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "gvisor"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gvisor]
        runtime_type = "io.containerd.runsc.v1"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{cni}"
"#,
                root = d.join("root").display(),
                state = d.join("state").display(),
                sock = d.join("c.sock").display(),
                opt = d.join("opt").display(),
                cni = d.join("net.d").display(),
            ),
        )
        .unwrap();
        // A network, so the runtime reports itself ready.
        std::fs::create_dir_all(d.join("net.d")).unwrap();
        std::fs::write(
            d.join("net.d/10-lo.conflist"),
            r#"{"cniVersion": "1.0.0", "name": "lo-only", "plugins": [{"type": "loopback"}]}"#,
        )
        .unwrap();
        let program = "/usr/bin/containerd";
        let child = std::process::Command::new(program)
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(d.join("containerd.log")).unwrap())
            .spawn()
            .expect("containerd");
        let sock = d.join("c.sock");
        // Waits for containerd to answer CRI; the bound is for a containerd that never
        // does, not a guess of how soon it will.
        podlapse_tests::eventually(
            "the second containerd to answer CRI",
            std::time::Duration::from_secs(120),
            std::time::Duration::from_millis(100),
            || {
                if !sock.exists() {
                    return Err(format!("no socket at {}", sock.display()));
                }
                let out = podlapse(&["cri", "info", "--cri", sock.to_str().unwrap()]);
                if out.status.success() {
                    Ok(())
                } else {
                    Err(stderr(&out))
                }
            },
        );
        OtherRuntime { child, dir }
    }

    fn socket(&self) -> String {
        self.dir.path().join("c.sock").display().to_string()
    }
}

impl Drop for OtherRuntime {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

#[test]
fn a_cgroup_driver_nobody_names_is_exit_2_naming_what_the_runtime_said() {
    let runtime = OtherRuntime::start();
    let sock = runtime.socket();
    let info = podlapse(&["cri", "info", "--cri", &sock]);
    assert!(info.status.success(), "{}", stderr(&info));
    assert!(
        stdout(&info).contains("cgroup driver:  not said by the runtime (pass --cgroup-driver)"),
        "{}",
        stdout(&info)
    );
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("pod.yaml");
    std::fs::write(
        &manifest,
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: no-driver}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}}}\n"),
    )
    .unwrap();
    let root = dir.path().join("root");
    let out = podlapse(&[
        "run",
        "--until-ready",
        "--cri",
        &sock,
        "--root-dir",
        root.to_str().unwrap(),
        "--manifests",
        manifest.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let line = one_line_error(&out);
    assert!(
        line.contains("cannot tell the cgroup driver")
            && line.contains("RuntimeConfig with Unimplemented")
            && line.contains("names no runc runtime as the default")
            && line.contains("--cgroup-driver"),
        "{line}"
    );
    assert!(!root.join("pods").exists(), "nothing created");
}
