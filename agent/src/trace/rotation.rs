//! A trace in files of bounded size (`--trace-max-bytes`, `--trace-keep`), for a node
//! that records for months. The file being written is always the path given; when it
//! reaches the bound the writer ends it with a footer of its own (`continued`), moves
//! it to `PATH.1` (older ones up one, the oldest beyond `--trace-keep` removed) and
//! starts `PATH` again with the header and the recording's state (its sources, the
//! node's network as last looked at), so every file reads alone.

use std::path::{Path, PathBuf};

/// The smallest bound: a file must hold its header, the state it starts with and a
/// pod's records (a pod's spec alone can be tens of kilobytes).
pub const MIN_MAX_BYTES: u64 = 64 * 1024;

/// Files kept when `--trace-keep` is not given.
pub const DEFAULT_KEEP: u32 = 5;

/// How a trace rotates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// A file is ended once it holds this many bytes.
    pub max_bytes: u64,
    /// Files kept, the one being written among them.
    pub keep: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RotationError {
    #[error("--trace-max-bytes {given:?}: {why}")]
    Size { given: String, why: String },
    #[error(
        "--trace-max-bytes {given}: below {MIN_MAX_BYTES} bytes (64 KiB) a file would not hold a pod's records"
    )]
    TooSmall { given: u64 },
    #[error("--trace-keep 0: a rotated trace keeps at least the file being written")]
    KeepZero,
}

impl Rotation {
    /// The rotation the flags ask for: none without `--trace-max-bytes`.
    pub fn from_flags(
        max_bytes: Option<&str>,
        keep: Option<u32>,
    ) -> Result<Option<Rotation>, RotationError> {
        if keep == Some(0) {
            return Err(RotationError::KeepZero);
        }
        let Some(given) = max_bytes else {
            return Ok(None);
        };
        let max_bytes = given
            .trim()
            .parse::<bytesize::ByteSize>()
            .map_err(|why| RotationError::Size {
                given: given.to_string(),
                why: format!("{why} (give bytes, or a size such as 64MiB)"),
            })?
            .as_u64();
        if max_bytes < MIN_MAX_BYTES {
            return Err(RotationError::TooSmall { given: max_bytes });
        }
        Ok(Some(Rotation {
            max_bytes,
            keep: keep.unwrap_or(DEFAULT_KEEP),
        }))
    }
}

/// The file `age` rotations back: 0 is `path` itself, the one being written; `n` is
/// `path.n`.
pub fn part_path(path: &Path, age: u32) -> PathBuf {
    if age == 0 {
        return path.to_path_buf();
    }
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{age}"));
    PathBuf::from(name)
}

/// Makes room for a new file at `path`: the oldest beyond `keep` removed, `path.n` to
/// `path.n+1`, `path` to `path.1` (with `keep` 1, `path` is removed).
pub(super) fn shift(path: &Path, keep: u32) -> std::io::Result<()> {
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    gone(std::fs::remove_file(part_path(path, keep - 1)))?;
    for age in (0..keep.saturating_sub(1)).rev() {
        gone(std::fs::rename(
            part_path(path, age),
            part_path(path, age + 1),
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_are_read_or_refused_with_a_reason() {
        assert_eq!(Rotation::from_flags(None, None), Ok(None));
        assert_eq!(
            Rotation::from_flags(Some("1MiB"), None),
            Ok(Some(Rotation {
                max_bytes: 1 << 20,
                keep: DEFAULT_KEEP
            }))
        );
        assert_eq!(
            Rotation::from_flags(Some("70000"), Some(2)),
            Ok(Some(Rotation {
                max_bytes: 70_000,
                keep: 2
            }))
        );
        assert_eq!(
            Rotation::from_flags(Some("1MiB"), Some(0)),
            Err(RotationError::KeepZero)
        );
        assert_eq!(
            Rotation::from_flags(Some("4KiB"), None),
            Err(RotationError::TooSmall { given: 4096 })
        );
        let err = Rotation::from_flags(Some("lots"), None).unwrap_err();
        assert!(
            err.to_string().starts_with("--trace-max-bytes \"lots\": "),
            "{err}"
        );
    }

    #[test]
    fn shifting_keeps_the_newest_files_and_frees_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        for round in 0..5 {
            std::fs::write(&path, format!("{round}")).unwrap();
            shift(&path, 3).unwrap();
            assert!(!path.exists());
        }
        // Rounds 4 and 3 are kept, as .1 and .2: with the file being written, 3 files.
        assert_eq!(std::fs::read_to_string(part_path(&path, 1)).unwrap(), "4");
        assert_eq!(std::fs::read_to_string(part_path(&path, 2)).unwrap(), "3");
        assert!(!part_path(&path, 3).exists());
        std::fs::write(&path, "x").unwrap();
        shift(&path, 1).unwrap();
        assert!(!path.exists());
    }
}
