//! `LOCK.SCAN`'s arguments.

use super::{arity, parse_i64};
use crate::error::{show_arg, LockError};

/// `LOCK.SCAN cursor [MATCH pattern] [COUNT n] [WAITING]`, the options in
/// any order, each at most once.
#[derive(Debug, PartialEq, Eq)]
pub struct ScanArgs<'a> {
    /// Where the page starts: 0, or the cursor the last page answered.
    pub cursor: i64,
    /// A glob the key must match (`glob::matches`).
    pub pattern: Option<&'a [u8]>,
    /// About how many index entries to look at (default 10, as SCAN's).
    pub count: usize,
    /// Only locks with waiters.
    pub waiting: bool,
}

/// `SCAN`'s default COUNT.
pub const SCAN_COUNT: usize = 10;
/// The longest `MATCH` pattern.
pub const MAX_PATTERN_LEN: usize = 1024;

pub fn parse_scan<'a>(argv: &[&'a [u8]]) -> Result<ScanArgs<'a>, LockError> {
    arity(argv, 2, 7, "lock.scan")?;
    let cursor = match parse_i64(argv[1]) {
        Ok(n) if n >= 0 => n,
        _ => return Err(LockError::BadCursor(show_arg(argv[1]))),
    };
    let (mut pattern, mut count, mut waiting) = (None, None, false);
    let mut options = argv[2..].iter();
    while let Some(option) = options.next() {
        if option.eq_ignore_ascii_case(b"MATCH") && pattern.is_none() {
            let p = *options
                .next()
                .ok_or(LockError::MissingScanArgument("MATCH"))?;
            // Matching costs the pattern's length times the key's: bounded.
            if p.len() > MAX_PATTERN_LEN {
                return Err(LockError::PatternTooLong(p.len(), MAX_PATTERN_LEN));
            }
            pattern = Some(p);
        } else if option.eq_ignore_ascii_case(b"COUNT") && count.is_none() {
            let n = options
                .next()
                .ok_or(LockError::MissingScanArgument("COUNT"))?;
            count = Some(match parse_i64(n) {
                Ok(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
                _ => return Err(LockError::BadCount(show_arg(n))),
            });
        } else if option.eq_ignore_ascii_case(b"WAITING") && !waiting {
            waiting = true;
        } else {
            return Err(LockError::UnknownOption(show_arg(option)));
        }
    }
    Ok(ScanArgs {
        cursor,
        pattern,
        count: count.unwrap_or(SCAN_COUNT),
        waiting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_takes_a_cursor_then_its_options_once_each_in_any_order() {
        let parse = |args: &[&'static str]| -> Result<ScanArgs<'static>, LockError> {
            let mut argv: Vec<&'static [u8]> = vec![b"lock.scan"];
            argv.extend(args.iter().map(|a| a.as_bytes()));
            parse_scan(&argv)
        };
        let plain = ScanArgs {
            cursor: 0,
            pattern: None,
            count: SCAN_COUNT,
            waiting: false,
        };
        assert_eq!(parse(&["0"]), Ok(plain));
        let all = ScanArgs {
            cursor: 77,
            pattern: Some(&b"orders:*"[..]),
            count: 500,
            waiting: true,
        };
        assert_eq!(
            parse(&["77", "waiting", "COUNT", "500", "match", "orders:*"]),
            Ok(all)
        );
        assert_eq!(parse(&[]), Err(LockError::WrongArity("lock.scan")));
        assert_eq!(parse(&["-1"]), Err(LockError::BadCursor("'-1'".into())));
        assert_eq!(parse(&["x"]), Err(LockError::BadCursor("'x'".into())));
        assert_eq!(
            parse(&["0", "COUNT", "0"]),
            Err(LockError::BadCount("'0'".into()))
        );
        assert_eq!(
            parse(&["0", "COUNT", "y"]),
            Err(LockError::BadCount("'y'".into()))
        );
        assert_eq!(
            parse(&["0", "MATCH"]),
            Err(LockError::MissingScanArgument("MATCH"))
        );
        assert_eq!(
            parse(&["0", "COUNT"]),
            Err(LockError::MissingScanArgument("COUNT"))
        );
        let long: &'static str = "*a".repeat(MAX_PATTERN_LEN).leak();
        assert_eq!(
            parse(&["0", "MATCH", long]),
            Err(LockError::PatternTooLong(
                2 * MAX_PATTERN_LEN,
                MAX_PATTERN_LEN
            ))
        );
        assert_eq!(
            parse(&["0", "WAITING", "WAITING"]),
            Err(LockError::UnknownOption("'WAITING'".into()))
        );
        assert_eq!(
            parse(&["0", "TYPE", "string"]),
            Err(LockError::UnknownOption("'TYPE'".into()))
        );
    }
}
