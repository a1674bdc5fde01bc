//! The peer system in our benchmarks: oxicuda-graph 0.5.5 (crates.io), whose docs page our `ExecutionPlan`
//! follows. [`to_oxicuda`] builds the same graph in it — one kernel node per graph node in our topological order,
//! reading and writing one buffer per tensor (graph inputs, weights, constants and outputs as external buffers,
//! so that both pools hold the intermediates alone), elementwise and view nodes fusible, data edges inferred from
//! the buffers as its builder does — and [`compare`] times both planners on it.
//!
//! Speed is never read without quality: beside each time stands each system's pool over *our* plan's lower
//! bound (DESIGN.md 5, for our launch order; oxicuda reports no bound of its own).

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result};
use graph_ir::{op::OpCategory, ComputeGraph, TensorRole};
use graph_plan::{ExecutionPlan, PlanOptions};

/// Threads per block of the peer's kernel nodes (its launch configuration does not change its planning).
const THREADS: u32 = 256;

/// `graph` as an oxicuda-graph `ComputeGraph` (see the module docs).
pub fn to_oxicuda(graph: &ComputeGraph) -> Result<oxicuda_graph::ComputeGraph> {
    let order = graph_passes::topo::analyse(graph).context("topological order for the peer graph")?;
    let mut b = oxicuda_graph::GraphBuilder::new();
    let mut buffers = HashMap::with_capacity(graph.num_tensors());
    for (t, tensor) in graph.tensors() {
        let bytes = tensor.size_bytes();
        let id = match tensor.role {
            TensorRole::Intermediate => b.alloc_buffer(&tensor.name, bytes),
            _ => b.alloc_external_buffer(&tensor.name, bytes),
        };
        buffers.insert(t, id);
    }
    for &n in &order.order {
        let node = graph.node(n);
        let elements: usize =
            node.outputs.iter().map(|&t| graph.tensor(t).shape.numel().unwrap_or(1)).max().unwrap_or(1);
        let blocks = u32::try_from(elements.div_ceil(THREADS as usize).max(1)).unwrap_or(u32::MAX);
        let fusible = matches!(node.op.category(), OpCategory::Elementwise | OpCategory::View);
        b.add_kernel(&node.name, blocks, THREADS, 0)
            .fusible(fusible)
            .inputs(node.inputs.iter().map(|t| buffers[t]))
            .outputs(node.outputs.iter().map(|t| buffers[t]))
            .finish();
    }
    b.build().with_context(|| format!("building graph '{}' in oxicuda-graph", graph.name()))
}

/// One side-by-side measurement: median build times of both planners and their pools.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// Median milliseconds of `oxicuda_graph::ExecutionPlan::build` (the peer graph built beforehand).
    pub oxicuda_ms: f64,
    /// Median milliseconds of our `ExecutionPlan::build_with` at default options.
    pub cuplan_ms: f64,
    /// oxicuda's `pool_bytes`.
    pub oxicuda_pool: u64,
    /// Our `pool_bytes`.
    pub cuplan_pool: u64,
    /// Our plan's `lower_bound_bytes` (both pools are divided by it).
    pub bound: u64,
}

impl Comparison {
    /// oxicuda time / our time: above 1, we are faster.
    pub fn ratio(&self) -> f64 {
        self.oxicuda_ms / self.cuplan_ms.max(1e-9)
    }

    /// A pool over the bound (1.0 when the bound is 0).
    pub fn pool_ratio(pool: u64, bound: u64) -> f64 {
        if bound == 0 {
            1.0
        } else {
            pool as f64 / bound as f64
        }
    }
}

/// Times both planners `reps` times each, interleaved (so that load on a shared machine hits both alike), at
/// `streams` streams; medians.
pub fn compare(graph: &ComputeGraph, streams: usize, reps: usize) -> Result<Comparison> {
    let peer = to_oxicuda(graph)?;
    let opts = PlanOptions::with_streams(streams);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut cuplan_pool, mut bound, mut oxicuda_pool) = (0, 0, 0);
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let p = oxicuda_graph::ExecutionPlan::build(&peer, streams)
            .with_context(|| format!("oxicuda-graph planning '{}'", graph.name()))?;
        theirs.push(t0.elapsed().as_secs_f64() * 1e3);
        oxicuda_pool = p.pool_bytes as u64;
        let t0 = Instant::now();
        let plan = ExecutionPlan::build_with(graph, &opts).with_context(|| format!("planning '{}'", graph.name()))?;
        ours.push(t0.elapsed().as_secs_f64() * 1e3);
        cuplan_pool = plan.pool_bytes as u64;
        bound = plan.stats().lower_bound_bytes;
    }
    Ok(Comparison { oxicuda_ms: median(&mut theirs), cuplan_ms: median(&mut ours), oxicuda_pool, cuplan_pool, bound })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_graph_has_a_kernel_per_node_and_plans_within_its_own_naive_pool() {
        let g = graph_ir::synth::inception_like(2, 4).unwrap();
        let peer = to_oxicuda(&g).unwrap();
        assert_eq!(peer.node_count(), g.num_nodes());
        assert_eq!(peer.buffer_count(), g.num_tensors());
        let naive: u64 =
            g.tensors().filter(|(_, t)| t.role == TensorRole::Intermediate).map(|(_, t)| t.size_bytes() as u64).sum();
        let c = compare(&g, 4, 1).unwrap();
        assert!(c.oxicuda_pool > 0 && c.oxicuda_pool <= naive, "{} of naive {naive}", c.oxicuda_pool);
        assert!(c.cuplan_pool >= c.bound && c.bound > 0);
        assert!(c.ratio() > 0.0);
    }
}
