//! List scheduling of groups onto `k` streams, under the timing evaluator's model, for DAGs with more chains
//! than streams.
//!
//! An event-driven simulation: whenever a stream is idle and a group is ready (all its predecessors finished),
//! the ready group with the longest path to the end (bottom level; ties: the earlier group) starts. Its stream
//! is chosen among the idle ones to save events: the stream that just ran its chain predecessor (the matching's
//! choice), else one whose last group is a predecessor of it, else the idle stream with the lowest index. The
//! start sequence is the submission order (a topological order: a group starts after its predecessors end),
//! and replaying it in the evaluator gives the same schedule.
//!
//! Under processor sharing every running launch slows by the same factor, so the order of events in the
//! evaluator's virtual time is the order in wall time: the decisions need only launch times, not occupancies.
//! O((N + E) log N + N k).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::csr::Csr;

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

/// A running group, ordered by virtual deadline (earliest first), then index.
#[derive(Clone, Copy)]
struct Running {
    deadline: f64,
    group: u32,
}

impl PartialEq for Running {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Running {}
impl PartialOrd for Running {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Running {
    fn cmp(&self, o: &Self) -> Ordering {
        o.deadline.total_cmp(&self.deadline).then(o.group.cmp(&self.group))
    }
}

/// The result: each group's stream and the submission order.
pub struct Schedule {
    /// Stream of each group.
    pub stream_of: Vec<u32>,
    /// Groups in start order.
    pub order: Vec<u32>,
}

/// Schedule the DAG (`preds`: reduced predecessor rows) on `k` streams. `time` includes launch overhead;
/// `prev[g]` is g's chain predecessor (`u32::MAX`: none).
pub fn list_schedule(preds: &Csr, time: &[f64], bottom: &[f64], prev: &[u32], k: usize) -> Schedule {
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
    let mut idle_count = k;
    loop {
        while idle_count > 0 {
            let Some(r) = ready.pop() else { break };
            let g = r.group as usize;
            let ps = preds.row(g);
            let pick = (0..k)
                .filter(|&s| idle[s])
                .min_by_key(|&s| {
                    let l = last_on[s];
                    let rank = if l != u32::MAX && l == prev[g] {
                        0
                    } else if l != u32::MAX && ps.binary_search(&l).is_ok() {
                        1
                    } else {
                        2
                    };
                    (rank, s)
                })
                .unwrap_or(0);
            idle[pick] = false;
            idle_count -= 1;
            last_on[pick] = g as u32;
            stream_of[g] = pick as u32;
            order.push(g as u32);
            running.push(Running { deadline: virt + time[g], group: g as u32 });
        }
        let Some(first) = running.pop() else { break };
        virt = virt.max(first.deadline);
        let mut done = vec![first.group];
        while running.peek().is_some_and(|r| r.deadline <= virt) {
            if let Some(r) = running.pop() {
                done.push(r.group);
            }
        }
        for g in done {
            let g = g as usize;
            idle[stream_of[g] as usize] = true;
            idle_count += 1;
            for &v in succs.row(g) {
                waiting[v as usize] -= 1;
                if waiting[v as usize] == 0 {
                    ready.push(Ready { bottom: bottom[v as usize], group: v });
                }
            }
        }
    }
    Schedule { stream_of, order }
}
