//! Set difference over lists already in key order (the sync loop's maps of pods by UID),
//! in one pass rather than a lookup per entry.

/// The entries of `all` whose key is in neither `minus_a` nor `minus_b`, in order. All
/// three must be in ascending key order.
pub(super) fn without<'a, T>(
    all: impl Iterator<Item = (&'a str, T)>,
    minus_a: impl Iterator<Item = &'a str>,
    minus_b: impl Iterator<Item = &'a str>,
) -> impl Iterator<Item = (&'a str, T)> {
    let (mut a, mut b) = (minus_a.peekable(), minus_b.peekable());
    all.filter(move |(key, _)| {
        while a.next_if(|k| k < key).is_some() {}
        while b.next_if(|k| k < key).is_some() {}
        a.peek() != Some(key) && b.peek() != Some(key)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All, minus one, minus the other, and what is left.
    type Case = (
        &'static [&'static str],
        &'static [&'static str],
        &'static [&'static str],
        &'static [&'static str],
    );

    #[test]
    fn keeps_what_neither_list_has_in_order() {
        let cases: [Case; 7] = [
            (&["a", "b", "c"], &[], &[], &["a", "b", "c"]),
            (&["a", "b", "c"], &["b"], &[], &["a", "c"]),
            (&["a", "b", "c"], &[], &["a", "c"], &["b"]),
            (&["a", "b", "c"], &["a"], &["a", "b", "c"], &[]),
            // Keys the first list does not have are passed over.
            (&["b", "d"], &["a", "c", "e"], &["0", "bb"], &["b", "d"]),
            (&["b", "d"], &["d", "z"], &["a"], &["b"]),
            (&[], &["a"], &["b"], &[]),
        ];
        for (all, a, b, want) in cases {
            let got: Vec<&str> = without(
                all.iter().map(|k| (*k, ())),
                a.iter().copied(),
                b.iter().copied(),
            )
            .map(|(k, _)| k)
            .collect();
            assert_eq!(got, want, "{all:?} without {a:?} and {b:?}");
        }
    }
}
