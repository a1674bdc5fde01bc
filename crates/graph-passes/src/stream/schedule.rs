//! Scheduling groups onto `k` streams for DAGs with more chains than streams: two greedy schedulers whose
//! stream choices become candidate assignments.
//!
//! `list_schedule`: an event-driven simulation under the timing evaluator's model. Whenever a stream is idle
//! and a group is ready (all its predecessors finished), the ready group with the longest path to the end
//! (bottom level; ties: the earlier group) starts. Its stream is chosen among the idle ones to save events:
//! the one where it needs the fewest new waits (vector clocks as the sync pass keeps them: a predecessor on
//! another stream needs a wait unless the stream already follows it), then the stream that just ran its chain
//! predecessor (the matching's choice), then one whose last group is a predecessor of it, then the lowest
//! index. Its start sequence is a topological order; used as the submission order, replaying it in the
//! evaluator gives the same schedule. Under processor sharing every running launch slows by the same factor,
//! so the order of events in the evaluator's virtual time is the order in wall time: the decisions need only
//! launch times and, for the capacity-aware variant (which starts a group only when it fits beside what runs,
//! so that off-critical work never slows the critical path of large kernels), the running occupancies.
//! O((N + E) log N + N k).
//!
//! `in_order`: groups in group order, each onto the stream where it can start earliest, so every stream runs
//! its groups in the order the memory plan was made for. O(N k + E).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::csr::Csr;
use crate::timing::Running;

/// A ready group, ordered by bottom level (highest first), then index (lowest first).
#[derive(Clone, Copy)]
struct Ready {
    bottom: f64,
    group: u32,
}

impl PartialEq for Ready {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ready {
    fn cmp(&self, o: &Self) -> Ordering {
        self.bottom.total_cmp(&o.bottom).then(o.group.cmp(&self.group))
    }
}

/// Most entries (groups x streams) of the per-group vector clocks the scheduler keeps (256 MiB of `u32`).
const MAX_CLOCK_ENTRIES: usize = 1 << 26;

/// Vector clocks as the sync pass will compute them (`clock[s][j]`: latest position on stream j that stream s
/// is known to follow), with each group's clock kept for later waits on it, so a scheduler can put a group where
/// it needs the fewest new waits. Off (`track` false, every count 0) when the snapshots would be too large.
struct WaitClocks {
    k: usize,
    track: bool,
    clock: Vec<u32>,
    snapshot: Vec<u32>,
    seq: Vec<u32>,
    count: Vec<u32>,
    waits: Vec<u32>,
}

impl WaitClocks {
    fn new(n: usize, k: usize) -> WaitClocks {
        let track = n.saturating_mul(k) <= MAX_CLOCK_ENTRIES;
        WaitClocks {
            k,
            track,
            clock: vec![0u32; if track { k * k } else { 0 }],
            snapshot: vec![0u32; if track { n * k } else { 0 }],
            seq: vec![0u32; if track { n } else { 0 }],
            count: vec![0u32; k],
            waits: Vec::new(),
        }
    }

    /// Whether stream `s` does not yet know that predecessor `p` has run.
    fn needs(&self, p: u32, stream_of: &[u32], s: usize) -> bool {
        let sp = stream_of[p as usize] as usize;
        sp != s && self.clock[s * self.k + sp] < self.seq[p as usize]
    }

    /// New waits a group with predecessors `ps` would need on stream `s` (0 when not tracking).
    fn new_waits(&self, ps: &[u32], stream_of: &[u32], s: usize) -> usize {
        if !self.track {
            return 0;
        }
        ps.iter().filter(|&&p| self.needs(p, stream_of, s)).count()
    }

