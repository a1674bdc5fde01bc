//! Dense typed indices of the passes' outputs (one per index space, from the workspace's one macro,
//! [`graph_ir::dense_id!`]). Their `Display` is the text the plan dump prints.

graph_ir::dense_id!(
    /// A fused group (one future kernel launch), indexed in the fusion plan's execution order.
    GroupId,
    "g"
);
graph_ir::dense_id!(
    /// A CUDA stream of the plan.
    StreamId,
    "s"
);
graph_ir::dense_id!(
    /// A buffer of the activation pool (one pool alias group), indexed by the memory pass's pool model.
    BufferId,
    "b"
);
graph_ir::dense_id!(
    /// A packing unit of the memory pass: a pool buffer, or a chain of buffers handed over in place, sharing
    /// one offset.
    UnitId,
    "u"
);
