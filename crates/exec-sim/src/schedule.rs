//! Execution orders of a plan's steps: submission order, or a seeded adversarial order consistent with
//! happens-before (stream order plus Record -> Wait), chosen so that a missing event changes results.
//!
//! The constraints: a step may run once the previous step of its stream ran; a Wait additionally needs the
//! Record of its event that precedes it in submission order (CUDA semantics: a wait on an event with no earlier
//! record is a no-op). Any order satisfying them is one a GPU could produce, so a correct plan gives the same
//! results under every one of them.
//!
//! The adversary picks, among the runnable heads of the streams (one per stream):
//! - seed % 3 == 0: the step submitted last ("run the consumer first"): producers on other streams are delayed
//!   as long as the constraints allow, so a consumer that lacks a Wait runs before its producer;
//! - seed % 3 == 1: a fixed seeded priority over streams: the favoured stream runs as far ahead as the
//!   constraints let it, which exposes missing waits in either direction over the seeds;
//! - seed % 3 == 2: uniformly at random among the runnable heads.
//!
//! O(S) per step for S streams.

use graph_plan::ir::rng::SplitMix64;
use graph_plan::{ExecutionPlan, PlanStep};
use serde::{Deserialize, Serialize};

/// How the simulator orders the steps of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Schedule {
    /// Submission order.
    #[default]
    Submission,
    /// A seeded adversarial order consistent with stream order and Record/Wait.
    Random {
        /// The seed (also selects the adversary's strategy, see the module doc).
        seed: u64,
    },
}

/// For each step, the Record step a Wait depends on (the latest Record of its event submitted before it).
pub fn wait_dependencies(plan: &ExecutionPlan) -> Vec<Option<usize>> {
    let mut last_record: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    let mut deps = vec![None; plan.steps.len()];
    for (i, s) in plan.steps.iter().enumerate() {
        match s {
            PlanStep::Record { event, .. } => {
                last_record.insert(event.0, i);
            }
            PlanStep::Wait { event, .. } => deps[i] = last_record.get(&event.0).copied(),
            _ => {}
        }
    }
    deps
}

/// Number of streams the steps use (at least the plan's count).
pub fn stream_count(plan: &ExecutionPlan) -> usize {
    plan.steps.iter().map(|s| s.stream().index() + 1).max().unwrap_or(0).max(plan.num_streams).max(1)
}

/// The order in which to execute the steps under `schedule`: a permutation of `0..steps`.
pub fn execution_order(plan: &ExecutionPlan, schedule: Schedule) -> Vec<usize> {
    let n = plan.steps.len();
    let seed = match schedule {
        Schedule::Submission => return (0..n).collect(),
        Schedule::Random { seed } => seed,
    };
    let ns = stream_count(plan);
    let deps = wait_dependencies(plan);
    let mut queues: Vec<Vec<usize>> = vec![Vec::new(); ns];
    for (i, s) in plan.steps.iter().enumerate() {
        queues[s.stream().index()].push(i);
    }
    let mut head = vec![0usize; ns];
    let mut done = vec![false; n];
    let mut rng = SplitMix64::new(seed ^ 0x5eed_5eed_5eed_5eed);
    let strategy = seed % 3;
    // A seeded permutation of stream priorities.
    let mut prio: Vec<u64> = (0..ns as u64).collect();
    for i in (1..ns).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        prio.swap(i, j);
    }
    let mut order = Vec::with_capacity(n);
    let mut runnable: Vec<usize> = Vec::with_capacity(ns);
    while order.len() < n {
        runnable.clear();
        for s in 0..ns {
            if let Some(&i) = queues[s].get(head[s]) {
                if deps[i].is_none_or(|r| done[r]) {
                    runnable.push(s);
                }
            }
        }
        // Submission order is always feasible, so some head is runnable while steps remain.
        let Some(&first) = runnable.first() else { break };
        let s = match strategy {
            0 => runnable.iter().copied().max_by_key(|&s| queues[s][head[s]]).unwrap_or(first),
            1 => runnable.iter().copied().max_by_key(|&s| prio[s]).unwrap_or(first),
            _ => runnable[rng.below(runnable.len() as u64) as usize],
        };
        let i = queues[s][head[s]];
        head[s] += 1;
        done[i] = true;
        order.push(i);
    }
    order
}
