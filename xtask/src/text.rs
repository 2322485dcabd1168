//! Small pieces of text handling the workflows share.

/// The last `n` lines of `s` (all of them when it has fewer), for an error that shows the
/// end of a log or of a command's output.
pub fn last_lines(s: &str, n: usize) -> Vec<&str> {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_lines_are_kept_in_order() {
        assert_eq!(last_lines("a\nb\nc\n", 2), ["b", "c"]);
        assert_eq!(last_lines("a\nb", 5), ["a", "b"]);
        assert!(last_lines("", 3).is_empty());
    }
}
