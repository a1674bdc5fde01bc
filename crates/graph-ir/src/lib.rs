//! graph-ir: the first stage of cuplan's pipeline. It defines the compute graph that every later stage reads:
//! tensors and nodes keyed by slotmap ids, the built-in op set with ONNX semantics, dtypes and static shapes,
//! shape inference, op cost (FLOPs and bytes), validation with errors that name the node or tensor, the
//! versioned JSON format, and seeded synthetic graph families for tests and benchmarks.
//!
//! The IR never holds run-time data: weights are declared by dtype and shape and supplied when a plan is
//! prepared; only small compile-time constants (Reshape targets, scalars) carry their bytes.

// Library code returns typed errors; tests may unwrap (clippy.toml allows it inside #[test] and #[cfg(test)]).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod cost;
mod dtype;
mod error;
pub mod fuzz_entry;
mod graph;
pub mod ids;
pub mod infer;
pub mod json;
pub mod op;
pub mod rng;
pub mod shape;
pub mod synth;

pub use cost::OpCost;
pub use dtype::DType;
pub use error::{GraphError, GraphResult};
pub use graph::{ComputeGraph, GraphEdit, Limits, Node, NodeId, Tensor, TensorId, TensorRole};
pub use op::{Op, OpCategory, TensorSpec};
pub use shape::Shape;
