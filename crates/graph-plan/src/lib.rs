//! graph-plan: the last stage of cuplan's compiler and the contract with the executors. `ExecutionPlan::build`
//! runs the passes of graph-passes (topo, fusion, the group graph, memory, stream), then lowers the fused groups
//! to kernels, emits one submission order of launches, records, waits and copies over one pre-planned memory
//! layout, and computes the report beside the plan (`build.rs` reads top to bottom). `verify`
//! checks a finished plan independently of the passes. The `Executor` trait is what backends implement.
//!
//! Executor crates depend on this crate alone: it re-exports the IR types its steps mention.

// Library code returns typed errors; tests may unwrap (clippy.toml allows it inside #[test] and #[cfg(test)]).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod attention;
mod build;
pub mod conformance;
mod display;
mod emit;
pub mod exec;
pub mod fuzz_entry;
pub mod ids;
mod lower;
pub mod pass_checks;
pub mod plan;
mod report;
pub mod set;
pub mod verify;

pub use build::{
    run_pipeline, OrderChoice, OrderOutcome, OrderStrategy, Pass, PipelineResult, PlanOptions, MAX_STREAMS,
};
pub use exec::{ExecError, Executor, HostTensor, PreparedPlan, TensorMap, Unavailable};
pub use graph_passes::{InternalError, PlanError, PlanResult};
pub use ids::{EventId, GroupId, KernelId, StepId, StreamId, ValueId};
pub use plan::{
    Access, Binding, BindingRole, BufferRef, ExecutionPlan, Instr, Kernel, KernelOrder, Param, PlanNode, PlanStats,
    PlanStep, Value,
};
pub use report::simulate_plan;
pub use set::{verify_set, BucketSpec, Dims, PlanSet, SetError, SetOptions};
pub use verify::{verify, Violation};

/// The precision transform's policy and report types (`PlanOptions::precision`), for executors and tools.
pub use graph_passes::precision;

/// The shared timing evaluator (event-driven simulation of streams on a device profile).
pub use graph_passes::timing;

/// The IR types plans mention, re-exported so executors need no other dependency.
pub use graph_ir::{self as ir, op, DType, GraphError, GraphResult, Op, OpCost, Shape};
/// Pass types plans mention (regions, kernel kinds, device profiles, fusion caps).
pub use graph_passes::{
    device::{DeviceProfile, LaunchEstimate},
    fusion::{FusionCaps, FusionOptions, GroupKind},
    memory::{MemoryOptions, Region},
    target::{Effort, Target},
};
