//! Glob patterns as Redis matches them (`SCAN ... MATCH`, `KEYS`): `*` any
//! run of bytes, `?` one byte, `[abc]`, `[^abc]`, `[a-z]` one byte of a
//! set, `\x` the byte x. Case-sensitive, byte-wise. A `[` left open matches
//! itself up to the end of the pattern, as Redis's does.

/// Whether `name` matches `pattern`.
pub fn matches(pattern: &[u8], name: &[u8]) -> bool {
    // The classic two-pointer walk: on a mismatch after a `*`, go back to
    // just after it and let the star take one more byte. Linear in the
    // common case, never exponential (Redis's recursive one can be).
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p, n));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {
                    if let Some((taken, next)) = one(&pattern[p..], name[n]) {
                        if taken {
                            p += next;
                            n += 1;
                            continue;
                        }
                    }
                }
            }
        }
        match star {
            Some((sp, sn)) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Whether the pattern's first element (not `*` or `?`) matches `byte`,
/// and how many pattern bytes it spans.
fn one(pattern: &[u8], byte: u8) -> Option<(bool, usize)> {
    match pattern[0] {
        b'\\' if pattern.len() > 1 => Some((pattern[1] == byte, 2)),
        b'[' => Some(class(pattern, byte)),
        c => Some((c == byte, 1)),
    }
}

/// A `[...]` set at the start of `pattern`: whether it holds `byte`, and
/// its length (to the closing `]`, or the whole pattern when unclosed).
fn class(pattern: &[u8], byte: u8) -> (bool, usize) {
    let mut i = 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut found = false;
    while i < pattern.len() && pattern[i] != b']' {
        if pattern[i] == b'\\' && i + 1 < pattern.len() {
            found |= pattern[i + 1] == byte;
            i += 2;
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            let (a, b) = (pattern[i], pattern[i + 2]);
            let (lo, hi) = (a.min(b), a.max(b));
            found |= (lo..=hi).contains(&byte);
            i += 3;
        } else {
            found |= pattern[i] == byte;
            i += 1;
        }
    }
    // Past the `]` (an unclosed set runs to the end).
    let len = (i + 1).min(pattern.len());
    (found != negate, len)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn redis_glob_cases() {
        let yes = |p: &str, n: &str| assert!(matches(p.as_bytes(), n.as_bytes()), "{p} {n}");
        let no = |p: &str, n: &str| assert!(!matches(p.as_bytes(), n.as_bytes()), "{p} {n}");
        yes("*", "");
        yes("*", "orders:1");
        yes("orders:*", "orders:1");
        no("orders:*", "order:1");
        yes("h?llo", "hello");
        no("h?llo", "hllo");
        yes("h*llo", "hllo");
        yes("h*llo", "heeeello");
        yes("h[ae]llo", "hallo");
        no("h[ae]llo", "hillo");
        yes("h[^e]llo", "hallo");
        no("h[^e]llo", "hello");
        yes("h[a-b]llo", "hbllo");
        yes("h[b-a]llo", "hallo");
        no("h[a-b]llo", "hcllo");
        yes("h\\*llo", "h*llo");
        no("h\\*llo", "hello");
        yes("[\\]]", "]");
        yes("a*b*c", "axxbyyc");
        no("a*b*c", "axxbyy");
        yes("*:*:*", "a:b:c");
        no("", "a");
        yes("", "");
        yes("**", "x");
        // Binary names match byte for byte.
        assert!(matches(b"k\xff*", b"k\xff\x00"));
        // Many stars against a long miss stay fast (no backtracking blow-up).
        let long = "a".repeat(10_000);
        no(&"*a".repeat(50), &(long.clone() + "b"));
        no("*a*a*a*a*a*a*a*a*b", &long);
    }
}
