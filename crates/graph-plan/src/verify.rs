//! `verify`: an independent checker of a finished plan (DESIGN.md section 4), written from the steps alone and
//! sharing no code with the passes. It returns every violation it finds.
//!
//! (Initial version: counters and bounds. Coverage, ordering and memory checks follow.)

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::ids::StepId;
use crate::plan::{ExecutionPlan, PlanStep};
use graph_passes::memory::Region;

/// One way a plan breaks an invariant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Violation {
    /// A buffer range lies outside its region or is misaligned.
    Bounds {
        /// The step.
        step: StepId,
        /// What is wrong.
        detail: String,
    },
    /// A header counter disagrees with the steps.
    Counter {
        /// The field.
        field: &'static str,
        /// Its value.
        claimed: u64,
        /// What the steps say.
        actual: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Bounds { step, detail } => write!(f, "bounds at {step}: {detail}"),
            Violation::Counter { field, claimed, actual } => {
                write!(f, "counter {field}: claims {claimed}, steps say {actual}")
            }
        }
    }
}

/// Check `plan`; `Err` lists every violation.
pub fn verify(plan: &ExecutionPlan) -> Result<(), Vec<Violation>> {
    let mut v = Vec::new();
    let a = plan.alignment().max(1);
    for (i, step) in plan.steps.iter().enumerate() {
        let bufs: Vec<_> = match step {
            PlanStep::Launch { reads, writes, .. } => reads.iter().chain(writes).copied().collect(),
            PlanStep::Copy { src, dst, .. } => vec![*src, *dst],
            _ => Vec::new(),
        };
        for b in bufs {
            let size = plan.region_bytes(b.region);
            if b.end() > size || b.offset % a != 0 {
                v.push(Violation::Bounds {
                    step: StepId::from_index(i),
                    detail: format!("{b} in a region of {size} bytes"),
                });
            }
        }
    }
    let launches = plan.steps.iter().filter(|s| matches!(s, PlanStep::Launch { .. })).count() as u64;
    if plan.kernel_count_fused as u64 != launches {
        v.push(Violation::Counter {
            field: "kernel_count_fused",
            claimed: plan.kernel_count_fused as u64,
            actual: launches,
        });
    }
    if plan.pool_bytes != plan.region_bytes(Region::Pool) {
        v.push(Violation::Counter {
            field: "pool_bytes",
            claimed: plan.pool_bytes,
            actual: plan.region_bytes(Region::Pool),
        });
    }
    if v.is_empty() {
        Ok(())
    } else {
        Err(v)
    }
}
