//! Where the compiled probes are: `--probes`, else `$PODTRACE_PROBES`, else beside the
//! binary (`<target>/<profile>/podtrace` -> `<target>/bpf/podtrace-probes.o`, where
//! `cargo xtask build-ebpf` puts it), else in this workspace's `target/bpf`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The object's file name, as `cargo xtask build-ebpf` writes it.
pub const OBJECT_NAME: &str = "podtrace-probes.o";
/// The environment variable naming the object.
pub const PROBES_ENV: &str = "PODTRACE_PROBES";

/// How the object's path was chosen, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectSource {
    Flag,
    Env,
    BesideBinary,
    Workspace,
}

impl fmt::Display for ObjectSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectSource::Flag => "from --probes",
            ObjectSource::Env => "from $PODTRACE_PROBES",
            ObjectSource::BesideBinary => "beside the podtrace binary",
            ObjectSource::Workspace => "in the workspace's target/bpf",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbesObject {
    pub path: PathBuf,
    pub source: ObjectSource,
}

impl ProbesObject {
    /// Resolves the object from this process's flag, environment and location.
    pub fn locate(flag: Option<&Path>) -> ProbesObject {
        let exe = std::env::current_exe().ok();
        let workspace_target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
        resolve(
            flag,
            std::env::var_os(PROBES_ENV),
            exe.as_deref(),
            &workspace_target,
            &|p| p.exists(),
        )
    }
}

/// The precedence, with the inputs passed in so it can be tested.
pub fn resolve(
    flag: Option<&Path>,
    env: Option<OsString>,
    exe: Option<&Path>,
    workspace_target: &Path,
    exists: &dyn Fn(&Path) -> bool,
) -> ProbesObject {
    if let Some(p) = flag {
        return ProbesObject {
            path: p.to_path_buf(),
            source: ObjectSource::Flag,
        };
    }
    if let Some(p) = env.filter(|p| !p.is_empty()) {
        return ProbesObject {
            path: PathBuf::from(p),
            source: ObjectSource::Env,
        };
    }
    let beside = exe
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|target| target.join("bpf").join(OBJECT_NAME));
    let workspace = ProbesObject {
        path: workspace_target.join("bpf").join(OBJECT_NAME),
        source: ObjectSource::Workspace,
    };
    match beside {
        Some(path) if exists(&path) || !exists(&workspace.path) => ProbesObject {
            path,
            source: ObjectSource::BesideBinary,
        },
        _ => workspace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXE: &str = "/build/target/debug/podtrace";
    const BESIDE: &str = "/build/target/bpf/podtrace-probes.o";
    const WS: &str = "/src/podtrace/target";

    fn at(flag: Option<&str>, env: Option<&str>, present: &[&str]) -> ProbesObject {
        let present: Vec<PathBuf> = present.iter().map(PathBuf::from).collect();
        resolve(
            flag.map(Path::new),
            env.map(OsString::from),
            Some(Path::new(EXE)),
            Path::new(WS),
            &|p| present.iter().any(|q| q == p),
        )
    }

    #[test]
    fn flag_then_env_then_beside_the_binary_then_the_workspace() {
        let o = at(Some("/x.o"), Some("/y.o"), &[BESIDE]);
        assert_eq!(
            (o.path.to_str(), o.source),
            (Some("/x.o"), ObjectSource::Flag)
        );
        let o = at(None, Some("/y.o"), &[BESIDE]);
        assert_eq!(
            (o.path.to_str(), o.source),
            (Some("/y.o"), ObjectSource::Env)
        );
        let o = at(None, Some(""), &[BESIDE]);
        assert_eq!(o.source, ObjectSource::BesideBinary);
        assert_eq!(o.path, Path::new(BESIDE));
        let ws = "/src/podtrace/target/bpf/podtrace-probes.o";
        let o = at(None, None, &[ws]);
        assert_eq!(
            (o.path.to_str(), o.source),
            (Some(ws), ObjectSource::Workspace)
        );
    }

    #[test]
    fn with_nothing_built_the_error_names_the_path_beside_the_binary() {
        let o = at(None, None, &[]);
        assert_eq!(o.path, Path::new(BESIDE));
        assert_eq!(o.source, ObjectSource::BesideBinary);
    }
}
