//! kubelet's expansion of `$(VAR)` references in a container's command, arguments and
//! environment (`third_party/forked/golang/expansion`).

/// kubelet's `$(VAR)` expansion: known variables are replaced, `$$` escapes, unknown
/// references stay as written.
pub fn expand_env_refs(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_like_kubelet() {
        let env = vec![
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "x".to_string()),
        ];
        assert_eq!(expand_env_refs("$(A)-$(B)", &env), "1-x");
        assert_eq!(expand_env_refs("$$(A)", &env), "$(A)");
        assert_eq!(expand_env_refs("$(C) $", &env), "$(C) $");
        assert_eq!(expand_env_refs("echo $(A", &env), "echo $(A");
    }
}
