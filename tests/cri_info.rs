//! `podtrace cri info` against the real lab runtime, and against endpoints that are not
//! one.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;

use podtrace_tests::{podtrace, podtrace_with_env, require_lab, stderr, stdout};

#[test]
fn lab_runtime_is_ready_with_network() {
    let lab = require_lab();
    let out = podtrace(&["cri", "info"]);
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
    // false, its CNI plugins are Debian's and its configuration is the lab's.
    assert!(
        text.contains("cgroup driver:  cgroupfs (from runtime status info (SystemdCgroup))"),
        "{text}"
    );
    assert!(text.contains("CNI plugins:    /usr/lib/cni"), "{text}");
    assert!(
        text.contains(&format!(
            "CNI config:     {}",
            lab.root.join("cni/net.d").display()
        )),
        "{text}"
    );
    assert!(text.contains("cgroups:        v1"), "{text}");
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
    let out = podtrace(&[
        "cri",
        "info",
        "--cri",
        "unix:///nonexistent/podtrace-test.sock",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let line = one_line_error(&out);
    assert!(
        line.contains("unix:///nonexistent/podtrace-test.sock"),
        "{line}"
    );
    assert!(line.contains("no socket"), "{line}");
}

#[test]
fn env_endpoint_is_used_when_no_flag() {
    let out = podtrace_with_env(
        &["cri", "info"],
        &[("PODTRACE_CRI", "/nonexistent/from-env.sock")],
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
    let out = podtrace(&["cri", "info", "--cri", &sock]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let line = one_line_error(&out);
    assert!(line.contains(&sock), "{line}");
    assert!(line.contains("not a CRI v1 runtime"), "{line}");
}

#[test]
fn a_regular_file_is_not_a_socket() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().display().to_string();
    let out = podtrace(&["cri", "info", "--cri", &path]);
    assert_eq!(out.status.code(), Some(2));
    let line = one_line_error(&out);
    assert!(line.contains("is not a unix socket"), "{line}");
}
