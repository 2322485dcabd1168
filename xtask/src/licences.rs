//! The licences of every crate the workspace builds (what podlapse links, and its tests
//! and tools), checked against a list of permissive licences, from `cargo metadata`. A
//! crate under a copyleft licence (such as the LGPL BTF reader podlapse once used) fails
//! `cargo xtask test` with its name and licence.

use anyhow::{Context, bail};
use serde_json::Value;

use crate::workspace;

/// SPDX identifiers podlapse's Apache-2.0 binaries may link.
const PERMISSIVE: &[&str] = &[
    "Apache-2.0",
    "MIT",
    "MIT-0",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "ISC",
    "Zlib",
    "Unlicense",
    "CC0-1.0",
    "BSL-1.0",
    "Unicode-3.0",
    "Unicode-DFS-2016",
    "CDLA-Permissive-2.0",
];

/// A package whose licence is not permissive, or not stated.
#[derive(Debug, PartialEq, Eq)]
pub struct Violation {
    pub package: String,
    pub licence: Option<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.licence {
            Some(l) => write!(f, "{}: {l}", self.package),
            None => write!(f, "{}: no SPDX licence in its manifest", self.package),
        }
    }
}

/// Whether an SPDX expression allows permissive use: some alternative of its `OR`s
/// (old manifests write `/`) whose every `AND` term is permissive. `WITH` exceptions
/// only widen a licence, so they are dropped.
pub fn permissive(expression: &str) -> bool {
    let cleaned = expression.replace(['(', ')'], " ");
    // Parentheses only group `A AND (B OR C)`-style terms in the manifests seen; read
    // flat, `OR` binding loosest, which is never more permissive than the grouping.
    cleaned
        .split(" OR ")
        .flat_map(|a| a.split('/'))
        .any(|alternative| {
            alternative.split(" AND ").all(|term| {
                let id = term.split(" WITH ").next().unwrap_or_default().trim();
                PERMISSIVE.contains(&id)
            })
        })
}

/// The packages of a `cargo metadata` document that fail [`permissive`], sorted.
pub fn violations(metadata: &Value) -> Vec<Violation> {
    let mut found: Vec<Violation> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let package = format!(
                "{} {}",
                p["name"].as_str().unwrap_or("?"),
                p["version"].as_str().unwrap_or("?")
            );
            match p["license"].as_str() {
                Some(l) if permissive(l) => None,
                licence => Some(Violation {
                    package,
                    licence: licence.map(str::to_string),
                }),
            }
        })
        .collect();
    found.sort_by(|a, b| a.package.cmp(&b.package));
    found
}

/// Runs `cargo metadata` for this machine's target and fails on any violation.
pub fn check() -> anyhow::Result<()> {
    let host = workspace::host_triple()?;
    let out = workspace::cargo()
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
        ])
        .arg(&host)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let metadata: Value =
        serde_json::from_slice(&out.stdout).context("reading cargo metadata's output")?;
    let bad = violations(&metadata);
    if !bad.is_empty() {
        bail!(
            "dependencies under licences podlapse's Apache-2.0 binaries cannot take:\n  {}",
            xtask::text::list(&bad, "\n  ", ToString::to_string)
        );
    }
    let count = metadata["packages"].as_array().map_or(0, Vec::len);
    eprintln!("licences: {count} packages, all permissive");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdx_expressions_as_crates_write_them() {
        for ok in [
            "MIT OR Apache-2.0",
            "MIT/Apache-2.0",
            "Apache-2.0 / MIT",
            "Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT",
            "(MIT OR Apache-2.0) AND Unicode-3.0",
            "MIT AND BSD-3-Clause",
            "Unlicense OR MIT",
        ] {
            assert!(permissive(ok), "{ok}");
        }
        for bad in [
            "LGPL-2.1-or-later",
            "GPL-2.0",
            "MIT AND GPL-2.0",
            "MPL-2.0",
            "",
        ] {
            assert!(!permissive(bad), "{bad}");
        }
        // One permissive alternative is enough.
        assert!(permissive("GPL-2.0 OR MIT"));
    }

    #[test]
    fn a_copyleft_or_unstated_licence_is_named_with_its_package() {
        let metadata = serde_json::json!({"packages": [
            {"name": "fine", "version": "1.0.0", "license": "MIT"},
            {"name": "btf-rs", "version": "2.0.0", "license": "LGPL-2.1-or-later"},
            {"name": "vague", "version": "0.1.0", "license": null},
        ]});
        let v = violations(&metadata);
        let shown: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "btf-rs 2.0.0: LGPL-2.1-or-later",
                "vague 0.1.0: no SPDX licence in its manifest"
            ]
        );
    }
}
