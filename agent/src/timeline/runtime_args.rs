//! What a container runtime program's arguments say: which program (the containerd shim,
//! runc or crun), what it was asked to do, and for which sandbox or container.
//!
//! containerd starts a shim per sandbox (`containerd-shim-runc-v2 -namespace k8s.io
//! -address ... -id <id> start`, which starts the long-lived shim and exits), and the
//! shim runs `runc [global flags] create --bundle ... <id>`, then `runc start <id>`.
//! `runc create` starts `runc init` (no ID in its arguments: it is known by its parent).

use super::ids::is_runtime_id;

/// Which runtime program ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// A containerd shim (`containerd-shim-runc-v2`, ...).
    Shim,
    /// runc or crun: the OCI runtime the shim runs.
    Oci,
}

/// A runtime program's run, from its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeRun<'a> {
    pub program: Program,
    /// `start`, `delete` for a shim (empty for the long-lived shim itself); `create`,
    /// `start`, `init`, `delete`, ... for runc.
    pub command: &'a str,
    /// The sandbox or container ID it works on, when its arguments name one.
    pub id: Option<&'a str>,
}

/// runc's and crun's global flags that take a value as the next argument.
const OCI_VALUE_FLAGS: &[&str] = &["--root", "--log", "--log-format", "--criu", "--rootless"];

/// runc's and crun's subcommands.
const OCI_COMMANDS: &[&str] = &[
    "checkpoint",
    "create",
    "delete",
    "events",
    "exec",
    "features",
    "init",
    "kill",
    "list",
    "pause",
    "ps",
    "restore",
    "resume",
    "run",
    "spec",
    "start",
    "state",
    "update",
];

/// Parses `argv` (as the kernel probe read it; `head_cut` when its start is missing).
/// `None` when it is not a runtime program podlapse knows.
pub fn parse(argv: &[String], head_cut: bool) -> Option<RuntimeRun<'_>> {
    let program = if head_cut {
        // The program's name is gone: runc's arguments carry a subcommand word, a
        // shim's carry `-id`.
        if argv.iter().any(|a| a == "-id") {
            Program::Shim
        } else {
            Program::Oci
        }
    } else {
        let name = argv.first()?.rsplit('/').next().unwrap_or_default();
        if name.starts_with("containerd-shim") {
            Program::Shim
        } else if matches!(name, "runc" | "crun") || is_runc_copy(name) {
            Program::Oci
        } else {
            return None;
        }
    };
    let rest = argv.get(usize::from(!head_cut)..).unwrap_or_default();
    Some(match program {
        Program::Shim => shim(rest),
        Program::Oci => oci(rest)?,
    })
}

/// The shortest argument list that parses as `argv` does: the program, then for a shim
/// `-id <id>` and its command, for runc its command and ID. What the live agent keeps of a
/// runtime program's exec (runc's bundle and log paths are most of its bytes); `None`
/// when `argv` is not a runtime run, which is then kept whole.
pub fn compact(argv: &[String], head_cut: bool) -> Option<Vec<String>> {
    let run = parse(argv, head_cut)?;
    let program = match (run.program, head_cut) {
        (Program::Shim, true) => "containerd-shim".to_string(),
        (Program::Oci, true) => "runc".to_string(),
        (_, false) => argv.first()?.clone(),
    };
    let mut out = vec![program];
    match run.program {
        Program::Shim => {
            if let Some(id) = run.id {
                out.extend(["-id".to_string(), id.to_string()]);
            }
            if !run.command.is_empty() {
                out.push(run.command.to_string());
            }
        }
        Program::Oci => {
            out.push(run.command.to_string());
            out.extend(run.id.map(str::to_string));
        }
    }
    Some(out)
}

/// runc re-executes itself from a sealed copy (`/proc/self/fd/N`, a memfd) with its
/// `argv[0]` kept, but some versions pass the copy's path.
fn is_runc_copy(name: &str) -> bool {
    name.starts_with("runc")
}

fn shim(args: &[String]) -> RuntimeRun<'_> {
    let id = args
        .iter()
        .position(|a| a == "-id" || a == "--id")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .filter(|id| is_runtime_id(id));
    let command = args
        .last()
        .map(String::as_str)
        .filter(|c| matches!(*c, "start" | "delete"))
        .unwrap_or("");
    RuntimeRun {
        program: Program::Shim,
        command,
        id,
    }
}

