//! Shadow memory for check 3: per region, an interval map over byte ranges (a `BTreeMap` from segment start to
//! segment) that covers the whole region at all times. Each segment holds the last write to its bytes and, per
//! stream, the latest read since that write: if the latest reader on a stream happens-before a new write, so
//! do the earlier ones (stream order), so one entry per stream suffices.
//!
//! An access splits the segments at its two ends, then visits the k segments inside: O((k + 1) log n) for a
//! map of n segments. A write replaces the k segments with one, so segments never outnumber twice the
//! distinct range ends seen.
//!
//! After a conflict is reported the location's state moves on (the new write becomes its last writer), so one
//! missing synchronisation is reported once per location and access, not again by every later access.

use std::collections::BTreeMap;

use crate::ids::KernelId;
use crate::plan::{Access, BufferRef};

use super::index::NONE;

/// One access by one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Acc {
    /// Step index.
    pub step: u32,
    /// Its sequence number on its stream (1-based).
    pub seq: u32,
    /// Its dense stream number.
    pub stream: u32,
    /// The kernel it launches, `NONE` for a copy.
    pub kernel: u32,
}

#[derive(Clone, Debug)]
struct Seg {
    end: u64,
    writer: Option<Acc>,
    /// The latest read per stream since the write: one inline (most bytes are read from one stream), the
    /// rest spilled (a `Vec` per segment would be a million allocations on a million-tensor plan).
    reader: Option<Acc>,
    more: Option<Box<[Acc]>>,
}

impl Seg {
    fn readers(&self) -> impl Iterator<Item = &Acc> {
        self.reader.iter().chain(self.more.iter().flat_map(|m| m.iter()))
    }

    fn add_reader(&mut self, me: Acc) {
        match self.reader {
            None => self.reader = Some(me),
            Some(r) if r.stream == me.stream => self.reader = Some(me),
            Some(_) => match self.more.as_deref_mut().and_then(|m| m.iter_mut().find(|r| r.stream == me.stream)) {
                Some(r) => *r = me,
                None => {
                    let mut v = self.more.take().map(Vec::from).unwrap_or_default();
                    v.push(me);
                    self.more = Some(v.into_boxed_slice());
                }
            },
        }
    }

    fn overwrite(&mut self, me: Acc) {
        self.writer = Some(me);
        self.reader = None;
        self.more = None;
    }
}

/// Who last wrote (in submission order) the bytes of a read range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// Every byte by this access (`None`: by nothing).
    One(Option<Acc>),
    /// Different bytes by different accesses (or an empty range).
    Mixed,
}

impl Seen {
    fn add(this: &mut Option<Seen>, w: Option<Acc>) {
        *this = match *this {
            None => Some(Seen::One(w)),
            Some(Seen::One(x)) if x.map(|a| a.step) == w.map(|a| a.step) => Some(Seen::One(x)),
            Some(_) => Some(Seen::Mixed),
        };
    }
}

/// What the last writer of a read range must be, for the read to see its tensor.
#[derive(Clone, Copy, Debug)]
pub(super) enum Expect<'a> {
    /// Nothing checked (a copy's source, or a tensor whose writer has not run yet: reported elsewhere).
    Any,
    /// A launch of one of these kernels.
    Writers(&'a [KernelId]),
    /// No launch (an input, weight or constant, or a copy's destination): nothing, or a copy.
    NoLaunch,
}

/// A finding on part of an access's range.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hit {
    /// `Some(access of the earlier step)` for a race; `None` for a read that does not see its writer.
    pub race: Option<Access>,
    /// The earlier step: the racing one, or the wrong last writer (`None`: nothing wrote the bytes).
    pub other: Option<Acc>,
    /// First byte.
    pub lo: u64,
    /// One past the last byte.
    pub hi: u64,
}

/// The shadow memory of every region.
pub(super) struct Shadow {
    maps: [BTreeMap<u64, Seg>; 4],
    keys: Vec<u64>,
}

fn fresh() -> BTreeMap<u64, Seg> {
    let mut m = BTreeMap::new();
    m.insert(0, Seg { end: u64::MAX, writer: None, reader: None, more: None });
    m
}

/// Make `at` a segment boundary.
fn split(map: &mut BTreeMap<u64, Seg>, at: u64) {
    let right = match map.range_mut(..=at).next_back() {
        Some((&start, seg)) if start < at && at < seg.end => {
            let right = seg.clone();
            seg.end = at;
            right
        }
        _ => return,
    };
    map.insert(at, right);
}

fn expect_hit(expect: Expect<'_>, writer: Option<Acc>) -> bool {
    match expect {
        Expect::Any => false,
        Expect::Writers(ks) => match writer {
            Some(w) => w.kernel == NONE || !ks.contains(&KernelId(w.kernel)),
            None => true,
        },
        Expect::NoLaunch => writer.is_some_and(|w| w.kernel != NONE),
    }
}

