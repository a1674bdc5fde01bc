//! `verify`: an independent checker of a finished plan (DESIGN.md section 4), in the spirit of regalloc2's
//! checker. It re-derives everything from the plan's steps, kernels, bindings, nodes and reuse edges, shares
//! no code with graph-passes, and returns every violation it finds, not the first.
//!
//! The invariants, by check:
//! 1. coverage (`coverage.rs`): every non-view node runs in exactly one launched kernel's body or one `Copy`
//!    step, but eliminated Concats (`PlanNode::eliminated`: their inputs' writers fill the output's slices, and
//!    checks 2 and 3 see that a reader of the output finds each slice written by its writer, all ordered
//!    before it); every launch names an existing kernel, each kernel is launched at most once; a launch's
//!    `reads` and `writes` are the sets of its kernel's Read and Write param buffers.
//! 2. order (`replay.rs`): a launch whose Read param names root R happens after every launch of a kernel
//!    with a Write param of root R; every reuse edge `from -> to` is ordered; happens-before is stream order
//!    plus record -> wait; each event is recorded once, and every wait follows a record of its event in
//!    submission order.
//! 3. memory (`replay.rs`, `shadow.rs`): no two accesses to overlapping bytes of a region, one a write, are
//!    unordered (the accesses of one step never conflict with each other); and every launch reads its
//!    tensors' bytes as their writer left them (last written by a launch of the tensor's writer kernel, or,
//!    for inputs, weights, constants and copy destinations, by no launch).
//! 4. bounds (`bounds.rs`): every range of a step or a binding lies inside its region and is aligned to
//!    `plan.alignment()`, but the slots of eliminated Concats the plan lists (`plan.slots()`), which are
//!    aligned to `plan.slot_alignment()`; a copy moves no more bytes than its ranges hold.
//! 5. counters (`counters.rs`): `kernel_count_original`, `kernel_count_fused`, `event_count`, `pool_bytes`
//!    and `num_streams` agree with the nodes, steps and regions; every step's stream is below `num_streams`.
//!
//! Complexity: O(S (W + log S)) time for S steps and W streams, plus the kernels' instructions and params;
//! O(S + N + E W) space for N shadow-memory segments and E events in flight. A million-step plan takes about
//! a second of CPU (the `verify` bench in `benches/`). Step, stream and event numbers are `u32`, as their ids
//! are.

mod bounds;
mod counters;
mod coverage;
mod index;
mod replay;
mod shadow;
mod violation;

pub use replay::MAX_CHECKED_STREAMS;
pub use violation::{Check, Field, Site, StepRef, Violation};

use crate::plan::ExecutionPlan;

/// Check `plan` against the five invariants of DESIGN.md section 4. `Err` lists every violation found, by check
/// (coverage, order and memory, bounds, counters) and within a check in step order.
pub fn verify(plan: &ExecutionPlan) -> Result<(), Vec<Violation>> {
    let _span = tracing::debug_span!("verify", steps = plan.steps.len()).entered();
    let ix = index::Index::new(plan);
    let mut v = Vec::new();
    coverage::check(&ix, &mut v);
    replay::check(&ix, &mut v);
    bounds::check(&ix, &mut v);
    counters::check(&ix, &mut v);
    if v.is_empty() {
        Ok(())
    } else {
        Err(v)
    }
}
