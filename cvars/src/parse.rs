//! Parsers and printers of the value syntaxes shared by cvars (and usable by other crates for
//! the same syntax on their command lines).

use std::time::Duration;

use crate::Unit;

/// Parses a torchcomms boolean: `1/true/yes/y` or `0/false/no/n` (any case), as torchcomms
/// does; anything else is an error there too.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "y" => Some(true),
        "0" | "false" | "no" | "n" => Some(false),
        _ => None,
    }
}

/// Parses a byte count: digits with an optional `K`, `M`, `G`, `T` (powers of 1024; `KiB`,
/// `KB` and a trailing `B` are accepted too).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim().replace('_', "");
    let lower = t.to_ascii_lowercase();
    let t = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], 10),
        'm' => (&t[..t.len() - 1], 20),
        'g' => (&t[..t.len() - 1], 30),
        't' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let digits = digits.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// Parses a duration: a non-negative number in `unit`, or a number followed by `ns`, `us`,
/// `ms`, `s`, `m` or `h`.
pub fn parse_duration(text: &str, unit: Unit) -> Option<Duration> {
    let t = text.trim().to_ascii_lowercase();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let scale = match suffix.trim() {
        "" => match unit {
            Unit::Seconds => 1.0,
            Unit::Millis => 1e-3,
            Unit::Micros => 1e-6,
        },
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    let v: f64 = num.trim().parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(v * scale).ok()
}

/// `1M`, `4K`, `1000`: the shortest exact form of a byte count.
pub(crate) fn show_bytes(b: u64) -> String {
    for (shift, s) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if b != 0 && b % (1 << shift) == 0 {
            return format!("{}{s}", b >> shift);
        }
    }
    b.to_string()
}

/// `600s`, `50us`, `1.5s`.
pub(crate) fn show_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0s".into()
    } else if ns % 1_000_000_000 == 0 {
        format!("{}s", ns / 1_000_000_000)
    } else if ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns % 1_000 == 0 {
        format!("{}us", ns / 1_000)
    } else {
        format!("{}ns", ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64K"), Some(64 << 10));
        assert_eq!(parse_bytes("1m"), Some(1 << 20));
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("3 MB"), Some(3 << 20));
        assert_eq!(parse_bytes("16B"), Some(16));
        for bad in ["", "K", "-1", "1.5M", "12X", "99999999999T"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
        assert_eq!(show_bytes(1 << 20), "1M");
        assert_eq!(show_bytes(1000), "1000");
        assert_eq!(show_bytes(0), "0");
    }

    #[test]
    fn durations() {
        let s = |t| parse_duration(t, Unit::Seconds);
        assert_eq!(s("600"), Some(Duration::from_secs(600)));
        assert_eq!(s("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(s("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(s("2m"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_duration("50", Unit::Micros),
            Some(Duration::from_micros(50))
        );
        for bad in ["", "-1", "abc", "5 parsecs", "nan", "inf"] {
            assert_eq!(s(bad), None, "{bad}");
        }
        assert_eq!(show_duration(Duration::from_secs(600)), "600s");
        assert_eq!(show_duration(Duration::from_micros(50)), "50us");
        assert_eq!(show_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn bools() {
        for t in ["1", "true", "YES", "y"] {
            assert_eq!(parse_bool(t), Some(true));
        }
        for f in ["0", "False", "no", "n"] {
            assert_eq!(parse_bool(f), Some(false));
        }
        assert_eq!(parse_bool("2"), None);
        assert_eq!(parse_bool("on"), None);
    }
}
