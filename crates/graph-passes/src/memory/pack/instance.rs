//! The prepared instance: validated buffers with aligned sizes, compressed times, loads and components.
//!
//! Zero-size buffers are dropped here (they get offset 0 in the result). Times are compressed to the sorted
//! distinct endpoints; section `s` is the time span between endpoints `s` and `s + 1`, and a buffer covers
//! sections `start..end`. Components are maximal groups of buffers connected through shared sections: no
//! buffer crosses the boundary between two components, so they pack independently.
//!
//! *Peeling*: a buffer live over its component's whole time span can sit at the bottom without loss (in any
//! layout everything else lies wholly above or below it; move it to 0 and shift the ones below up). Such
//! buffers are *pinned*, stacked from the component's base, and the rest is decomposed again above them, which
//! often splits it further. Offsets inside a component are relative to its base.

use super::{Buffer, PackError};

/// One time-disjoint group of buffers.
#[derive(Debug, Clone)]
pub(crate) struct Component {
    /// Internal indices of its buffers, ascending.
    pub members: Vec<usize>,
    /// Its sweep lower bound, relative to its base.
    pub lower_bound: u64,
    /// Its first and one-past-last section.
    pub sections: (u32, u32),
    /// Offset of its floor: the pinned buffers below it.
    pub base: u64,
}

/// Validated, aligned, time-compressed buffers. Internal index `i` is the `i`-th buffer of non-zero size.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    /// Original index of each internal buffer.
    pub orig: Vec<usize>,
    /// Aligned size.
    pub size: Vec<u64>,
    /// Original lifetime length (`upper - lower`).
    pub length: Vec<u64>,
    /// First section covered.
    pub start: Vec<u32>,
    /// One past the last section covered.
    pub end: Vec<u32>,
    /// Number of sections (distinct endpoints minus one).
    pub num_sections: usize,
    /// Total aligned size live in each section.
    pub load: Vec<u64>,
    /// Component of each internal buffer (`u32::MAX` for pinned ones).
    pub comp_of: Vec<u32>,
    /// Pinned buffers and their absolute offsets.
    pub pinned: Vec<(usize, u64)>,
    /// The buffers that are not pinned, ascending.
    pub free: Vec<u32>,
    /// The components, in time order.
    pub components: Vec<Component>,
    /// The sweep lower bound of the whole instance.
    pub lower_bound: u64,
}

