//! graph-passes: the analyses cuplan runs over a `ComputeGraph` (topo, liveness, fusion, memory, stream).
pub mod memory;
