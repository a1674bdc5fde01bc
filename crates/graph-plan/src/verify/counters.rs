//! Check 5, counters: the header fields agree with the steps, the nodes and the regions; every step's stream
//! is below `num_streams`. O(steps), using the dense numbering of the shared index.

use graph_passes::memory::Region;

use crate::ids::StepId;
use crate::plan::PlanStep;

use super::index::Index;
use super::violation::{Field, Violation};

pub(super) fn check(ix: &Index<'_>, out: &mut Vec<Violation>) {
    let plan = ix.plan;
    let mut counter = |field: Field, claimed: u64, actual: u64| {
        if claimed != actual {
            out.push(Violation::Counter { field, claimed, actual });
        }
    };
    let non_view = plan.nodes().iter().filter(|n| !n.view).count() as u64;
    counter(Field::KernelCountOriginal, plan.kernel_count_original as u64, non_view);
    let launches = plan.steps.iter().filter(|s| matches!(s, PlanStep::Launch { .. })).count() as u64;
    counter(Field::KernelCountFused, plan.kernel_count_fused as u64, launches);
    counter(Field::EventCount, plan.event_count as u64, ix.num_events as u64);
    counter(Field::PoolBytes, plan.pool_bytes as u64, plan.region_bytes(Region::Pool));
    if plan.num_streams == 0 {
        // Every step would be out of range; say it once.
        let used = plan.steps.iter().map(|s| u64::from(s.stream().0) + 1).max().unwrap_or(1);
        counter(Field::NumStreams, 0, used);
        return;
    }
    let n = plan.num_streams as u64;
    for (i, s) in plan.steps.iter().enumerate() {
        if u64::from(s.stream().0) >= n {
            out.push(Violation::StreamOutOfRange { step: StepId::from_index(i), stream: s.stream(), num_streams: n });
        }
    }
}
