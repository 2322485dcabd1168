//! The output formats the commands print in (`-o`).

/// `-o` of the commands that print a table for people or JSON for programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// `podlapse replay -o`: the comparison as text, or as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplayOutput {
    Text,
    Json,
}

/// `podlapse report -o`.
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("podlapse").chain(args.iter().copied()))
    }

    #[test]
    fn each_format_is_spelled_as_before() {
        let Command::Report(r) = parse(&["report", "-o", "chrome-json", "t"])
            .unwrap()
            .command
        else {
            panic!("not report");
        };
        assert_eq!(r.output, ReportFormat::ChromeJson);
        let Command::Replay(r) = parse(&["replay", "--output", "json", "t"]).unwrap().command
        else {
            panic!("not replay");
        };
        assert_eq!(r.output, ReplayOutput::Json);
        for cmd in ["timeline", "diagnose", "pods"] {
            assert!(parse(&[cmd, "-o", "json"]).is_ok(), "{cmd}");
        }
    }

    #[test]
    fn a_bad_format_is_refused_naming_the_option_and_the_formats() {
        for (args, values) in [
            (
                &["report", "-o", "xml", "t"][..],
                "table, json, markdown, perfetto, chrome-json",
            ),
            (&["replay", "-o", "table", "t"][..], "text, json"),
            (&["timeline", "-o", "text"][..], "table, json"),
            (&["diagnose", "-o", "svg"][..], "table, json"),
            (&["pods", "-o", "yaml"][..], "table, json"),
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue, "{args:?}");
            let text = err.to_string();
            assert!(text.contains("'--output <OUTPUT>'"), "{text}");
            assert!(
                text.contains(&format!("[possible values: {values}]")),
                "{text}"
            );
        }
    }
}
