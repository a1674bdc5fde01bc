//! Choosing bucket sizes for an observed distribution of request sizes.
//!
//! A request of size `s` runs on the smallest bucket `b >= s` and pays for `b` (padded work). Given a histogram
//! (distinct sizes with counts) and at most `k` buckets, [`choose`] finds the buckets that minimise the expected
//! padded work exactly: the optimal buckets are observed sizes and the largest is the largest size, so a DP over
//! the sorted sizes (`best[j][m]`: sizes up to `j` covered by `m` buckets, the last at size `j`) is exact, in
//! O(k n^2) for n distinct sizes.

use super::spec::SetError;

/// Most distinct sizes a histogram may hold (the DP is quadratic in them).
pub const MAX_SIZES: usize = 4096;

/// A histogram of request sizes: distinct sizes, ascending, with their counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    /// (size, count), sizes strictly ascending, sizes and counts >= 1.
    pub bins: Vec<(usize, u64)>,
}

impl Histogram {
    /// A histogram from (size, count) pairs in any order; equal sizes add up. Errors for no requests, a size
    /// or count of 0, or more than [`MAX_SIZES`] distinct sizes.
    pub fn new(pairs: impl IntoIterator<Item = (usize, u64)>) -> Result<Histogram, SetError> {
        let mut bins: Vec<(usize, u64)> = Vec::new();
        for (s, c) in pairs {
            if s == 0 {
                return Err(SetError::Histogram("a request size of 0".into()));
            }
            if c == 0 {
                return Err(SetError::Histogram(format!("size {s} has a count of 0")));
            }
            bins.push((s, c));
        }
        bins.sort_unstable();
        let mut merged: Vec<(usize, u64)> = Vec::with_capacity(bins.len());
        for (s, c) in bins {
            match merged.last_mut() {
                Some(l) if l.0 == s => {
                    l.1 =
                        l.1.checked_add(c).ok_or_else(|| SetError::Histogram(format!("count of size {s} overflows")))?
                }
                _ => merged.push((s, c)),
            }
        }
        if merged.is_empty() {
            return Err(SetError::Histogram("no requests".into()));
        }
        if merged.len() > MAX_SIZES {
            return Err(SetError::Histogram(format!("{} distinct sizes; at most {MAX_SIZES}", merged.len())));
        }
        Ok(Histogram { bins: merged })
    }

    /// Parse a histogram file: one request size per line (`SIZE`), or `SIZE COUNT` / `SIZE,COUNT`; blank lines
    /// and `#` comments are skipped. Errors name the line.
    pub fn parse(text: &str) -> Result<Histogram, SetError> {
        let mut pairs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> =
                line.split(|c: char| c == ',' || c.is_whitespace()).filter(|f| !f.is_empty()).collect();
            let bad = |what: &str| SetError::Histogram(format!("line {}: {what} in {line:?}", i + 1));
            let (s, c) = match fields[..] {
                [s] => (s, "1"),
                [s, c] => (s, c),
                _ => return Err(bad("expected SIZE or SIZE COUNT")),
            };
            let s: usize = s.parse().map_err(|_| bad("the size is not a non-negative integer"))?;
            let c: u64 = c.parse().map_err(|_| bad("the count is not a non-negative integer"))?;
            if s == 0 {
                return Err(bad("a request size of 0"));
            }
            if c == 0 {
                return Err(bad("a count of 0"));
            }
            pairs.push((s, c));
        }
        Histogram::new(pairs)
    }

    /// Number of requests.
    pub fn requests(&self) -> u64 {
        self.bins.iter().map(|b| b.1).fold(0u64, u64::saturating_add)
    }

    /// Total work of the requests unpadded: sum of size x count.
    pub fn work(&self) -> u128 {
        self.bins.iter().map(|&(s, c)| s as u128 * c as u128).sum()
    }

    /// Padded work with `buckets` (ascending): `None` when a size is above every bucket.
    pub fn padded_work(&self, buckets: &[usize]) -> Option<u128> {
        let mut w = 0u128;
        for &(s, c) in &self.bins {
            let b = *buckets.iter().find(|&&b| b >= s)?;
            w += b as u128 * c as u128;
        }
        Some(w)
    }
}

/// Chosen buckets with their cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The buckets, ascending.
    pub buckets: Vec<usize>,
    /// Padded work: sum over requests of their bucket's size.
    pub padded_work: u128,
}

