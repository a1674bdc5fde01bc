//! Check 4, bounds: every range of a launch, a copy or a binding lies inside its region and starts at a
//! multiple of the plan's alignment, but for the slots of eliminated Concats the plan lists
//! (`ExecutionPlan::slots`), which start at a multiple of the slot alignment; a copy moves no more bytes than
//! its source and destination hold. O(ranges + slots log slots).

use crate::ids::StepId;
use crate::plan::{BufferRef, PlanStep};

use super::index::Index;
use super::violation::{Site, Violation};

pub(super) fn check(ix: &Index<'_>, out: &mut Vec<Violation>) {
    let plan = ix.plan;
    // An alignment of 0 would be a broken header; treat it as "no requirement" rather than divide by it.
    let align = plan.alignment().max(1);
    // The slot alignment is the rule's for this alignment (`graph_passes::target::slot_alignment_for`), or what
    // the plan declares where that is stricter: a plan cannot loosen it by declaring less.
    let slot_align = graph_passes::target::slot_alignment_for(align).max(plan.slot_alignment());
    // Slots: inside their region and at the slot alignment; a range off `align` must be one of them.
    for (i, s) in plan.slots().iter().enumerate() {
        let size = plan.region_bytes(s.region);
        if s.offset.checked_add(s.bytes).is_none_or(|end| end > size) {
            out.push(Violation::OutOfRegion { site: Site::Slot(i), range: *s, region_bytes: size });
        }
        if s.offset % slot_align != 0 {
            out.push(Violation::Misaligned { site: Site::Slot(i), range: *s, alignment: slot_align });
        }
    }
    let mut slots: Vec<BufferRef> = plan.slots().to_vec();
    slots.sort_unstable();
    let range = |site: &dyn Fn() -> Site, b: &BufferRef, out: &mut Vec<Violation>| {
        let size = plan.region_bytes(b.region);
        // `checked_add`: an offset near u64::MAX must not wrap back inside the region.
        if b.offset.checked_add(b.bytes).is_none_or(|end| end > size) {
            out.push(Violation::OutOfRegion { site: site(), range: *b, region_bytes: size });
        }
        // A range the plan does not list as a slot needs the plan's alignment.
        if b.offset % align != 0 && slots.binary_search(b).is_err() {
            out.push(Violation::Misaligned { site: site(), range: *b, alignment: align });
        }
    };
    for (i, step) in plan.steps.iter().enumerate() {
        let site = || Site::Step(StepId::from_index(i));
        match step {
            PlanStep::Launch { reads, writes, .. } => {
                for b in reads.iter().chain(writes) {
                    range(&site, b, out);
                }
            }
            PlanStep::Copy { src, dst, bytes, .. } => {
                range(&site, src, out);
                range(&site, dst, out);
                if *bytes > src.bytes || *bytes > dst.bytes {
                    out.push(Violation::CopyLength {
                        step: StepId::from_index(i),
                        bytes: *bytes,
                        src: *src,
                        dst: *dst,
                    });
                }
            }
            PlanStep::Record { .. } | PlanStep::Wait { .. } => {}
        }
    }
    for b in plan.bindings() {
        range(&|| Site::Binding(b.name.to_string()), &b.buffer, out);
    }
}
