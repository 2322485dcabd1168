//! YAML as kubelet reads a manifest: go-yaml v2 (YAML 1.1) turned into JSON, then
//! decoded. A plain scalar resolves as go-yaml resolves it (`01777` is octal 1023,
//! `0x1F` hex, `1_000` a thousand, `yes`/`on`/`off` booleans, `~` null), a quoted one is
//! always a string; `<<` merges mappings; a later duplicate key wins; and `\'` is an
//! escape in a double-quoted string, as in YAML 1.1. The parser is yaml-rust2's; only
//! the resolution of scalars and the one escape YAML 1.2 dropped are go-yaml's.

use std::collections::BTreeMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A manifest that is not YAML: the parser's words, with the line and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{info} at line {line} column {column}")]
pub struct YamlError {
    pub info: String,
    pub line: usize,
    pub column: usize,
}

/// The documents of `text` as JSON values (an empty document is `null`), stopping at
/// the first syntax error: the documents before it, and the error.
pub fn documents(text: &str) -> (Vec<Value>, Option<YamlError>) {
    let mut text = std::borrow::Cow::Borrowed(text);
    loop {
        let mut builder = Builder::default();
        let mut parser = Parser::new_from_str(&text);
        match parser.load(&mut builder, true) {
            Ok(()) => return (builder.docs, None),
            Err(e) => {
                // YAML 1.1's `\'` escape, which YAML 1.2 (and this parser) refuses: the
                // parser points at the double-quoted scalar holding it.
                if e.info().contains("unknown escape character")
                    && let Some(fixed) = drop_quote_escape(&text, e.marker().index())
                {
                    text = std::borrow::Cow::Owned(fixed);
                    continue;
                }
                let error = YamlError {
                    info: e.info().to_string(),
                    line: e.marker().line(),
                    column: e.marker().col() + 1,
                };
                return (builder.docs, Some(error));
            }
        }
    }
}

/// In the double-quoted scalar opening at byte `at`, the first escape that is `\'`
/// written as `'`, if the first escape YAML 1.2 refuses there is that one.
fn drop_quote_escape(text: &str, at: usize) -> Option<String> {
    let rest = text.get(at..)?;
    let mut chars = rest.char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return None,
            '\\' => {
                let (_, next) = chars.next()?;
                if next == '\'' {
                    let mut fixed = String::with_capacity(text.len());
                    fixed.push_str(&text[..at + i]);
                    fixed.push_str(&text[at + i + 1..]);
                    return Some(fixed);
                }
            }
            _ => {}
        }
    }
    None
}

/// go-yaml v2's resolution of a plain scalar (its `resolve`): null, booleans in YAML
/// 1.1's spellings, integers with Go's base prefixes (a leading `0` is octal) and `_`
/// separators, floats, and otherwise the string itself.
pub fn resolve_plain(s: &str) -> Value {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Value::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Value::Bool(false);
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" | "-.inf" | "-.Inf" | "-.INF"
        | ".nan" | ".NaN" | ".NAN" => {
            // JSON has no infinities or NaN: kubelet's conversion fails on them too.
            return Value::String(s.to_string());
        }
        _ => {}
    }
    let first = s.as_bytes()[0];
    if first.is_ascii_digit() || first == b'+' || first == b'-' {
        let plain = s.replace('_', "");
        if let Some(n) = go_parse_int(&plain) {
            return Value::Number(n);
        }
        if is_yaml_float(&plain)
            && let Ok(f) = plain.parse::<f64>()
            && let Some(n) = json_float(f)
        {
            return Value::Number(n);
        }
    } else if first == b'.'
        && let Ok(f) = s.parse::<f64>()
        && let Some(n) = json_float(f)
    {
        return Value::Number(n);
    }
    Value::String(s.to_string())
}

/// A float as sigs.k8s.io/yaml writes it into JSON (Go's `json.Marshal`): a whole
/// number below 1e21 without a fraction, so `08` (not octal, so a float) still fills an
/// integer field.
fn json_float(f: f64) -> Option<Number> {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        if f >= 0.0 && f <= u64::MAX as f64 {
            return Some((f as u64).into());
        }
        if f < 0.0 && f >= i64::MIN as f64 {
            return Some((f as i64).into());
        }
    }
    Number::from_f64(f)
}