/// The at most `k` buckets that minimise padded work for `h` (exact; ties go to the fewest buckets, then the
/// smallest sizes). `k` of 0 is an error.
pub fn choose(h: &Histogram, k: usize) -> Result<Choice, SetError> {
    if k == 0 {
        return Err(SetError::Histogram("--max-buckets must be at least 1".into()));
    }
    let n = h.bins.len();
    let k = k.min(n);
    // prefix[i]: count of sizes [0, i).
    let mut prefix = vec![0u128; n + 1];
    for (i, &(_, c)) in h.bins.iter().enumerate() {
        prefix[i + 1] = prefix[i] + c as u128;
    }
    // best[m][j]: least padded work of sizes [0, j] with m + 1 buckets, the last at size j; from[m][j]: the
    // previous bucket's index.
    let inf = u128::MAX;
    let mut best = vec![vec![inf; n]; k];
    let mut from = vec![vec![usize::MAX; n]; k];
    for j in 0..n {
        best[0][j] = h.bins[j].0 as u128 * prefix[j + 1];
    }
    for m in 1..k {
        for j in m..n {
            let sj = h.bins[j].0 as u128;
            for i in (m - 1)..j {
                if best[m - 1][i] == inf {
                    continue;
                }
                let c = best[m - 1][i] + sj * (prefix[j + 1] - prefix[i + 1]);
                if c < best[m][j] {
                    best[m][j] = c;
                    from[m][j] = i;
                }
            }
        }
    }
    // The fewest buckets reaching the least cost.
    let (mut m, mut cost) = (0, best[0][n - 1]);
    for (mm, row) in best.iter().enumerate().skip(1) {
        if row[n - 1] < cost {
            (m, cost) = (mm, row[n - 1]);
        }
    }
    let mut buckets = Vec::with_capacity(m + 1);
    let mut j = n - 1;
    loop {
        buckets.push(h.bins[j].0);
        if m == 0 {
            break;
        }
        j = from[m][j];
        m -= 1;
    }
    buckets.reverse();
    Ok(Choice { buckets, padded_work: cost })
}

/// Powers of two from 1 up to the first one covering the largest size: the usual hand-picked buckets.
pub fn powers_of_two(h: &Histogram) -> Vec<usize> {
    let max = h.bins.last().map_or(1, |b| b.0);
    let mut out = vec![1usize];
    while out.last().is_some_and(|&b| b < max) {
        match out.last().and_then(|b| b.checked_mul(2)) {
            Some(b) => out.push(b),
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute(h: &Histogram, k: usize) -> u128 {
        let sizes: Vec<usize> = h.bins.iter().map(|b| b.0).collect();
        let n = sizes.len();
        let mut best = u128::MAX;
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize > k || mask & (1 << (n - 1)) == 0 {
                continue;
            }
            let b: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).map(|i| sizes[i]).collect();
            best = best.min(h.padded_work(&b).unwrap_or(u128::MAX));
        }
        best
    }

    #[test]
    fn exact_small_case() {
        // 10 requests of 1, 1 of 7, 5 of 8: two buckets {1, 8} cost 10 + 48 = 58.
        let h = Histogram::new([(1, 10), (7, 1), (8, 5)]).unwrap();
        let c = choose(&h, 2).unwrap();
        assert_eq!(c.buckets, vec![1, 8]);
        assert_eq!(c.padded_work, 58);
        // One bucket: everything on 8.
        assert_eq!(choose(&h, 1).unwrap(), Choice { buckets: vec![8], padded_work: 128 });
        // Enough buckets: no padding at all, and no more buckets than sizes.
        let c = choose(&h, 10).unwrap();
        assert_eq!((c.buckets, c.padded_work), (vec![1, 7, 8], h.work()));
        assert_eq!(powers_of_two(&h), vec![1, 2, 4, 8]);
    }

    #[test]
    fn hostile_histograms_are_typed_errors() {
        assert!(matches!(Histogram::parse(""), Err(SetError::Histogram(_))));
        assert!(matches!(Histogram::parse("3\n0 2\n"), Err(SetError::Histogram(m)) if m.contains("line 2")));
        assert!(matches!(Histogram::parse("3 0"), Err(SetError::Histogram(m)) if m.contains("count of 0")));
        assert!(matches!(Histogram::parse("x"), Err(SetError::Histogram(m)) if m.contains("line 1")));
        assert!(matches!(Histogram::parse("1 2 3"), Err(SetError::Histogram(_))));
        let h = Histogram::parse("# sizes\n4\n4\n2, 3\n").unwrap();
        assert_eq!(h.bins, vec![(2, 3), (4, 2)]);
        assert!(matches!(choose(&h, 0), Err(SetError::Histogram(_))));
    }

    proptest! {
        #[test]
        fn dp_matches_brute_force(bins in proptest::collection::btree_map(1usize..200, 1u64..50, 1..9), k in 1usize..6) {
            let h = Histogram::new(bins).unwrap();
            let c = choose(&h, k).unwrap();
            prop_assert_eq!(c.padded_work, brute(&h, k));
            prop_assert_eq!(h.padded_work(&c.buckets), Some(c.padded_work));
            prop_assert!(c.buckets.len() <= k);
            prop_assert_eq!(c.buckets.last().copied(), h.bins.last().map(|b| b.0));
        }
    }
}
