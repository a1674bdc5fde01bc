//! graph-passes: the analyses cuplan runs over a `ComputeGraph`, in pipeline order
//! `topo -> liveness -> fusion -> memory -> stream`. Each pass is a module with a plain function over immutable
//! inputs that returns a documented, serde-serialisable struct; no pass mutates the graph, so each can be tested
//! and inspected alone. `graph-plan` runs them in sequence and linearises the result into an `ExecutionPlan`.
//!
//! `device` holds the cost model (device profiles, per-launch grid, time and occupancy) and `timing` the
//! event-driven evaluator of launches on streams (processor sharing by occupancy, the makespan bound), both
//! shared by the stream pass, graph-plan's report and the simulator's timing model.

// Library code returns typed errors; tests may unwrap (clippy.toml allows it inside #[test] and #[cfg(test)]).
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod counting;
pub mod device;
pub mod error;
pub mod estimate;
pub mod fusion;
pub mod fuzz_entry;
pub mod group_graph;
pub mod ids;
pub mod interval;
mod landmarks;
pub mod memory;
pub mod order;
pub mod precision;
mod sorted_map;
pub mod stream;
pub mod target;
#[cfg(test)]
mod test_rng;
pub mod timing;
pub mod topo;

pub use error::{InternalError, PlanError, PlanResult};
pub use group_graph::GroupGraph;
pub use ids::{BufferId, GroupId, StreamId, UnitId};
pub use interval::Interval;

/// Whether planning may split independent work across threads: the machine runs two threads at once (asked
/// once per process) and `RAYON_NUM_THREADS` (rayon's own setting, which the large plans' parallel loops obey)
/// does not say 1. The passes that split work across scoped threads (the stream pass's candidates, a build's
/// stream pass beside lowering) do so only then; their plans are the same either way.
pub fn multi_core() -> bool {
    static CORES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| {
        let one = std::env::var("RAYON_NUM_THREADS").is_ok_and(|v| v.trim() == "1");
        !one && std::thread::available_parallelism().map_or(1, |n| n.get()) > 1
    })
}
