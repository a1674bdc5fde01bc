//! Checks 2 (order) and 3 (memory) in one replay of the steps in submission order.
//!
//! Happens-before comes from vector clocks over streams. Each step ticks its stream's own entry and gets that
//! value as its sequence number; a Record snapshots its stream's clock; a Wait joins (entry-wise max) the
//! snapshot of the event's latest record into its stream's clock. Step A happens-before the current step B iff
//! `clock[stream(B)][stream(A)] >= seq(A)`. Happens-before is consistent with submission order, so every check
//! compares the current step with earlier ones only, and needs only the current clocks: no per-step clock
//! vectors are kept.
//!
//! - order: at each launch, every writer launch of each root its Read params name, and the `from` launch of
//!   every reuse edge into it, must happen before it; a wait must follow a record of its event; an event is
//!   recorded once.
//! - memory: each launch's `reads` then `writes` (a copy's `src` then `dst`) go through the shadow memory
//!   (`shadow.rs`), which reports unordered conflicting accesses and says who last wrote the bytes read.
//!
//! A Read param's writer is found by name without a table in the usual case: if the launch that last wrote
//! the bytes has a Write param of the same root, that launch is the writer (checked for happens-before) and
//! the read sees its tensor; if nothing or a copy wrote them and the root is an input, weight or constant, the
//! read sees its source. Otherwise the writers are looked up in the root table (built on first need) and the
//! bytes are checked against them: a read that sees someone else's bytes is `Clobbered`. (A root with
//! several writer kernels, which no valid plan has, is checked against the one whose bytes the read sees.)
//!
//! Cost: O(W) per wait and per record for W streams, O(log n) per range end plus the segments visited in the
//! shadow memory of n segments, a string comparison per Read param: O(steps * (W + log steps)) in all.

use crate::ids::{EventId, KernelId, StepId};
use crate::plan::{Access, BufferRef, ExecutionPlan, Param, PlanStep};

use super::index::{Index, NONE};
use super::shadow::{Acc, Expect, Hit, Seen, Shadow};
use super::violation::Violation;

/// Most distinct streams the checker handles: clock rows and snapshots cost O(streams) each. Plans have at
/// most `MAX_STREAMS` (64).
pub const MAX_CHECKED_STREAMS: usize = 4 * crate::MAX_STREAMS;

/// Vector clocks: one row per stream, plus a snapshot row per recorded event that a later wait still reads
/// (a row is freed at the event's last wait and reused, so memory follows the events in flight, not all).
struct Clocks {
    w: usize,
    cur: Vec<u32>,
    snaps: Vec<u32>,
    free: Vec<u32>,
}

impl Clocks {
    /// Does the step `(stream a, seq)` happen before the current point of stream `b`?
    fn hb(&self, a: u32, seq: u32, b: usize) -> bool {
        self.cur[b * self.w + a as usize] >= seq
    }
}

