//! The units the benchmarks show memory in.

/// KiB (as /proc/<pid>/status gives them) as MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The highest of some KiB samples, as MiB; 0 with none.
pub fn max_mib(kib: &[u64]) -> f64 {
    mib(kib.iter().copied().max().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kib_are_shown_as_mib() {
        assert_eq!(mib(1536), 1.5);
        assert_eq!(max_mib(&[1024, 3072, 2048]), 3.0);
        assert_eq!(max_mib(&[]), 0.0);
    }
}
