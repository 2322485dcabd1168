//! Resource quantities ("250m", "0.5", "128Mi", "1G") as integers: milli-CPU and bytes.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity's value times 1000 (milli-units), rounded up as kubelet rounds CPU.
pub fn milli_value(q: &Quantity) -> Option<i64> {
    let (num, scale) = parse(&q.0)?;
    Some((num * scale * 1000.0).ceil() as i64)
}

/// A quantity's value in whole units (bytes for memory), rounded up.
pub fn value(q: &Quantity) -> Option<i64> {
    let (num, scale) = parse(&q.0)?;
    Some((num * scale).ceil() as i64)
}

fn parse(s: &str) -> Option<(f64, f64)> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let num: f64 = num.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => {
            let exp: i32 = suffix.strip_prefix(['e', 'E'])?.parse().ok()?;
            10f64.powi(exp)
        }
    };
    Some((num, scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn cpu_and_memory() {
        assert_eq!(milli_value(&q("250m")), Some(250));
        assert_eq!(milli_value(&q("0.5")), Some(500));
        assert_eq!(milli_value(&q("2")), Some(2000));
        assert_eq!(value(&q("128Mi")), Some(134_217_728));
        assert_eq!(value(&q("1G")), Some(1_000_000_000));
        assert_eq!(value(&q("1e3")), Some(1000));
        assert_eq!(value(&q("lots")), None);
    }
}