/// Replay the steps in submission order with vector clocks and report every ordering violation. One piece on
/// purpose: the replay state (clocks, pending records, the last writer and readers of each range) is updated
/// step by step and every check reads it at that point; split up, each part would need all of it.
pub(super) fn check(ix: &Index<'_>, out: &mut Vec<Violation>) {
    let plan = ix.plan;
    let w = ix.num_streams;
    if w > MAX_CHECKED_STREAMS {
        out.push(Violation::TooManyStreams { streams: w, limit: MAX_CHECKED_STREAMS });
        return;
    }
    let steps = &plan.steps;
    // Per event: its first record, and its last wait (a record needs a snapshot only if a wait follows it).
    let mut first_record = vec![NONE; ix.num_events];
    let mut last_wait = vec![NONE; ix.num_events];
    for (i, s) in steps.iter().enumerate() {
        let e = ix.event[i] as usize;
        match s {
            PlanStep::Record { .. } if first_record[e] == NONE => first_record[e] = i as u32,
            PlanStep::Wait { .. } => last_wait[e] = i as u32,
            _ => {}
        }
    }
    let orders = reuse_edges(plan, out);

    let mut clocks = Clocks { w, cur: vec![0; w * w], snaps: Vec::new(), free: Vec::new() };
    let mut recorded = vec![NONE; ix.num_events];
    let mut snap_of = vec![NONE; ix.num_events];
    let mut seq = vec![0u32; steps.len()];
    let mut shadow = Shadow::new();
    let mut hits: Vec<Hit> = Vec::new();
    // Roots of the current launch's Read params already checked.
    let mut done: Vec<&str> = Vec::new();

    for (i, step) in steps.iter().enumerate() {
        let iu = i as u32;
        let s = ix.stream[i] as usize;
        let row = s * w;
        clocks.cur[row + s] = clocks.cur[row + s].saturating_add(1);
        seq[i] = clocks.cur[row + s];
        // Did the (earlier) step `a` happen before this one?
        let before =
            |a: u32, clocks: &Clocks, seq: &[u32]| a < iu && clocks.hb(ix.stream[a as usize], seq[a as usize], s);
        match step {
            PlanStep::Record { event, .. } => {
                let e = ix.event[i] as usize;
                if recorded[e] == NONE {
                    recorded[e] = iu;
                } else {
                    out.push(Violation::RecordTwice { event: *event, first: StepId(recorded[e]), again: StepId(iu) });
                }
                // Waits see the latest record (CUDA semantics): overwrite the event's snapshot.
                if last_wait[e] != NONE && last_wait[e] > iu {
                    if snap_of[e] == NONE {
                        snap_of[e] = match clocks.free.pop() {
                            Some(slot) => slot,
                            None => {
                                clocks.snaps.resize(clocks.snaps.len() + w, 0);
                                (clocks.snaps.len() / w - 1) as u32
                            }
                        };
                    }
                    let at = snap_of[e] as usize * w;
                    let (cur, snaps) = (&clocks.cur, &mut clocks.snaps);
                    snaps[at..at + w].copy_from_slice(&cur[row..row + w]);
                }
            }
            PlanStep::Wait { event, .. } => {
                let e = ix.event[i] as usize;
                if recorded[e] != NONE {
                    if snap_of[e] != NONE {
                        let at = snap_of[e] as usize * w;
                        let (cur, snaps) = (&mut clocks.cur, &clocks.snaps);
                        for (c, &x) in cur[row..row + w].iter_mut().zip(&snaps[at..at + w]) {
                            *c = (*c).max(x);
                        }
                        if last_wait[e] == iu {
                            clocks.free.push(snap_of[e]);
                            snap_of[e] = NONE;
                        }
                    }
                } else if first_record[e] != NONE {
                    out.push(wait_before(*event, iu, first_record[e]));
                } else {
                    out.push(Violation::WaitNeverRecorded { event: *event, wait: StepId(iu) });
                }
            }
            PlanStep::Launch { kernel, reads, writes, .. } => {
                let me = Acc { step: iu, seq: seq[i], stream: s as u32, kernel: kernel.0 };
                let params = plan.kernel(*kernel).map(|k| k.params.as_slice()).unwrap_or(&[]);
                let ordered = |a: &Acc| clocks.hb(a.stream, a.seq, s);
                // Writer kernels must happen before this launch.
                let depend = |root: &str, ws: &[KernelId], out: &mut Vec<Violation>| {
                    for &wk in ws {
                        let a = ix.first_launch.get(wk.index()).copied().unwrap_or(NONE);
                        if wk != *kernel && a != NONE && !before(a, &clocks, &seq) {
                            out.push(Violation::Dependency {
                                tensor: root.to_string(),
                                writer: ix.step_ref(a),
                                reader: ix.step_ref(iu),
                            });
                        }
                    }
                };
                done.clear();
                for b in reads {
                    let seen = shadow.read(*b, me, ordered, &mut hits);
                    report(ix, iu, *b, Access::Read, None, &mut hits, out);
                    let bound = |p: &&Param| p.access == Access::Read && p.buffer == *b;
                    for (n, p) in params.iter().enumerate().filter(|(_, p)| bound(p)) {
                        if params[..n].iter().filter(bound).any(|q| q.root == p.root) {
                            continue; // the same tensor bound twice at this range
                        }
                        // Dependencies once per root; the bytes at every range the root is bound to.
                        let first = !done.contains(&p.root.as_ref());
                        if first {
                            done.push(p.root.as_ref());
                        }
                        // Fast path: the launch that last wrote these bytes writes this root by name (or nothing
                        // or a copy wrote them, and the root is a source). Else look the writers up by name.
                        match seen {
                            Seen::One(Some(w)) if w.kernel != NONE && writes_root(ix, w.kernel, &p.root) => {
                                // The writing launch is at hand: no lookup of its stream and position.
                                if first && w.kernel != kernel.0 && !ordered(&w) {
                                    out.push(Violation::Dependency {
                                        tensor: p.root.to_string(),
                                        writer: ix.step_ref(w.step),
                                        reader: ix.step_ref(iu),
                                    });
                                }
                            }
                            Seen::One(w) if w.is_none_or(|w| w.kernel == NONE) && ix.is_source(&p.root) => {}
                            _ => {
                                let ws = ix.writers(&p.root);
                                if first {
                                    depend(&p.root, ws.unwrap_or(&[]), out);
                                }
                                shadow.probe(*b, expectation(ws, iu, ix), &mut hits);
                                report(ix, iu, *b, Access::Read, Some((p.root.as_ref(), ws)), &mut hits, out);
                            }
                        }
                    }
                }
                // Read params at ranges the step does not list (coverage reports that): dependencies by name.
                for p in params.iter().filter(|p| p.access == Access::Read) {
                    if !done.contains(&p.root.as_ref()) {
                        done.push(p.root.as_ref());
                        depend(&p.root, ix.writers(&p.root).unwrap_or(&[]), out);
                    }
                }
                let lo = orders.partition_point(|o| o.0 < *kernel);
                for &(_, from) in orders[lo..].iter().take_while(|o| o.0 == *kernel) {
                    let a = ix.first_launch.get(from.index()).copied().unwrap_or(NONE);
                    if from != *kernel && a != NONE && !before(a, &clocks, &seq) {
                        out.push(Violation::ReuseOrder { from: ix.step_ref(a), to: ix.step_ref(iu) });
                    }
                }
                for b in writes {
                    shadow.write(*b, me, ordered, &mut hits);
                    report(ix, iu, *b, Access::Write, None, &mut hits, out);
                }
            }
            PlanStep::Copy { src, dst, .. } => {
                let me = Acc { step: iu, seq: seq[i], stream: s as u32, kernel: NONE };
                let ordered = |a: &Acc| clocks.hb(a.stream, a.seq, s);
                shadow.read(*src, me, ordered, &mut hits);
                report(ix, iu, *src, Access::Read, None, &mut hits, out);
                shadow.write(*dst, me, ordered, &mut hits);
                report(ix, iu, *dst, Access::Write, None, &mut hits, out);
            }
        }
    }
}

