#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Pool chains end to end (`FusionCaps::pool_chain`): a pool that reads another pool's result shares its kernel
//! and recomputes the first pool over its window. Random stacks of pools (max and average, with and without the
//! padding counted, windows inside and outside the chain limit), 1x1 convs and Relus, each layer reading any
//! earlier tensor: every plan passes `verify`, and the simulator (adversarial schedules, race check on) computes
//! the reference plan's numbers, with the chains on and off.

use exec_sim::fuzz_entry::reference_vs_optimised;
use graph_plan::ir::op::{ConvAttrs, PoolAttrs};
use graph_plan::ir::{ComputeGraph, TensorId};
use graph_plan::{DType, ExecutionPlan, FusionCaps, Op, PlanOptions};
use proptest::prelude::*;

const F: DType = DType::F32;

/// One layer: (kind 0-3: max pool, average pool, average pool counting the padding, 1x1 conv + Relu), window
/// side, stride, pad, which earlier tensor it reads (modulo their count).
type Layer = (u8, usize, usize, usize, u8);

fn stack(layers: &[Layer]) -> ComputeGraph {
    let mut g = ComputeGraph::new("pools");
    let x = g.add_input("x", F, [1, 3, 9, 8]).unwrap();
    let mut tensors: Vec<TensorId> = vec![x];
    let mut read = vec![false];
    for (i, &(kind, k, s, p, from)) in layers.iter().enumerate() {
        let src = usize::from(from) % tensors.len();
        let t = tensors[src];
        let out = if kind == 3 {
            let c = g.tensor(t).shape.dims()[1];
            let w = g.add_weight(&format!("w{i}"), F, [4, c, 1, 1]).unwrap();
            let conv = g.add_node(&format!("conv{i}"), Op::Conv(ConvAttrs::default()), &[t, w]).unwrap()[0];
            g.add_node(&format!("relu{i}"), Op::Relu, &[conv]).map(|o| o[0])
        } else {
            let attrs = PoolAttrs {
                kernel_shape: vec![k, k],
                strides: vec![s, s],
                pads: vec![p.min(k - 1); 4],
                count_include_pad: kind == 2,
                ..Default::default()
            };
            let op = if kind == 0 { Op::MaxPool(attrs) } else { Op::AveragePool(attrs) };
            g.add_node(&format!("pool{i}"), op, &[t]).map(|o| o[0])
        };
        // A window larger than the map is refused by shape inference: that layer is left out.
        if let Ok(o) = out {
            tensors.push(o);
            read.push(false);
            read[src] = true;
        }
    }
    // Every tensor nobody reads is an output (so that nothing is dead), the last one always.
    let last = tensors.len() - 1;
    for (i, &t) in tensors.iter().enumerate().skip(1) {
        if !read[i] || i == last {
            g.mark_output(t).unwrap();
        }
    }
    if tensors.len() == 1 {
        let r = g.add_node("relu", Op::Relu, &[x]).unwrap()[0];
        g.mark_output(r).unwrap();
    }
    g
}

/// GoogLeNet's shape of chain: a strided stage pool read by a conv and by a branch pool.
#[test]
fn a_stage_pool_and_its_branch_pool_are_one_kernel() {
    let g = stack(&[(0, 3, 2, 1, 0), (3, 1, 1, 0, 1), (0, 3, 1, 1, 1)]);
    let plan = ExecutionPlan::build_with(&g, &PlanOptions::with_streams(2)).unwrap();
    let bodies: Vec<Vec<&str>> = plan.kernels().iter().map(|k| k.body.iter().map(|i| i.op.name()).collect()).collect();
    assert_eq!(bodies, [vec!["MaxPool", "MaxPool"], vec!["Conv", "Relu"]], "{plan}");
    reference_vs_optimised(&g, &PlanOptions::with_streams(2), 3).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_pool_stacks_verify_and_match_the_reference(
        layers in prop::collection::vec((0u8..4, 1usize..5, 1usize..3, 0usize..2, any::<u8>()), 1..7),
        chains in any::<bool>(),
        streams in 1usize..5,
        seed in any::<u64>(),
    ) {
        let g = stack(&layers);
        let mut opts = PlanOptions::with_streams(streams);
        opts.fusion.caps = FusionCaps { pool_chain: chains, ..FusionCaps::all() };
        reference_vs_optimised(&g, &opts, seed).unwrap();
    }
}
