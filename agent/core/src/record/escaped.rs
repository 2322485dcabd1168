//! Bytes a process wrote, as text a trace can hold: UTF-8 stays as it is, every byte that
//! is not part of valid UTF-8 becomes `\xNN` (two lowercase hex digits) and a backslash
//! becomes `\\`, so [`unescape`] gives back exactly the bytes [`escape`] was given. A
//! chunk cut inside a multi-byte character escapes that character's bytes; joining the
//! unescaped chunks restores it.

use std::fmt::Write;

/// The bytes as text, invalid UTF-8 and backslashes escaped.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// The bytes [`escape`] made `text` from. A backslash not followed by `\` or by `x` and
/// two hex digits (text no escape wrote) is kept as it is.
pub fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' {
            if bytes.get(i + 1) == Some(&b'\\') {
                out.push(b'\\');
                i += 2;
                continue;
            }
            if bytes.get(i + 1) == Some(&b'x')
                && let Some(v) = bytes
                    .get(i + 2..i + 4)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stays_text_and_everything_else_round_trips() {
        assert_eq!(escape(b"{\"code\": 11}"), "{\"code\": 11}");
        assert_eq!(escape("10.1.0.2 – ok".as_bytes()), "10.1.0.2 – ok");
        assert_eq!(escape(b"a\\b"), "a\\\\b");
        assert_eq!(escape(b"\xff\x00ok\xc3"), "\\xff\u{0}ok\\xc3");
        for raw in [
            &b""[..],
            b"plain",
            b"\\x41 is not an escape",
            b"\xde\xad\xbe\xef",
            "é".as_bytes(),
            &"é".as_bytes()[..1],
            b"\\",
            b"trailing \\x4",
        ] {
            assert_eq!(unescape(&escape(raw)), raw, "{raw:?}");
        }
    }

    #[test]
    fn a_character_cut_between_chunks_is_whole_again_once_joined() {
        let text = "naïve".as_bytes();
        let (a, b) = text.split_at(3);
        let (ea, eb) = (escape(a), escape(b));
        assert_eq!(ea, "na\\xc3");
        let mut joined = unescape(&ea);
        joined.extend(unescape(&eb));
        assert_eq!(joined, text);
    }

    #[test]
    fn stray_backslashes_are_kept() {
        assert_eq!(unescape("a\\qb\\x4"), b"a\\qb\\x4");
        assert_eq!(unescape("\\xzz"), b"\\xzz");
    }
}
