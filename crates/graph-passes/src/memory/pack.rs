//! Packing core: offsets for plain buffers with lifetimes, so that no two buffers live at the same time share
//! bytes. (Baseline: greedy by size with best fit; the packing issue replaces it with the full solver.)

use std::time::Duration;
use thiserror::Error;

/// A buffer live over the half-open time interval `[lower, upper)` that needs `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buffer {
    /// First time step (inclusive).
    pub lower: u64,
    /// One past the last time step.
    pub upper: u64,
    /// Bytes.
    pub size: u64,
}

/// How much effort the packer may spend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Deterministic effort limit (search steps).
    pub effort: u64,
    /// Optional wall-clock limit.
    pub time: Option<Duration>,
}

/// Packing options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackOptions {
    /// Offsets are multiples of this (>= 1).
    pub alignment: u64,
    /// Effort budget.
    pub budget: Budget,
    /// Seed for randomised phases.
    pub seed: u64,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions { alignment: 1, budget: Budget::default(), seed: 0 }
    }
}

/// A packing: one offset per buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packing {
    /// Offset of each buffer, in input order.
    pub offsets: Vec<u64>,
    /// Highest end offset (the pool size).
    pub height: u64,
    /// Largest total aligned size live at one time.
    pub lower_bound: u64,
}

/// Invalid packing input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PackError {
    /// A buffer's interval is empty or reversed.
    #[error("buffer {index}: interval [{lower}, {upper}) is empty")]
    EmptyInterval {
        /// Buffer index.
        index: usize,
        /// Lower.
        lower: u64,
        /// Upper.
        upper: u64,
    },
    /// Offsets overflow u64.
    #[error("buffer {index}: offset arithmetic overflows")]
    Overflow {
        /// Buffer index.
        index: usize,
    },
}

fn align_up(v: u64, a: u64) -> Option<u64> {
    v.checked_add(a - 1).map(|x| x / a * a)
}

/// Largest total aligned size live at any time.
pub fn lower_bound(buffers: &[Buffer], alignment: u64) -> u64 {
    let a = alignment.max(1);
    let mut ev: Vec<(u64, i128)> = Vec::with_capacity(buffers.len() * 2);
    for b in buffers {
        let s = align_up(b.size, a).unwrap_or(u64::MAX) as i128;
        ev.push((b.lower, s));
        ev.push((b.upper, -s));
    }
    ev.sort_by_key(|&(t, d)| (t, d));
    let (mut cur, mut best) = (0i128, 0i128);
    for (_, d) in ev {
        cur += d;
        best = best.max(cur);
    }
    best as u64
}

/// Pack `buffers` (baseline: greedy by size, best fit among time-overlapping placed buffers).
pub fn pack(buffers: &[Buffer], opts: &PackOptions) -> Result<Packing, PackError> {
    let a = opts.alignment.max(1);
    for (index, b) in buffers.iter().enumerate() {
        if b.lower >= b.upper {
            return Err(PackError::EmptyInterval { index, lower: b.lower, upper: b.upper });
        }
    }
    let mut idx: Vec<usize> = (0..buffers.len()).collect();
    idx.sort_by_key(|&i| (std::cmp::Reverse(buffers[i].size), buffers[i].lower, i));
    let mut offsets = vec![0u64; buffers.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut height = 0u64;
    for &i in &idx {
        let b = buffers[i];
        let size = align_up(b.size, a).ok_or(PackError::Overflow { index: i })?;
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| buffers[j].lower < b.upper && b.lower < buffers[j].upper)
            .map(|&j| (offsets[j], offsets[j] + align_up(buffers[j].size, a).unwrap_or(u64::MAX)))
            .collect();
        busy.sort_unstable();
        let (mut best, mut best_gap, mut cursor) = (None, u64::MAX, 0u64);
        for &(s, e) in &busy {
            if s > cursor && s - cursor >= size && s - cursor < best_gap {
                best = Some(cursor);
                best_gap = s - cursor;
            }
            cursor = cursor.max(e);
        }
        let off = best.unwrap_or(cursor);
        offsets[i] = off;
        height = height.max(off.checked_add(size).ok_or(PackError::Overflow { index: i })?);
        placed.push(i);
    }
    Ok(Packing { offsets, height, lower_bound: lower_bound(buffers, a) })
}
