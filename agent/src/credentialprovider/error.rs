use std::path::PathBuf;

/// Why pull credentials could not be worked out. No variant carries secret material:
/// parse errors keep only a position, never the text around it.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The image reference cannot be parsed, so no registry can be matched.
    #[error("invalid image reference {image:?}: {reason}")]
    InvalidImage { image: String, reason: &'static str },

    /// A pull secret's file is not JSON.
    #[error("pull secret {secret:?} ({}) is not valid JSON: syntax error at line {line}, column {column}", path.display())]
    Json {
        secret: String,
        path: PathBuf,
        line: usize,
        column: usize,
    },

    /// A pull secret's JSON does not have the shape of a docker config, with what is
    /// wrong described by field names only.
    #[error("pull secret {secret:?} ({}): {problem}", path.display())]
    Malformed {
        secret: String,
        path: PathBuf,
        problem: String,
    },
}