impl Shadow {
    pub(super) fn new() -> Self {
        Shadow { maps: [fresh(), fresh(), fresh(), fresh()], keys: Vec::new() }
    }

    /// Record that `me` reads `b`. Pushes a race hit for each part whose last writer is not `ordered` before
    /// `me`; returns who last wrote the bytes.
    pub(super) fn read(&mut self, b: BufferRef, me: Acc, ordered: impl Fn(&Acc) -> bool, hits: &mut Vec<Hit>) -> Seen {
        let (region, lo, hi) = (b.region, b.offset, b.end());
        if lo >= hi {
            return Seen::Mixed;
        }
        let map = &mut self.maps[region.index()];
        let mut seen = None;
        let mut visit = |start: u64, seg: &mut Seg, hits: &mut Vec<Hit>| {
            if let Some(w) = seg.writer {
                if w.step != me.step && !ordered(&w) {
                    hits.push(Hit { race: Some(Access::Write), other: Some(w), lo: start, hi: seg.end });
                }
            }
            Seen::add(&mut seen, seg.writer);
            seg.add_reader(me);
        };
        // Fast path: the range is exactly one segment (a tensor read where it was written), one descent.
        match map.range_mut(..=lo).next_back() {
            Some((&start, seg)) if start == lo && seg.end == hi => visit(start, seg, hits),
            _ => {
                split(map, lo);
                split(map, hi);
                for (&start, seg) in map.range_mut(lo..hi) {
                    visit(start, seg, hits);
                }
            }
        }
        seen.unwrap_or(Seen::Mixed)
    }

    /// Check, without recording a read, that the last writers of `b` are what `expect` says.
    pub(super) fn probe(&self, b: BufferRef, expect: Expect<'_>, hits: &mut Vec<Hit>) {
        let (region, lo, hi) = (b.region, b.offset, b.end());
        if lo >= hi {
            return;
        }
        let map = &self.maps[region.index()];
        let first = map.range(..=lo).next_back().map_or(lo, |(&s, _)| s);
        for (&start, seg) in map.range(first..hi) {
            if seg.end > lo && expect_hit(expect, seg.writer) {
                hits.push(Hit { race: None, other: seg.writer, lo: start.max(lo), hi: seg.end.min(hi) });
            }
        }
    }

