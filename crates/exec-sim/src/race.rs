//! A dynamic race detector: while steps execute, it tracks per byte range the last writer and the readers since,
//! and checks every new access against them with vector clocks per stream (happens-before from stream order and
//! Record -> Wait, as executed). The first conflicting pair (write/write, write/read or read/write, unordered)
//! is reported.
//!
//! Independent of `graph_plan::verify` (a second, dynamic opinion): it shares no code with it and sees only the
//! bytes each step actually touches (kernel params, copy ranges).
//!
//! Clocks: stream s keeps `vc[s]`; each step on s first ticks `vc[s][s]`. An access is (stream t, epoch e); it
//! happens-before the current step of stream s iff `vc[s][t] >= e`. A Record snapshots its stream's clock; a
//! Wait joins the snapshot of the Record it depends on. Shadow memory is an interval map per region whose
//! segments hold the last write and, per stream, the latest read since it. O(segments touched) per access.

use graph_plan::{Access, BufferRef, KernelId, Region, StepId, StreamId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One side of a race.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaceAccess {
    /// The step.
    pub step: StepId,
    /// Its stream.
    pub stream: StreamId,
    /// The kernel (None for a copy).
    pub kernel: Option<KernelId>,
    /// What the step runs (node names, or "copy").
    pub what: String,
    /// Read or write.
    pub access: Access,
}

impl fmt::Display for RaceAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = match self.access {
            Access::Read => "read",
            Access::Write => "write",
        };
        match self.kernel {
            Some(k) => write!(f, "{a} by step {} on {} (kernel {k} [{}])", self.step, self.stream, self.what),
            None => write!(f, "{a} by step {} on {} ({})", self.step, self.stream, self.what),
        }
    }
}

/// Two accesses to overlapping bytes, at least one a write, that no happens-before path orders.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaceReport {
    /// The earlier access in execution order.
    pub first: RaceAccess,
    /// The later access.
    pub second: RaceAccess,
    /// The region.
    pub region: Region,
    /// The overlapping bytes `[start, end)`.
    pub range: (u64, u64),
}

impl fmt::Display for RaceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "race on {}[{}..{}): {} is not ordered with {}",
            self.region.name(),
            self.range.0,
            self.range.1,
            self.first,
            self.second
        )
    }
}

#[derive(Clone, Copy, Debug)]
struct Acc {
    step: usize,
    stream: u32,
    epoch: u32,
}

#[derive(Clone, Debug, Default)]
struct Seg {
    end: u64,
    write: Option<Acc>,
    reads: Vec<Acc>,
}

/// Who did a step: for messages.
#[derive(Clone, Debug)]
pub(crate) struct StepLabel {
    pub kernel: Option<KernelId>,
    pub what: String,
}

/// The detector's state over one run.
pub(crate) struct RaceDetector {
    vc: Vec<Vec<u32>>,
    record_clock: Vec<Option<Vec<u32>>>,
    shadow: [BTreeMap<u64, Seg>; 4],
    labels: Vec<StepLabel>,
    streams: Vec<StreamId>,
}

impl RaceDetector {
    pub fn new(num_streams: usize, labels: Vec<StepLabel>, streams: Vec<StreamId>) -> Self {
        RaceDetector {
            vc: vec![vec![0; num_streams]; num_streams],
            record_clock: vec![None; labels.len()],
            shadow: Default::default(),
            labels,
            streams,
        }
    }

    /// Tick the clock of `stream` for step `step`; returns the access epoch.
    pub fn begin(&mut self, stream: usize) -> u32 {
        self.vc[stream][stream] += 1;
        self.vc[stream][stream]
    }

    /// A Record: snapshot the stream's clock.
    pub fn record(&mut self, step: usize, stream: usize) {
        self.record_clock[step] = Some(self.vc[stream].clone());
    }

    /// A Wait joining the clock of Record step `rec` (if it ran).
    pub fn wait(&mut self, stream: usize, rec: Option<usize>) {
        if let Some(c) = rec.and_then(|r| self.record_clock[r].as_ref()) {
            for (a, &b) in self.vc[stream].iter_mut().zip(c) {
                *a = (*a).max(b);
            }
        }
    }

    fn ordered(&self, stream: usize, a: &Acc) -> bool {
        self.vc[stream][a.stream as usize] >= a.epoch
    }

    fn side(&self, a: &Acc, access: Access) -> RaceAccess {
        let l = &self.labels[a.step];
        RaceAccess {
            step: StepId::from_index(a.step),
            stream: self.streams[a.step],
            kernel: l.kernel,
            what: l.what.clone(),
            access,
        }
    }

