//! Go's `%q` and `%v` spellings, so messages read exactly like kubelet's events and logs
//! (`Exec lifecycle hook ([sh -c exit 1]) ... message: "oops\n"`).

use k8s_openapi::api::core::v1::Pod;

/// Go's `strconv.Quote` of bytes that may not be UTF-8.
pub fn quote(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{7}' => out.push_str("\\a"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{b}' => out.push_str("\\v"),
                c if c == ' ' || !(c.is_control() || c.is_whitespace()) => out.push(c),
                c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
                c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push_str(&format!("\\U{:08x}", c as u32)),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    out
}

/// Go's `%v` of a `[]string`: `[a b c]`.
pub fn list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// kubelet's `format.Pod`: `name_namespace(uid)`.
pub fn pod(pod: &Pod) -> String {
    let m = &pod.metadata;
    format!(
        "{}_{}({})",
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_like_go() {
        for (input, want) in [
            (&b"plain"[..], r#""plain""#),
            (b"say \"hi\"\n", r#""say \"hi\"\n""#),
            (b"tab\tback\\slash", r#""tab\tback\\slash""#),
            (b"\x00\x7f", r#""\x00\x7f""#),
            (b"bad \xff utf8", r#""bad \xff utf8""#),
            ("caf\u{e9} \u{a0}".as_bytes(), "\"caf\u{e9} \\u00a0\""),
            (b"", r#""""#),
        ] {
            assert_eq!(quote(input), want, "{input:?}");
        }
    }

    #[test]
    fn lists_and_pods_like_kubelet() {
        assert_eq!(
            list(&["sh".into(), "-c".into(), "exit 1".into()]),
            "[sh -c exit 1]"
        );
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("1234".into());
        assert_eq!(pod(&p), "web_default(1234)");
    }
}