    /// Record that `me` writes `b`. Pushes a race hit for each part whose last writer or
    /// any reader since is not `ordered` before `me`.
    pub(super) fn write(&mut self, b: BufferRef, me: Acc, ordered: impl Fn(&Acc) -> bool, hits: &mut Vec<Hit>) {
        let (region, lo, hi) = (b.region, b.offset, b.end());
        if lo >= hi {
            return;
        }
        let map = &mut self.maps[region.index()];
        let check = |lo: u64, hi: u64, seg: &Seg, hits: &mut Vec<Hit>| {
            if let Some(w) = seg.writer {
                if w.step != me.step && !ordered(&w) {
                    hits.push(Hit { race: Some(Access::Write), other: Some(w), lo, hi });
                }
            }
            for r in seg.readers() {
                if r.step != me.step && !ordered(r) {
                    hits.push(Hit { race: Some(Access::Read), other: Some(*r), lo, hi });
                }
            }
        };
        // Fast path: the range lies inside one segment (bytes reused at the same place, or a first write into
        // untouched bytes): one descent, at most two inserts.
        if let Some((&start, seg)) = map.range_mut(..=lo).next_back() {
            if seg.end >= hi {
                check(lo, hi, seg, hits);
                if start == lo && seg.end == hi {
                    seg.overwrite(me);
                    return;
                }
                let right = (seg.end > hi).then(|| seg.clone());
                let mut mid = seg.clone();
                mid.end = hi;
                mid.overwrite(me);
                if start == lo {
                    *seg = mid;
                } else {
                    seg.end = lo;
                    map.insert(lo, mid);
                }
                if let Some(r) = right {
                    map.insert(hi, r);
                }
                return;
            }
        }
        split(map, lo);
        split(map, hi);
        self.keys.clear();
        for (&start, seg) in map.range(lo..hi) {
            check(start, seg.end, seg, hits);
            self.keys.push(start);
        }
        // The write covers [lo, hi) whole: one segment, written by `me`, read by nobody since.
        for k in self.keys.iter().skip(1) {
            map.remove(k);
        }
        if let Some(seg) = map.get_mut(&lo) {
            seg.end = hi;
            seg.overwrite(me);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graph_passes::memory::Region;

    fn r(region: Region, lo: u64, hi: u64) -> BufferRef {
        BufferRef { region, offset: lo, bytes: hi - lo }
    }

    fn acc(step: u32, stream: u32) -> Acc {
        Acc { step, seq: step + 1, stream, kernel: step }
    }

    #[test]
    fn half_open_ranges_that_touch_do_not_conflict() {
        let mut sh = Shadow::new();
        let mut hits = Vec::new();
        sh.write(r(Region::Pool, 0, 256), acc(0, 0), |_| false, &mut hits);
        sh.write(r(Region::Pool, 256, 512), acc(1, 1), |_| false, &mut hits);
        sh.read(r(Region::Pool, 512, 768), acc(2, 1), |_| false, &mut hits);
        assert!(hits.is_empty(), "{hits:?}");
        // One byte of overlap is a conflict, clipped to that byte.
        sh.read(r(Region::Pool, 255, 256), acc(3, 1), |_| false, &mut hits);
        assert_eq!(hits.len(), 1);
        assert_eq!(
            (hits[0].lo, hits[0].hi, hits[0].race, hits[0].other.map(|a| a.step)),
            (255, 256, Some(Access::Write), Some(0))
        );
    }

    #[test]
    fn readers_per_stream_and_writes_merge_segments() {
        let mut sh = Shadow::new();
        let mut hits = Vec::new();
        sh.write(r(Region::Pool, 0, 100), acc(0, 0), |_| true, &mut hits);
        sh.read(r(Region::Pool, 0, 50), acc(1, 1), |_| true, &mut hits);
        sh.read(r(Region::Pool, 50, 100), acc(2, 2), |_| true, &mut hits);
        assert!(hits.is_empty());
        // A write ordered after step 1 only: races with the stream-2 reader on [50, 100).
        sh.write(r(Region::Pool, 0, 100), acc(3, 0), |a| a.step != 2, &mut hits);
        assert_eq!(hits.len(), 1);
        assert_eq!((hits[0].lo, hits[0].hi, hits[0].other.map(|a| a.step)), (50, 100, Some(2)));
        assert_eq!(sh.maps[0].len(), 2, "[0,100) and [100,MAX)");
        // Other regions are separate.
        hits.clear();
        sh.write(r(Region::Weights, 0, 100), acc(4, 1), |_| false, &mut hits);
        assert!(hits.is_empty());
    }

    #[test]
    fn reads_say_who_wrote_and_probes_check_expectations() {
        let mut sh = Shadow::new();
        let mut hits = Vec::new();
        let k = [KernelId(0)];
        assert_eq!(sh.read(r(Region::Pool, 0, 10), acc(9, 0), |_| true, &mut hits), Seen::One(None));
        sh.probe(r(Region::Pool, 0, 10), Expect::Writers(&k), &mut hits);
        assert_eq!(hits.len(), 1, "never written");
        assert!(hits[0].other.is_none());
        hits.clear();
        sh.write(r(Region::Pool, 0, 10), acc(0, 0), |_| true, &mut hits);
        assert_eq!(sh.read(r(Region::Pool, 0, 10), acc(1, 0), |_| true, &mut hits), Seen::One(Some(acc(0, 0))));
        assert_eq!(sh.read(r(Region::Pool, 5, 20), acc(2, 0), |_| true, &mut hits), Seen::Mixed);
        sh.probe(r(Region::Pool, 0, 10), Expect::Writers(&k), &mut hits);
        assert!(hits.is_empty());
        sh.probe(r(Region::Pool, 2, 4), Expect::NoLaunch, &mut hits);
        assert_eq!((hits[0].lo, hits[0].hi), (2, 4));
    }

    #[test]
    fn a_write_inside_one_segment_splits_it_in_three() {
        let mut sh = Shadow::new();
        let mut hits = Vec::new();
        sh.write(r(Region::Pool, 0, 300), acc(0, 0), |_| true, &mut hits);
        sh.read(r(Region::Pool, 0, 300), acc(1, 1), |_| true, &mut hits);
        // Unordered with the reader: the hit is the written part only.
        sh.write(r(Region::Pool, 100, 200), acc(2, 0), |a| a.step == 0, &mut hits);
        assert_eq!(hits.len(), 1);
        assert_eq!((hits[0].lo, hits[0].hi, hits[0].race), (100, 200, Some(Access::Read)));
        let starts: Vec<u64> = sh.maps[0].keys().copied().collect();
        assert_eq!(starts, vec![0, 100, 200, 300]);
        assert_eq!(sh.read(r(Region::Pool, 0, 100), acc(3, 0), |_| true, &mut hits), Seen::One(Some(acc(0, 0))));
        assert_eq!(sh.read(r(Region::Pool, 100, 200), acc(4, 0), |_| true, &mut hits), Seen::One(Some(acc(2, 0))));
        assert_eq!(sh.read(r(Region::Pool, 200, 300), acc(5, 0), |_| true, &mut hits), Seen::One(Some(acc(0, 0))));
    }
}
