//! Dense typed indices of a plan, from the workspace's one macro ([`graph_ir::dense_id!`]). `Display` gives the
//! text the plan dump prints (`#4`, `k3`, `ev7`, `%2`).

pub use graph_passes::{GroupId, StreamId};

graph_ir::dense_id!(
    /// A step's position in submission order.
    StepId,
    "#"
);
graph_ir::dense_id!(
    /// A kernel of the plan (one per launch).
    KernelId,
    "k"
);
graph_ir::dense_id!(
    /// A CUDA event of the plan.
    EventId,
    "ev"
);
graph_ir::dense_id!(
    /// A value of a kernel's program.
    ValueId,
    "%"
);