fn wait_before(event: EventId, wait: u32, record: u32) -> Violation {
    Violation::WaitBeforeRecord { event, wait: StepId(wait), record: StepId(record) }
}

/// Reuse edges sorted by `to`, as `(to, from)`; edges naming unknown kernels are reported and dropped.
fn reuse_edges(plan: &ExecutionPlan, out: &mut Vec<Violation>) -> Vec<(KernelId, KernelId)> {
    let n = plan.kernels().len();
    let mut v = Vec::with_capacity(plan.orders().len());
    for o in plan.orders() {
        let mut ok = true;
        for k in [o.from, o.to] {
            if k.index() >= n {
                out.push(Violation::UnknownKernel { step: None, kernel: k });
                ok = false;
            }
        }
        if ok {
            v.push((o.to, o.from));
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Does kernel `k` have a Write param of alias root `root`?
fn writes_root(ix: &Index<'_>, k: u32, root: &str) -> bool {
    ix.plan
        .kernels()
        .get(k as usize)
        .is_some_and(|k| k.params.iter().any(|p| p.access == Access::Write && *p.root == *root))
}

/// What must have last written a range read as a tensor with writer kernels `ws`, by step `i`.
fn expectation<'a>(ws: Option<&'a [KernelId]>, i: u32, ix: &Index<'_>) -> Expect<'a> {
    match ws {
        None => Expect::NoLaunch,
        // Only once a writer has run: a missing or late writer is reported as coverage or order.
        Some(ws) if ws.iter().any(|k| ix.first_launch[k.index()] < i) => Expect::Writers(ws),
        Some(_) => Expect::Any,
    }
}

/// Turn the hits of one access into violations: one per (kind, other step), over the hull of its parts.
fn report(
    ix: &Index<'_>,
    i: u32,
    b: BufferRef,
    access: Access,
    root: Option<(&str, Option<&[KernelId]>)>,
    hits: &mut Vec<Hit>,
    out: &mut Vec<Violation>,
) {
    if hits.is_empty() {
        return;
    }
    let key = |h: &Hit| (h.race.map(|a| a == Access::Write), h.other.map_or(NONE, |a| a.step));
    hits.sort_by_key(|h| (key(h), h.lo));
    let mut j = 0;
    while j < hits.len() {
        let mut h = hits[j];
        j += 1;
        while j < hits.len() && key(&hits[j]) == key(&h) {
            h.hi = h.hi.max(hits[j].hi);
            j += 1;
        }
        let range = BufferRef { region: b.region, offset: h.lo, bytes: h.hi - h.lo };
        match (h.race, h.other) {
            (Some(earlier), Some(other)) => out.push(Violation::Race {
                earlier,
                later: access,
                range,
                first: ix.step_ref(other.step),
                second: ix.step_ref(i),
            }),
            (None, by) => {
                let (tensor, ws) = root.unwrap_or(("?", None));
                let writer = ws.and_then(|ws| {
                    ws.iter().map(|k| ix.first_launch[k.index()]).filter(|&a| a < i).max().map(|a| ix.step_ref(a))
                });
                out.push(Violation::Clobbered {
                    tensor: tensor.to_string(),
                    range,
                    reader: ix.step_ref(i),
                    writer,
                    by: by.map(|a| ix.step_ref(a.step)),
                });
            }
            (Some(_), None) => {}
        }
    }
    hits.clear();
}
