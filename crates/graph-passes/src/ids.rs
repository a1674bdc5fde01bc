//! Dense typed indices for the passes' outputs. Their `Display` is the text the plan dump prints.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! dense_id {
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

            /// The id of index `i` (saturating at `u32::MAX`, far beyond any plan we build).
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

dense_id!(
    /// A fused group (one future kernel launch), indexed in the fusion plan's execution order.
    GroupId,
    "g"
);
dense_id!(
    /// A CUDA stream of the plan.
    StreamId,
    "s"
);