fn oci(args: &[String]) -> Option<RuntimeRun<'_>> {
    let mut i = 0;
    let command = loop {
        let a = args.get(i)?.as_str();
        if OCI_VALUE_FLAGS.contains(&a) {
            i += 2;
            continue;
        }
        if OCI_COMMANDS.contains(&a) {
            break a;
        }
        i += 1;
    };
    let id = args[i + 1..]
        .iter()
        .map(String::as_str)
        .find(|a| is_runtime_id(a));
    Some(RuntimeRun {
        program: Program::Oci,
        command,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "419c0950aa09f5fa62a7e0ecfcc4eb0628914f02addc40fb7dadcf1fa23f790b";

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn the_shims_start_names_its_sandbox() {
        let a = args(&format!(
            "/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -address /run/containerd/containerd.sock -publish-binary /usr/bin/containerd -id {ID} start"
        ));
        assert_eq!(
            parse(&a, false),
            Some(RuntimeRun {
                program: Program::Shim,
                command: "start",
                id: Some(ID)
            })
        );
        let serve = args(&format!(
            "/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id {ID} -address /run/containerd/containerd.sock"
        ));
        assert_eq!(parse(&serve, false).unwrap().command, "");
    }

    #[test]
    fn runc_create_and_start_name_their_container_after_global_flags() {
        let create = args(&format!(
            "runc --root /run/containerd/runc/k8s.io --log /run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/log.json --log-format json --systemd-cgroup create --bundle /run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID} --pid-file /run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/init.pid {ID}"
        ));
        assert_eq!(
            parse(&create, false),
            Some(RuntimeRun {
                program: Program::Oci,
                command: "create",
                id: Some(ID)
            })
        );
        let start = args(&format!(
            "/usr/sbin/runc --root /run/containerd/runc/k8s.io --log x/log.json --log-format json start {ID}"
        ));
        assert_eq!(parse(&start, false).unwrap().command, "start");
        // A log directory named like a subcommand is a flag's value, not the command.
        let odd = args(&format!("runc --root start --log init create {ID}"));
        assert_eq!(parse(&odd, false).unwrap().command, "create");
    }

    #[test]
    fn runc_init_names_no_container() {
        assert_eq!(
            parse(&args("runc init"), false),
            Some(RuntimeRun {
                program: Program::Oci,
                command: "init",
                id: None
            })
        );
    }

    #[test]
    fn a_list_cut_at_its_head_still_names_command_and_id() {
        let cut = args(&format!(
            "json create --bundle /very/long/k8s.io/{ID} --pid-file /very/long/{ID}/init.pid {ID}"
        ));
        let run = parse(&cut, true).unwrap();
        assert_eq!(
            (run.program, run.command, run.id),
            (Program::Oci, "create", Some(ID))
        );
        let shim_cut = args(&format!("/usr/bin/containerd -id {ID} start"));
        assert_eq!(parse(&shim_cut, true).unwrap().program, Program::Shim);
    }

    #[test]
    fn a_compacted_list_parses_as_the_whole_one() {
        let lists = [
            (
                format!(
                    "/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -address /a -publish-binary /b -id {ID} start"
                ),
                false,
            ),
            (
                format!("/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id {ID} -address /a"),
                false,
            ),
            (
                format!(
                    "runc --root /r --log /l/{ID}/log.json --log-format json create --bundle /b/{ID} --pid-file /p {ID}"
                ),
                false,
            ),
            (format!("/usr/sbin/runc --root /r start {ID}"), false),
            ("runc init".to_string(), false),
            (format!("json create --bundle /b/{ID} {ID}"), true),
            (format!("/usr/bin/containerd -id {ID} delete"), true),
        ];
        for (list, cut) in lists {
            let argv = args(&list);
            let short = compact(&argv, cut).unwrap();
            assert!(short.len() <= 4, "{short:?}");
            let (whole, kept) = (parse(&argv, cut).unwrap(), parse(&short, false).unwrap());
            assert_eq!(
                (whole.program, whole.command, whole.id),
                (kept.program, kept.command, kept.id),
                "{list} -> {short:?}"
            );
        }
        assert_eq!(compact(&args("/bin/sh -c true"), false), None);
    }

    #[test]
    fn other_programs_and_empty_lists_are_not_runtime_runs() {
        assert_eq!(parse(&args("/bin/sh -c true"), false), None);
        assert_eq!(parse(&[], false), None);
        assert_eq!(parse(&args("runc --root /x"), false), None);
    }
}
