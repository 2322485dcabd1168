//! `podlapse cri info`: who the runtime is and whether it is ready.

use std::process::ExitCode;

use super::{CriArgs, EXIT_BAD_INPUT};
use crate::cm::CgroupLayout;
use crate::cri::{CNI_CONF_SOURCE, NodeShape, RuntimeService};

/// The conditions kubelet requires of a runtime (its runtime-state check); any other a
/// runtime adds, such as containerd 2.x's `ContainerdHasNoDeprecationWarnings`, is shown
/// but decides nothing.
const REQUIRED_CONDITIONS: [&str; 2] = ["RuntimeReady", "NetworkReady"];

pub async fn run(args: &CriArgs) -> ExitCode {
    let client = match args.connect().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let result = async {
        let version = client.version().await?;
        let status = client.status(false).await?;
        Ok::<_, crate::cri::CriError>((version, status))
    }
    .await;
    let (version, status) = match result {
        Ok(v) => v,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ep = client.endpoint();
    println!("endpoint:       {} ({})", ep.path.display(), ep.source);
    println!(
        "runtime:        {} {}",
        version.runtime_name, version.runtime_version
    );
    println!("CRI API:        {}", version.runtime_api_version);
    match NodeShape::detect(&client, None, false).await {
        Ok(shape) => {
            match shape.cgroup_driver {
                Some((driver, source)) => println!("cgroup driver:  {driver} (from {source})"),
                None => println!("cgroup driver:  not said by the runtime (pass --cgroup-driver)"),
            }
            match shape.cni_bin_source {
                Some(source) => println!(
                    "CNI plugins:    {} (from {source})",
                    shape.cni_bin_dirs.join(", ")
                ),
                None => println!("CNI plugins:    not said by the runtime (pass --cni-bin-dir)"),
            }
            match &shape.cni_conf_dir {
                Some(dir) => println!("CNI config:     {dir} (from {CNI_CONF_SOURCE})"),
                None => println!("CNI config:     not said by the runtime"),
            }
        }
        Err(e) => println!("node shape:     unknown: {e}"),
    }
    match CgroupLayout::discover() {
        Ok(layout) if layout.is_unified() => println!("cgroups:        v2 (unified)"),
        Ok(_) => println!("cgroups:        v1"),
        Err(e) => println!("cgroups:        {e}"),
    }
    // What the probes will try first; `kernel-events` says what attached.
    match crate::ebpf::kprobes_present() {
        Ok(()) => {
            println!("netns probes:   kprobes on the kernel functions (the kernel has kprobes)")
        }
        Err(why) => println!("netns probes:   syscall tracepoints ({why})"),
    }
    println!("conditions:");
    let mut all_ready = true;
    for c in status.status.map(|s| s.conditions).unwrap_or_default() {
        let required = REQUIRED_CONDITIONS.contains(&c.r#type.as_str());
        all_ready &= c.status || !required;
        let mut line = format!("  {:<15} {}", c.r#type, c.status);
        if !required {
            line.push_str("  (informational)");
        }
        if !c.reason.is_empty() {
            line.push_str(&format!("  reason={}", c.reason));
        }
        if !c.message.is_empty() {
            line.push_str(&format!("  message={:?}", c.message));
        }
        println!("{line}");
    }
    if all_ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