    /// Split the segments of `region` so that `[lo, hi)` is covered exactly by segments (gaps filled).
    fn carve(&mut self, region: Region, lo: u64, hi: u64) {
        let map = &mut self.shadow[region.index()];
        // Split a segment straddling lo, and one straddling hi.
        for cut in [lo, hi] {
            if let Some((&s, seg)) = map.range(..cut).next_back() {
                if seg.end > cut {
                    let mut right = seg.clone();
                    let left_end = cut;
                    right.end = seg.end;
                    if let Some(l) = map.get_mut(&s) {
                        l.end = left_end;
                    }
                    map.insert(cut, right);
                }
            }
        }
        // Fill gaps inside [lo, hi).
        let mut at = lo;
        let starts: Vec<(u64, u64)> = map.range(lo..hi).map(|(&s, seg)| (s, seg.end)).collect();
        let mut gaps = Vec::new();
        for (s, e) in starts {
            if s > at {
                gaps.push((at, s));
            }
            at = e;
        }
        if at < hi {
            gaps.push((at, hi));
        }
        for (s, e) in gaps {
            map.insert(s, Seg { end: e, write: None, reads: Vec::new() });
        }
    }

    /// Check then apply the accesses of one step (reads first, then writes; a step never races with itself).
    pub fn access(
        &mut self,
        step: usize,
        stream: usize,
        epoch: u32,
        accesses: &[(BufferRef, Access)],
    ) -> Result<(), Box<RaceReport>> {
        let me = Acc { step, stream: stream as u32, epoch };
        for &(b, kind) in accesses {
            if b.bytes == 0 {
                continue;
            }
            let (lo, hi) = (b.offset, b.end());
            self.carve(b.region, lo, hi);
            let segs: Vec<(u64, Seg)> =
                self.shadow[b.region.index()].range(lo..hi).map(|(&s, seg)| (s, seg.clone())).collect();
            for (s, seg) in &segs {
                let range = (*s, seg.end);
                if let Some(w) = seg.write {
                    if w.step != step && !self.ordered(stream, &w) {
                        return Err(Box::new(RaceReport {
                            first: self.side(&w, Access::Write),
                            second: self.side(&me, kind),
                            region: b.region,
                            range,
                        }));
                    }
                }
                if kind == Access::Write {
                    for r in &seg.reads {
                        if r.step != step && !self.ordered(stream, r) {
                            return Err(Box::new(RaceReport {
                                first: self.side(r, Access::Read),
                                second: self.side(&me, Access::Write),
                                region: b.region,
                                range,
                            }));
                        }
                    }
                }
            }
        }
        // Apply: reads join the read set (one per stream: the latest), writes reset it.
        for &(b, kind) in accesses {
            if b.bytes == 0 {
                continue;
            }
            let map = &mut self.shadow[b.region.index()];
            for (_, seg) in map.range_mut(b.offset..b.end()) {
                match kind {
                    Access::Read => {
                        seg.reads.retain(|r| r.stream != me.stream);
                        seg.reads.push(me);
                    }
                    Access::Write => {
                        seg.write = Some(me);
                        seg.reads.clear();
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(offset: u64, bytes: u64) -> BufferRef {
        BufferRef { region: Region::Pool, offset, bytes }
    }

    fn det(n: usize) -> RaceDetector {
        let labels =
            (0..n).map(|i| StepLabel { kernel: Some(KernelId::from_index(i)), what: format!("n{i}") }).collect();
        RaceDetector::new(2, labels, vec![StreamId(0), StreamId(1), StreamId(0), StreamId(1)])
    }

    #[test]
    fn unordered_write_then_read_is_a_race_on_the_overlap() {
        let mut d = det(4);
        let e = d.begin(0);
        d.access(0, 0, e, &[(buf(0, 100), Access::Write)]).unwrap();
        let e = d.begin(1);
        let r = d.access(1, 1, e, &[(buf(50, 100), Access::Read)]).unwrap_err();
        assert_eq!(r.range, (50, 100));
        assert_eq!(r.first.step, StepId(0));
        assert_eq!(r.second.access, Access::Read);
    }

    #[test]
    fn record_wait_orders_and_disjoint_ranges_never_race() {
        let mut d = det(4);
        let e = d.begin(0);
        d.access(0, 0, e, &[(buf(0, 100), Access::Write)]).unwrap();
        d.begin(0);
        d.record(2, 0);
        d.begin(1);
        d.wait(1, Some(2));
        let e = d.begin(1);
        d.access(3, 1, e, &[(buf(0, 100), Access::Read), (buf(100, 8), Access::Write)]).unwrap();
        // stream 0 writes what stream 1 read without ordering: read/write race.
        let e = d.begin(0);
        let r = d.access(2, 0, e, &[(buf(96, 4), Access::Write)]).unwrap_err();
        assert_eq!((r.first.access, r.second.access), (Access::Read, Access::Write));
        assert_eq!(r.range, (96, 100));
    }

    #[test]
    fn same_stream_accesses_are_ordered() {
        let mut d = det(4);
        for step in [0, 2] {
            let e = d.begin(0);
            d.access(step, 0, e, &[(buf(0, 64), Access::Read), (buf(0, 64), Access::Write)]).unwrap();
        }
    }
}
