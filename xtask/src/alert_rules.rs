//! `deploy/prometheus-rules.yaml`, the alerting rules over podlapse's metrics: checked by
//! `promtool check rules`, then `promtool test rules` on the series of
//! `deploy/prometheus-rules.test.yaml` (each alert fires on podlapse's series, and stays
//! quiet on a healthy node). promtool is the Debian package prometheus, which
//! `cargo xtask setup` installs.

use std::process::Command;

use crate::workspace;

pub fn check() -> anyhow::Result<()> {
    let deploy = workspace::root().join("deploy");
    workspace::output_of(
        Command::new("promtool")
            .args(["check", "rules", "prometheus-rules.yaml"])
            .current_dir(&deploy),
        "promtool check rules deploy/prometheus-rules.yaml",
    )?;
    // promtool reports a failed expectation on stdout.
    let out = Command::new("promtool")
        .args(["test", "rules", "prometheus-rules.test.yaml"])
        .current_dir(&deploy)
        .output()
        .map_err(|e| anyhow::anyhow!("running promtool test rules: {e}"))?;
    if !out.status.success() {
        anyhow::bail!(
            "promtool test rules deploy/prometheus-rules.test.yaml failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
