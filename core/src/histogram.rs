//! Power-of-two histograms of durations (wait and hold times in `INFO
//! lock`): bucket `i` counts durations of at most 2^i ms, the last one
//! everything longer. Reported cumulatively, as Prometheus' `le` buckets.

/// Buckets of ≤ 1, 2, 4, ... 2^20 ms (about 17 minutes), then +inf.
pub const BUCKETS: usize = 22;

/// The bucket a duration of `ms` falls in (negative counts as 0).
pub fn bucket_of(ms: i64) -> usize {
    if ms <= 1 {
        return 0;
    }
    // The smallest i with ms <= 2^i.
    let i = 64 - (ms as u64 - 1).leading_zeros() as usize;
    i.min(BUCKETS - 1)
}

/// The upper bound of bucket `i` in ms, or None for the last (+inf).
pub fn bound_ms(i: usize) -> Option<i64> {
    (i < BUCKETS - 1).then(|| 1i64 << i)
}

/// The field name of bucket `i`: `le_1`, `le_2`, ... `le_inf`.
pub fn bucket_name(i: usize) -> String {
    match bound_ms(i) {
        Some(ms) => format!("le_{ms}"),
        None => "le_inf".to_string(),
    }
}

/// Running totals, bucket by bucket: what a cumulative `le` bucket shows.
pub fn cumulative(counts: &[u64; BUCKETS]) -> [u64; BUCKETS] {
    let mut out = [0; BUCKETS];
    let mut total = 0u64;
    for (i, n) in counts.iter().enumerate() {
        total = total.saturating_add(*n);
        out[i] = total;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_duration_falls_in_the_smallest_bucket_that_holds_it() {
        for (ms, bucket) in [
            (-5, 0),
            (0, 0),
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (1024, 10),
            (1025, 11),
            (1 << 20, 20),
            ((1 << 20) + 1, 21),
            (i64::MAX, 21),
        ] {
            assert_eq!(bucket_of(ms), bucket, "{ms} ms");
            if let Some(bound) = bound_ms(bucket) {
                assert!(ms <= bound);
            }
            if bucket > 0 {
                assert!(ms > bound_ms(bucket - 1).unwrap());
            }
        }
    }

    #[test]
    fn names_and_cumulative_counts() {
        assert_eq!(bucket_name(0), "le_1");
        assert_eq!(bucket_name(3), "le_8");
        assert_eq!(bucket_name(BUCKETS - 1), "le_inf");
        let mut counts = [0; BUCKETS];
        counts[0] = 2;
        counts[3] = 1;
        counts[BUCKETS - 1] = 4;
        let c = cumulative(&counts);
        assert_eq!(
            (c[0], c[2], c[3], c[BUCKETS - 2], c[BUCKETS - 1]),
            (2, 2, 3, 3, 7)
        );
    }
}