    /// Launch group `g` on stream `pick`: take its needed waits latest first (by `position`, as the sync pass
    /// takes them), skipping those an earlier one already implies, then stamp `g` and keep its clock.
    fn launch(&mut self, g: usize, ps: &[u32], stream_of: &[u32], pick: usize, position: impl Fn(u32) -> u32) {
        let k = self.k;
        let mut waits = std::mem::take(&mut self.waits);
        waits.clear();
        waits.extend(ps.iter().copied().filter(|&p| self.needs(p, stream_of, pick)));
        waits.sort_unstable_by_key(|&p| std::cmp::Reverse(position(p)));
        for &p in &waits {
            if !self.needs(p, stream_of, pick) {
                continue;
            }
            for j in 0..k {
                let v = self.snapshot[p as usize * k + j];
                let c = &mut self.clock[pick * k + j];
                *c = (*c).max(v);
            }
        }
        self.waits = waits;
        self.count[pick] += 1;
        self.seq[g] = self.count[pick];
        self.clock[pick * k + pick] = self.seq[g];
        self.snapshot[g * k..g * k + k].copy_from_slice(&self.clock[pick * k..pick * k + k]);
    }
}

/// Tie-break of a stream for a group: 0 when the stream last ran the group's chain predecessor, 1 when it last
/// ran another of its predecessors, else 2.
fn chain_rank(last: u32, chain_prev: u32, ps: &[u32]) -> u8 {
    if last != u32::MAX && last == chain_prev {
        0
    } else if last != u32::MAX && ps.binary_search(&last).is_ok() {
        1
    } else {
        2
    }
}

/// The result: each group's stream and the submission order.
pub struct Schedule {
    /// Stream of each group.
    pub stream_of: Vec<u32>,
    /// Groups in start order.
    pub order: Vec<u32>,
    /// True when the capacity rule held a group back at least once (without it the schedule would differ).
    pub blocked: bool,
}

/// Schedule the DAG (`preds`: reduced predecessor rows) on `k` streams. `time` includes launch overhead;
/// `prev[g]` is g's chain predecessor (`u32::MAX`: none). With `capacity` (the occupancies), a group starts only
/// while the occupancies of the running groups and its own sum to at most 1 (or nothing runs), so it never
/// slows down what is already running; the most urgent ready group is never overtaken.
pub fn list_schedule(
    preds: &Csr,
    time: &[f64],
    bottom: &[f64],
    prev: &[u32],
    k: usize,
    capacity: Option<&[f64]>,
) -> Schedule {
    let n = preds.len();
    let k = k.max(1);
    let succs = preds.transpose(n);
    let mut waiting: Vec<u32> = (0..n).map(|g| preds.row(g).len() as u32).collect();
    let mut ready: BinaryHeap<Ready> = BinaryHeap::new();
    for g in 0..n {
        if waiting[g] == 0 {
            ready.push(Ready { bottom: bottom[g], group: g as u32 });
        }
    }
    let mut idle = vec![true; k];
    let mut last_on: Vec<u32> = vec![u32::MAX; k];
    let mut stream_of = vec![0u32; n];
    let mut order = Vec::with_capacity(n);
    let mut running: BinaryHeap<Running> = BinaryHeap::new();
    let mut virt = 0f64;
    let mut done: Vec<u32> = Vec::new();
    let mut idle_count = k;
    let (mut load, mut running_count, mut blocked) = (0f64, 0usize, false);
    let mut clocks = WaitClocks::new(n, k);
    let mut pos = vec![0u32; if clocks.track { n } else { 0 }];
    loop {
        while idle_count > 0 {
            let Some(&r) = ready.peek() else { break };
            let g = r.group as usize;
            if let Some(occ) = capacity {
                // The most urgent ready group waits rather than slow down what runs; nothing overtakes it.
                if running_count > 0 && load + occ[g] > 1.0 + 1e-9 {
                    blocked = true;
                    break;
                }
                load += occ[g];
            }
            ready.pop();
            running_count += 1;
            let ps = preds.row(g);
            let pick = (0..k)
                .filter(|&s| idle[s])
                .min_by_key(|&s| (clocks.new_waits(ps, &stream_of, s), chain_rank(last_on[s], prev[g], ps), s))
                .unwrap_or(0);
            if clocks.track {
                clocks.launch(g, ps, &stream_of, pick, |p| pos[p as usize]);
                pos[g] = order.len() as u32;
            }
            idle[pick] = false;
            idle_count -= 1;
            last_on[pick] = g as u32;
            stream_of[g] = pick as u32;
            order.push(g as u32);
            running.push(Running { deadline: virt + time[g], task: g });
        }
        let Some(first) = running.pop() else { break };
        virt = virt.max(first.deadline);
        done.clear();
        done.push(first.task as u32);
        while running.peek().is_some_and(|r| r.deadline <= virt) {
            if let Some(r) = running.pop() {
                done.push(r.task as u32);
            }
        }
        for &g in &done {
            let g = g as usize;
            idle[stream_of[g] as usize] = true;
            idle_count += 1;
            running_count -= 1;
            if let Some(occ) = capacity {
                load -= occ[g];
            }
            for &v in succs.row(g) {
                waiting[v as usize] -= 1;
                if waiting[v as usize] == 0 {
                    ready.push(Ready { bottom: bottom[v as usize], group: v });
                }
            }
        }
    }
    Schedule { stream_of, order, blocked }
}

/// Streams for groups kept in group order: each group, in order, goes to the stream where it can start
/// earliest (streams run one launch at a time; ties: fewest new waits, its chain predecessor's stream, a
/// predecessor's stream, the lowest index). Each stream thus runs its groups in group order, the submission
/// order the memory plan was made for. O(N k + E).
pub fn in_order(preds: &Csr, time: &[f64], prev: &[u32], k: usize) -> Vec<u32> {
    let n = preds.len();
    let k = k.max(1);
    let mut avail = vec![0f64; k];
    let mut finish = vec![0f64; n];
    let mut last_on: Vec<u32> = vec![u32::MAX; k];
    let mut stream_of = vec![0u32; n];
    let mut clocks = WaitClocks::new(n, k);
    for g in 0..n {
        let ps = preds.row(g);
        let ready = ps.iter().map(|&p| finish[p as usize]).fold(0f64, f64::max);
        let key = |s: usize| {
            (avail[s].max(ready), clocks.new_waits(ps, &stream_of, s), chain_rank(last_on[s], prev[g], ps), s)
        };
        let mut pick = 0usize;
        let mut best = key(0);
        for s in 1..k {
            let c = key(s);
            if c.0 < best.0 - 1e-12 || (c.0 <= best.0 + 1e-12 && (c.1, c.2, c.3) < (best.1, best.2, best.3)) {
                best = c;
                pick = s;
            }
        }
        if clocks.track {
            // Groups are scheduled in index order, so a group's index is its position.
            clocks.launch(g, ps, &stream_of, pick, |p| p);
        }
        finish[g] = best.0 + time[g];
        avail[pick] = finish[g];
        last_on[pick] = g as u32;
        stream_of[g] = pick as u32;
    }
    stream_of
}
