//! The one macro for dense typed indices, used by every crate of the workspace (graph-passes' `GroupId`,
//! graph-plan's `KernelId`, the timing evaluator's `TaskId`, ...). A dense id is a `u32` newtype: one per index
//! space, so that a buffer number can never be passed where a group number is meant. Its `Display` is a short
//! prefix and the number (`g3`, `k7`), the same text the plan dump prints.

/// Define a dense typed index: `dense_id!(/// doc, Name, "prefix")` gives a `Copy + Ord + Hash` newtype over
/// `u32` with `index()`, `from_index()`, serde as a bare number, and `Display` as `prefix` + number.
#[macro_export]
macro_rules! dense_id {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub u32);

        impl $name {
            /// The id as a `usize` index.
            pub fn index(self) -> usize {
                self.0 as usize
            }

            /// The id of index `i` (saturating at `u32::MAX`, far beyond any graph or plan we build).
            pub fn from_index(i: usize) -> Self {
                $name(u32::try_from(i).unwrap_or(u32::MAX))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    dense_id!(
        /// A test id.
        Probe,
        "p"
    );

    #[test]
    fn round_trips_and_prints() {
        assert_eq!(Probe::from_index(7).index(), 7);
        assert_eq!(Probe::from_index(usize::MAX), Probe(u32::MAX));
        assert_eq!(Probe(3).to_string(), "p3");
        assert_eq!(serde_json::to_string(&Probe(5)).unwrap(), "5");
    }
}