impl Instance {
    /// Validates and prepares `buffers`. O(n log n). One piece on purpose: validation, the sweep bound and the
    /// components come out of one sweep over the sorted endpoints.
    pub fn new(buffers: &[Buffer], alignment: u64) -> Result<Self, PackError> {
        if alignment == 0 {
            return Err(PackError::ZeroAlignment);
        }
        let mut orig = Vec::new();
        let mut size = Vec::new();
        for (index, b) in buffers.iter().enumerate() {
            if b.lower >= b.upper {
                return Err(PackError::InvalidInterval { index, lower: b.lower, upper: b.upper });
            }
            if b.size == 0 {
                continue;
            }
            let aligned =
                b.size.div_ceil(alignment).checked_mul(alignment).ok_or(PackError::Overflow { index, size: b.size })?;
            orig.push(index);
            size.push(aligned);
        }
        let n = orig.len();

        // Compress times: sort all endpoints once, then give every buffer the rank of its endpoints.
        let mut points: Vec<(u64, u32)> = Vec::with_capacity(2 * n);
        for (i, &o) in orig.iter().enumerate() {
            points.push((buffers[o].lower, 2 * i as u32));
            points.push((buffers[o].upper, 2 * i as u32 + 1));
        }
        // Only the times' order matters (ties get one rank whatever their order): by counting when they are
        // small, as a plan's steps are.
        if !crate::counting::sort_small(&mut points, |p| p.0) {
            points.sort_unstable();
        }
        let mut start = vec![0u32; n];
        let mut end = vec![0u32; n];
        let mut rank = 0u32;
        for k in 0..points.len() {
            if k > 0 && points[k].0 != points[k - 1].0 {
                rank += 1;
            }
            let id = points[k].1;
            if id % 2 == 0 {
                start[(id / 2) as usize] = rank;
            } else {
                end[(id / 2) as usize] = rank;
            }
        }
        let num_sections = if n == 0 { 0 } else { rank as usize };
        drop(points);

        // Section loads (u128 while summing, so an overflowing pool is reported, not wrapped) and crossings.
        let mut diff = vec![0i128; num_sections + 1];
        for i in 0..n {
            diff[start[i] as usize] += i128::from(size[i]);
            diff[end[i] as usize] -= i128::from(size[i]);
        }
        let mut load = vec![0u64; num_sections];
        let mut acc = 0i128;
        for s in 0..num_sections {
            acc += diff[s];
            load[s] = match u64::try_from(acc) {
                Ok(v) => v,
                Err(_) => {
                    // Name a buffer live in the overflowing section.
                    let index =
                        (0..n).find(|&i| (start[i] as usize) <= s && s < end[i] as usize).map_or(0, |i| orig[i]);
                    return Err(PackError::Overflow { index, size: buffers[index].size });
                }
            };
        }

        // Components, peeled recursively. Members are kept sorted by start, so a sweep finds the cuts.
        let by_start = crate::counting::indices_by_key(n, |i| u64::from(start[i]));
        let mut work: Vec<(Vec<usize>, u64)> = split(&by_start, &start, &end).into_iter().map(|m| (m, 0)).collect();
        let mut components = Vec::new();
        let mut pinned = Vec::new();
        // Peeling is O(members) per level; a cap keeps deeply nested inputs near-linear.
        let mut peel_budget = 8 * n + 64;
        while let Some((members, base)) = work.pop() {
            let lo = members.iter().map(|&i| start[i]).min().unwrap_or(0);
            let hi = members.iter().map(|&i| end[i]).max().unwrap_or(0);
            let (full, rest): (Vec<usize>, Vec<usize>) = if peel_budget >= members.len() {
                peel_budget -= members.len();
                members.iter().partition(|&&i| start[i] == lo && end[i] == hi)
            } else {
                (Vec::new(), members.clone())
            };
            if full.is_empty() || rest.is_empty() && full.len() == 1 {
                // Nothing to peel (or a lone buffer, which packs at its base anyway).
                let lower_bound = load[lo as usize..hi as usize].iter().copied().max().unwrap_or(0) - base;
                let mut members = members;
                members.sort_unstable();
                components.push(Component { members, lower_bound, sections: (lo, hi), base });
                continue;
            }
            let mut top = base;
            for &i in &full {
                // Cannot overflow: `top` stays below the load of section `lo`, which fits in u64.
                pinned.push((i, top));
                top += size[i];
            }
            for part in split(&rest, &start, &end) {
                work.push((part, top));
            }
        }
        components.sort_unstable_by_key(|c| (c.sections.0, c.base));
        let mut comp_of = vec![u32::MAX; n];
        for (c, comp) in components.iter().enumerate() {
            for &i in &comp.members {
                comp_of[i] = c as u32;
            }
        }
        pinned.sort_unstable();
        let free = (0..n as u32).filter(|&i| comp_of[i as usize] != u32::MAX).collect();
        let lower_bound = load.iter().copied().max().unwrap_or(0);
        let length = orig.iter().map(|&o| buffers[o].upper - buffers[o].lower).collect();
        Ok(Instance {
            orig,
            size,
            length,
            start,
            end,
            num_sections,
            load,
            comp_of,
            components,
            pinned,
            free,
            lower_bound,
        })
    }

    /// The top of the highest pinned buffer (0 if none).
    pub fn pinned_height(&self) -> u64 {
        self.pinned.iter().map(|&(i, o)| o + self.size[i]).max().unwrap_or(0)
    }

    /// Number of (non-zero-size) buffers.
    pub fn len(&self) -> usize {
        self.orig.len()
    }

    /// Offsets in input order (zero-size buffers at 0) from offsets relative to each component's base.
    pub fn scatter(&self, relative: &[u64], total: usize) -> Result<Vec<u64>, PackError> {
        let mut out = vec![0u64; total];
        for (i, &o) in self.orig.iter().enumerate() {
            let c = self.comp_of[i];
            if c != u32::MAX {
                out[o] = relative[i]
                    .checked_add(self.components[c as usize].base)
                    .ok_or(PackError::Overflow { index: o, size: self.size[i] })?;
            }
        }
        for &(i, offset) in &self.pinned {
            out[self.orig[i]] = offset;
        }
        Ok(out)
    }
}

/// Splits `members` (sorted by start) into groups that share no section.
fn split(members: &[usize], start: &[u32], end: &[u32]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut reach = 0u32;
    for &i in members {
        match groups.last_mut() {
            Some(g) if start[i] < reach => g.push(i),
            _ => groups.push(vec![i]),
        }
        reach = if groups.last().is_some_and(|g| g.len() == 1) { end[i] } else { reach.max(end[i]) };
    }
    groups
}
