//! What a CNI plugin said: the result or error it printed on its standard output, as the
//! probes captured it (`cni_output` kernel events), read as a CNI reply.
//!
//! A plugin prints one JSON object: a result (`cniVersion`, `interfaces`, `ips`, `routes`,
//! `dns`; before CNI 0.3 `ip4`/`ip6`) or an error (`code`, `msg`, `details`). The text is
//! read as JSON and nothing more: what is kept of a result is its addresses and interface
//! names, of an error its code and messages. Output that is not JSON, or that the capture
//! cut before it ended, is kept as text ([`CniReply::Unparsed`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use podlapse_core::record::escaped;

/// The reply of one plugin run, on its `cni_plugin:<name>` stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CniReply {
    /// A result: the addresses it assigned (CIDR) and the interfaces it names.
    Result {
        ips: Vec<CniIp>,
        interfaces: Vec<String>,
    },
    /// An error, as the plugin gave it (`code` 11 is "try again later", 7 "invalid
    /// network config", ...; plugin-specific codes are 100 and above).
    Error {
        code: u32,
        msg: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        details: String,
    },
    /// Output that is not a CNI reply: not JSON, or cut before it ended. `text` is what
    /// was captured, bytes that are not UTF-8 as `\xNN` (see `record::escaped`).
    Unparsed { why: String, text: String },
    /// Nothing of the output was captured, and why: the probes were off, the write hook
    /// was attached after the plugin wrote, the kernel refused it, ...
    NotCaptured { why: String },
}

/// An address a result assigned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniIp {
    /// CIDR: `10.1.0.5/24`.
    pub address: String,
    /// Index into the result's `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<u32>,
}

/// How a plugin run's output was captured, beside its [`CniReply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniCapture {
    /// Bytes the plugin asked to write to its standard output, in all (the sum of its
    /// writes' counts, as far as the probes saw them).
    pub written: u64,
    /// Bytes of them the probes copied: from the start, up to the first gap.
    pub captured: u64,
    /// The output was longer than what was captured (the per-run bound, a write the
    /// probes lost, or writes before the hook was attached).
    pub cut: bool,
    /// The hook that saw the writes: `kprobe:ksys_write` or
    /// `tracepoint:syscalls:sys_enter_write`; empty when none did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hook: String,
}

impl CniReply {
    /// Reads `text`, the start of a plugin's output; `cut` when the output went on past
    /// it (a reply cut short does not parse, and says so).
    pub fn parse(text: &[u8], cut: bool) -> CniReply {
        let unparsed = |why: String| CniReply::Unparsed {
            why,
            text: escaped::escape(text),
        };
        if text.iter().all(u8::is_ascii_whitespace) {
            return unparsed(if cut {
                "the captured part of the output is empty".into()
            } else {
                "the plugin wrote nothing to its standard output".into()
            });
        }
        let value: Value = match serde_json::from_slice(text) {
            Ok(v) => v,
            Err(_) if cut => {
                return unparsed(format!(
                    "cut after {} bytes, before the reply ended",
                    text.len()
                ));
            }
            Err(e) => return unparsed(format!("not JSON: {e}")),
        };
        let Value::Object(obj) = &value else {
            return unparsed("JSON, but not an object".into());
        };
        if let Some(code) = obj.get("code").and_then(Value::as_u64) {
            let text_of = |key: &str| {
                obj.get(key)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            return CniReply::Error {
                code: u32::try_from(code).unwrap_or(u32::MAX),
                msg: text_of("msg"),
                details: text_of("details"),
            };
        }
        let is_result = ["cniVersion", "ips", "interfaces", "ip4", "ip6"]
            .iter()
            .any(|k| obj.contains_key(*k));
        if !is_result {
            return unparsed("JSON, but neither a CNI result nor an error".into());
        }
        CniReply::Result {
            ips: ips(obj),
            interfaces: obj
                .get("interfaces")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|i| i.get("name").and_then(Value::as_str))
                .map(str::to_string)
                .collect(),
        }
    }

    /// For people, on the stage's detail: `error 11: no IP addresses available ...`,
    /// `ip 10.1.0.5/24`, `output not captured: ...`.
    pub fn summary(&self) -> String {
        match self {
            CniReply::Result { ips, .. } if ips.is_empty() => "result without addresses".into(),
            CniReply::Result { ips, .. } => {
                let list: Vec<&str> = ips.iter().map(|i| i.address.as_str()).collect();
                format!("ip {}", list.join(" "))
            }
            CniReply::Error { code, msg, details } if details.is_empty() || details == msg => {
                format!("error {code}: {msg}")
            }
            CniReply::Error { code, msg, details } => format!("error {code}: {msg} ({details})"),
            CniReply::Unparsed { why, .. } => format!("output unparsed: {why}"),
            CniReply::NotCaptured { why } => format!("output not captured: {why}"),
        }
    }

    /// The addresses of a result; none for anything else.
    pub fn addresses(&self) -> impl Iterator<Item = &str> {
        let ips = match self {
            CniReply::Result { ips, .. } => ips.as_slice(),
            _ => &[],
        };
        ips.iter().map(|i| i.address.as_str())
    }
}

/// The addresses of a result: `ips` (CNI 0.3 and later), else `ip4`/`ip6` (0.1, 0.2).
fn ips(obj: &serde_json::Map<String, Value>) -> Vec<CniIp> {
    if let Some(list) = obj.get("ips").and_then(Value::as_array) {
        return list
            .iter()
            .filter_map(|ip| {
                Some(CniIp {
                    address: ip.get("address")?.as_str()?.to_string(),
                    interface: ip
                        .get("interface")
                        .and_then(Value::as_u64)
                        .and_then(|i| u32::try_from(i).ok()),
                })
            })
            .collect();
    }
    ["ip4", "ip6"]
        .iter()
        .filter_map(|k| obj.get(*k)?.get("ip")?.as_str())
        .map(|address| CniIp {
            address: address.to_string(),
            interface: None,
        })
        .collect()
}

#[cfg(test)]
#[path = "cni_reply_tests.rs"]
mod tests;
