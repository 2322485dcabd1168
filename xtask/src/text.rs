//! Small pieces of text handling the workflows share.

/// The last `n` lines of `s` (all of them when it has fewer), for an error that shows the
/// end of a log or of a command's output.
pub fn last_lines(s: &str, n: usize) -> Vec<&str> {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// Each of `items` as `show` puts it, joined by `sep`.
pub fn list<T>(
    items: impl IntoIterator<Item = T>,
    sep: &str,
    show: impl FnMut(T) -> String,
) -> String {
    items.into_iter().map(show).collect::<Vec<_>>().join(sep)
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

    #[test]
    fn a_list_shows_each_item_between_separators() {
        assert_eq!(list([1.0, 2.5], ", ", |x| format!("{x:.1}")), "1.0, 2.5");
        assert_eq!(list(Vec::<u8>::new(), "; ", |x| x.to_string()), "");
    }
}
