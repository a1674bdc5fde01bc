//! Errors by audience. A [`GraphError`] says the user's graph or options are at fault; an [`InternalError`]
//! says a pass broke one of its own invariants — a bug in cuplan, never something the user did — and names the
//! pass. [`PlanError`] is what the pipeline returns: one or the other, never a bug dressed as a user error.

use graph_ir::GraphError;
use thiserror::Error;

/// A planner bug: pass `pass` broke an invariant (found by the pass itself or by the check after it).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("internal error in pass '{pass}': {detail} (a bug in cuplan, not in the graph; please report it)")]
pub struct InternalError {
    /// The pass that broke the invariant (its pipeline name, e.g. `memory`).
    pub pass: &'static str,
    /// What was found.
    pub detail: String,
}

impl InternalError {
    /// A bug in `pass`.
    pub fn new(pass: &'static str, detail: impl std::fmt::Display) -> InternalError {
        InternalError { pass, detail: detail.to_string() }
    }
}

/// Why planning failed: the user's graph or options, or a planner bug.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum PlanError {
    /// The graph or the options are at fault (the message names the node, tensor or option).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A bug in a pass.
    #[error(transparent)]
    Internal(#[from] InternalError),
}

impl PlanError {
    /// The user error, when this is one.
    pub fn as_graph_error(&self) -> Option<&GraphError> {
        match self {
            PlanError::Graph(e) => Some(e),
            PlanError::Internal(_) => None,
        }
    }
}

/// Result of planning.
pub type PlanResult<T> = Result<T, PlanError>;
