//! Which compiled probes podlapse loads: `--probes`, else `$PODLAPSE_PROBES`, else the
//! object built with podlapse and embedded in its binary (see `agent/build.rs`), so a
//! `podlapse` copied alone to a node carries its probes.

use std::borrow::Cow;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The object's file name, as `cargo xtask build-ebpf` writes it.
pub const OBJECT_NAME: &str = "podlapse-probes.o";
/// The environment variable naming the object.
pub const PROBES_ENV: &str = "PODLAPSE_PROBES";

/// The probes built with this binary. Aligned, as the ELF parser needs.
static EMBEDDED: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/podlapse-probes.o"));

/// How the object was chosen, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectSource {
    Flag,
    Env,
    Embedded,
}

impl fmt::Display for ObjectSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectSource::Flag => "from --probes",
            ObjectSource::Env => "from $PODLAPSE_PROBES",
            ObjectSource::Embedded => "embedded in the podlapse binary",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbesObject {
    /// The file, or for the embedded object the name it was built as.
    pub path: PathBuf,
    pub source: ObjectSource,
}

impl ProbesObject {
    /// Resolves the object from this process's flag and environment.
    pub fn locate(flag: Option<&Path>) -> ProbesObject {
        resolve(flag, std::env::var_os(PROBES_ENV))
    }

    /// The object's bytes: the embedded ones, or the file's.
    pub fn bytes(&self) -> std::io::Result<Cow<'static, [u8]>> {
        match self.source {
            ObjectSource::Embedded => Ok(Cow::Borrowed(EMBEDDED)),
            ObjectSource::Flag | ObjectSource::Env => std::fs::read(&self.path).map(Cow::Owned),
        }
    }

    /// How big the embedded object is (0 would mean a build that embedded nothing).
    pub fn embedded_len() -> usize {
        EMBEDDED.len()
    }
}

impl fmt::Display for ProbesObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            ObjectSource::Embedded => write!(f, "{OBJECT_NAME} ({})", self.source),
            _ => write!(f, "{} ({})", self.path.display(), self.source),
        }
    }
}

/// The precedence, with the inputs passed in so it can be tested.
pub fn resolve(flag: Option<&Path>, env: Option<OsString>) -> ProbesObject {
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
    ProbesObject {
        path: PathBuf::from(OBJECT_NAME),
        source: ObjectSource::Embedded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_then_env_then_the_embedded_object() {
        let o = resolve(Some(Path::new("/x.o")), Some("/y.o".into()));
        assert_eq!(
            (o.path.to_str(), o.source),
            (Some("/x.o"), ObjectSource::Flag)
        );
        let o = resolve(None, Some("/y.o".into()));
        assert_eq!(
            (o.path.to_str(), o.source),
            (Some("/y.o"), ObjectSource::Env)
        );
        let o = resolve(None, Some("".into()));
        assert_eq!(o.source, ObjectSource::Embedded);
        assert_eq!(resolve(None, None).source, ObjectSource::Embedded);
    }

    #[test]
    fn the_embedded_object_is_an_ebpf_elf() {
        let bytes = resolve(None, None).bytes().unwrap();
        assert_eq!(&bytes[..4], b"\x7fELF", "an ELF file");
        // e_machine at offset 18, little-endian: EM_BPF is 247.
        assert_eq!(
            u16::from_le_bytes([bytes[18], bytes[19]]),
            247,
            "built for BPF"
        );
        assert_eq!(ProbesObject::embedded_len(), bytes.len());
    }

    #[test]
    fn a_missing_file_is_an_error_not_the_embedded_object() {
        let o = resolve(Some(Path::new("/nonexistent/podlapse-probes.o")), None);
        assert_eq!(o.bytes().unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }
}
