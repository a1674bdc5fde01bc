//! Dense typed indices of a plan. `Display` gives the text the plan dump prints (`#4`, `k3`, `ev7`, `%2`).

use serde::{Deserialize, Serialize};
use std::fmt;

pub use graph_passes::{GroupId, StreamId};

macro_rules! plan_id {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);

        impl $name {
            /// The id as a `usize` index.
            pub fn index(self) -> usize {
                self.0 as usize
            }

            /// The id of index `i` (saturating at `u32::MAX`).
            pub fn from_index(i: usize) -> Self {
                $name(u32::try_from(i).unwrap_or(u32::MAX))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

plan_id!(
    /// A step's position in submission order.
    StepId,
    "#"
);
plan_id!(
    /// A kernel of the plan (one per launch).
    KernelId,
    "k"
);
plan_id!(
    /// A CUDA event of the plan.
    EventId,
    "ev"
);
plan_id!(
    /// A value of a kernel's program.
    ValueId,
    "%"
);
