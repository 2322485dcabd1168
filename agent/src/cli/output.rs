//! The output formats the commands print in (`-o`).

/// `-o` of the commands that print a table for people or JSON for programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// `podtrace replay -o`: the comparison as text, or as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplayOutput {
    Text,
    Json,
}

/// `podtrace report -o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// The stage latency table and each pod's startup parts.
    Table,
    Json,
    Markdown,
    /// Perfetto's native protobuf trace (binary: redirect it to a `.pftrace` file).
    Perfetto,
    /// Chrome JSON trace events (Perfetto, chrome://tracing, speedscope).
    ChromeJson,
}