/// Go's `strconv.ParseInt(s, 0, 64)`, then `ParseUint`: an optional sign, then `0x`
/// hex, `0o` or a leading `0` octal, `0b` binary, or decimal.
fn go_parse_int(s: &str) -> Option<Number> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, body) = if let Some(b) = lower.strip_prefix("0x") {
        (16, b)
    } else if let Some(b) = lower.strip_prefix("0o") {
        (8, b)
    } else if let Some(b) = lower.strip_prefix("0b") {
        (2, b)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if body.is_empty() || body.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = u64::from_str_radix(body, radix).ok()?;
    if negative {
        let v = i64::try_from(magnitude)
            .map(|m| -m)
            .or_else(|_| (magnitude == 1u64 << 63).then_some(i64::MIN).ok_or(()))
            .ok()?;
        Some(v.into())
    } else {
        Some(magnitude.into())
    }
}

/// go-yaml's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && (frac.is_empty() || digits(frac)),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

/// A scalar with its explicit tag, if it has one (`!!str`, `!!int`, ...).
fn scalar(value: String, style: TScalarStyle, tag: Option<&Tag>) -> Value {
    match tag.map(|t| (t.handle.as_str(), t.suffix.as_str())) {
        Some(("!!", "str")) | Some(("tag:yaml.org,2002:", "str")) => return Value::String(value),
        Some(_) | None => {}
    }
    match style {
        TScalarStyle::Plain => resolve_plain(&value),
        _ => Value::String(value),
    }
}

/// What a key becomes in JSON: sigs.k8s.io/yaml writes a non-string key as its text.
fn key_text(key: Value) -> String {
    match key {
        Value::String(s) => s,
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// The plain `<<` key while its mapping is built: a name no quoted key can have.
const MERGE_KEY: &str = "\u{0}<<";

#[derive(Debug)]
enum Frame {
    Seq(usize, Vec<Value>),
    Map(usize, Map<String, Value>, Option<String>, Vec<Value>),
}

#[derive(Debug, Default)]
struct Builder {
    docs: Vec<Value>,
    stack: Vec<Frame>,
    anchors: BTreeMap<usize, Value>,
    /// The document's root, once complete.
    root: Option<Value>,
}

impl Builder {
    fn push_value(&mut self, v: Value, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, v.clone());
        }
        match self.stack.last_mut() {
            None => self.root = Some(v),
            Some(Frame::Seq(_, items)) => items.push(v),
            Some(Frame::Map(_, map, key, merges)) => match key.take() {
                None => {
                    // A `<<` key: its value is merged when the mapping ends.
                    *key = Some(match v {
                        Value::String(s) => s,
                        other => key_text(other),
                    });
                }
                Some(k) if k == MERGE_KEY => merges.push(v),
                Some(k) => {
                    map.insert(k, v);
                }
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, _mark: Marker) {
        match ev {
            Event::DocumentStart => {
                self.root = None;
                self.anchors.clear();
            }
            Event::DocumentEnd => {
                self.docs.push(self.root.take().unwrap_or(Value::Null));
            }
            Event::Scalar(value, style, anchor, tag) => {
                // A plain `<<` key is the merge key, not the string.
                let is_merge_key = style == TScalarStyle::Plain
                    && value == "<<"
                    && matches!(self.stack.last(), Some(Frame::Map(_, _, None, _)));
                let v = if is_merge_key {
                    Value::String(MERGE_KEY.into())
                } else {
                    scalar(value, style, tag.as_ref())
                };
                self.push_value(v, anchor);
            }
            Event::Alias(id) => {
                let v = self.anchors.get(&id).cloned().unwrap_or(Value::Null);
                self.push_value(v, 0);
            }
            Event::SequenceStart(anchor, _) => self.stack.push(Frame::Seq(anchor, Vec::new())),
            Event::MappingStart(anchor, _) => {
                self.stack
                    .push(Frame::Map(anchor, Map::new(), None, Vec::new()));
            }
            Event::SequenceEnd => {
                if let Some(Frame::Seq(anchor, items)) = self.stack.pop() {
                    self.push_value(Value::Array(items), anchor);
                }
            }
            Event::MappingEnd => {
                if let Some(Frame::Map(anchor, mut map, _, merges)) = self.stack.pop() {
                    // Keys of the mapping win over merged ones; earlier merges over later.
                    for merged in merges {
                        let sources = match merged {
                            Value::Array(items) => items,
                            other => vec![other],
                        };
                        for source in sources {
                            if let Value::Object(entries) = source {
                                for (k, v) in entries {
                                    map.entry(k).or_insert(v);
                                }
                            }
                        }
                    }
                    self.push_value(Value::Object(map), anchor);
                }
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd => {}
        }
    }
}

#[cfg(test)]
#[path = "yaml_tests.rs"]
mod tests;
