//! Human-friendly durations: `1500ms`, `30s`, `2m`, `1h`, `1m30s`; a bare
//! number is seconds.

use std::time::Duration;

/// Parses `30s`, `1500ms`, `2m`, `1h`, `1m30s`, or `45` (seconds).
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration '{text}': use e.g. 1500ms, 30s, 2m, 1h or 1m30s");
    let text = text.trim();
    if text.is_empty() {
        return Err(bad());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total = total.checked_add(part).ok_or_else(bad)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse(" 10s "), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn refuses_garbage_with_a_hint() {
        for bad in [
            "",
            "s",
            "10x",
            "-5s",
            "1.5s",
            "10 s",
            "99999999999999999999h",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("use e.g."), "{bad}: {err}");
        }
    }
}
