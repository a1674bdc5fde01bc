#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Properties of the fusion pass over random graphs, the synth families and random caps: every plan covers
//! each non-view node once, orders its groups topologically (no cycle), respects the caps, keeps its decisions
//! consistent, and builds into an `ExecutionPlan` that `graph_plan::verify` accepts.

mod fusion_util;

use fusion_util::*;
use graph_ir::op::CustomOp;
use graph_ir::rng::SplitMix64;
use graph_ir::{synth, ComputeGraph, Op, TensorId, TensorRole, TensorSpec};
use graph_passes::fusion::{FusionCaps, FusionOptions};
use graph_plan::{verify, ExecutionPlan, PlanOptions};
use proptest::prelude::*;

/// Kinds of the values of a "rows" graph: all derive from `[4, 8]` rows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum K {
    /// `[4, 8]`.
    Full,
    /// `[4, 1]`: reduced over the last axis, kept.
    Keep,
    /// `[4]`: reduced over the last axis, dropped.
    Drop,
    /// `[1, 8]`: reduced over axis 0, kept (broadcasts like a bias).
    Col,
    /// `[32]`: a flattened full value.
    Wide,
    /// `[8, 4]`: transposed.
    T,
}

fn shape(k: K) -> Vec<usize> {
    match k {
        K::Full => vec![4, 8],
        K::Keep => vec![4, 1],
        K::Drop => vec![4],
        K::Col => vec![1, 8],
        K::Wide => vec![32],
        K::T => vec![8, 4],
    }
}

/// A random graph over `[4, 8]` rows mixing every fusion class: elementwise with broadcasting, reductions over
/// either axis with and without kept dims, Softmax, LayerNormalization, views, transposes, MatMul, Gemm,
/// Concat/Slice, Split, Where, Cast, custom kernels and copies.
fn rows_graph(seed: u64, n: usize) -> ComputeGraph {
    let mut r = SplitMix64::new(seed);
    let mut g = ComputeGraph::new(format!("rows_{seed}_{n}"));
    let mut pool: Vec<(TensorId, K)> = Vec::new();
    pool.push((g.add_input("x", F, shape(K::Full)).unwrap(), K::Full));
    pool.push((g.add_input("y", F, shape(K::Full)).unwrap(), K::Full));
    let bias = g.add_weight("bias", F, shape(K::Col)).unwrap();
    let w = g.add_weight("w", F, [8, 8]).unwrap();
    let gamma = g.add_weight("gamma", F, [8]).unwrap();
    let beta = g.add_weight("beta", F, [8]).unwrap();
    let mut i = 0usize;
    let pick = |r: &mut SplitMix64, pool: &[(TensorId, K)], want: Option<K>| -> Option<(TensorId, K)> {
        let cands: Vec<(TensorId, K)> = pool.iter().copied().filter(|&(_, k)| want.is_none_or(|w| w == k)).collect();
        if cands.is_empty() {
            return None;
        }
        // Mostly recent values (chains), sometimes any (branches and long edges).
        let j = if r.below(4) == 0 {
            r.below(cands.len() as u64) as usize
        } else {
            cands.len() - 1 - r.below(cands.len().min(6) as u64) as usize
        };
        Some(cands[j])
    };
    while i < n {
        let name = format!("n{i}");
        i += 1;
        let choice = r.below(20);
        let (a, ka) = pick(&mut r, &pool, None).unwrap();
        let out: Option<(TensorId, K)> = match choice {
            0..=4 => {
                let op = [Op::Exp, Op::Neg, Op::Tanh, Op::Relu, Op::Sigmoid, Op::Abs][r.below(6) as usize].clone();
                Some((n1(&mut g, &name, op, &[a]), ka))
            }
            5..=8 => {
                let op = [Op::Add, Op::Mul, Op::Sub, Op::Max][r.below(4) as usize].clone();
                let (b, kb) = match ka {
                    K::Full => match r.below(4) {
                        0 => pick(&mut r, &pool, Some(K::Keep)).unwrap_or((bias, K::Col)),
                        1 => pick(&mut r, &pool, Some(K::Col)).unwrap_or((bias, K::Col)),
                        2 => (bias, K::Col),
                        _ => pick(&mut r, &pool, Some(K::Full)).unwrap(),
                    },
                    k => pick(&mut r, &pool, Some(k)).unwrap(),
                };
                let k = if ka == K::Full || kb == K::Full { K::Full } else { ka };
                Some((n1(&mut g, &name, op, &[a, b]), k))
            }
            9 if ka == K::Full => {
                let keep = r.below(2) == 0;
                let op = match r.below(3) {
                    0 => Op::ReduceSum { axes: Some(vec![-1]), keepdims: keep },
                    1 => Op::ReduceMax { axes: Some(vec![1]), keepdims: keep },
                    _ => Op::ReduceMean { axes: Some(vec![-1]), keepdims: keep },
                };
                Some((n1(&mut g, &name, op, &[a]), if keep { K::Keep } else { K::Drop }))
            }
            10 if ka == K::Full => {
                Some((n1(&mut g, &name, Op::ReduceSum { axes: Some(vec![0]), keepdims: true }, &[a]), K::Col))
            }
            11 if ka == K::Full => {
                let t = if r.below(2) == 0 {
                    n1(&mut g, &name, Op::Softmax { axis: -1 }, &[a])
                } else {
                    n1(&mut g, &name, Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[a, gamma, beta])
                };
                Some((t, K::Full))
            }
            12 => match ka {
                K::Full => Some((n1(&mut g, &name, Op::Reshape { shape: vec![32], allowzero: false }, &[a]), K::Wide)),
                K::Wide => {
                    Some((n1(&mut g, &name, Op::Reshape { shape: vec![4, 8], allowzero: false }, &[a]), K::Full))
                }
                K::Drop => Some((n1(&mut g, &name, Op::Unsqueeze { axes: vec![-1] }, &[a]), K::Keep)),
                K::Keep => Some((n1(&mut g, &name, Op::Squeeze { axes: Some(vec![-1]) }, &[a]), K::Drop)),
                _ => None,
            },
            13 => match ka {
                K::Full => Some((n1(&mut g, &name, Op::Transpose { perm: None }, &[a]), K::T)),
                K::T => Some((n1(&mut g, &name, Op::Transpose { perm: None }, &[a]), K::Full)),
                _ => None,
            },
            14 if ka == K::Full => {
                let t = if r.below(2) == 0 {
                    n1(&mut g, &name, Op::MatMul, &[a, w])
                } else {
                    let gemm = Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: true };
                    n1(&mut g, &name, gemm, &[a, w, bias])
                };
                Some((t, K::Full))
            }
            15 if ka == K::Full => {
                let (b, _) = pick(&mut r, &pool, Some(K::Full)).unwrap();
                let c = n1(&mut g, &format!("{name}.cat"), Op::Concat { axis: 0 }, &[a, b]);
                let slice = Op::Slice { starts: vec![2], ends: vec![6], axes: Some(vec![0]), steps: None };
                Some((n1(&mut g, &name, slice, &[c]), K::Full))
            }
            16 if ka == K::Full => {
                let outs =
                    g.add_node(&format!("{name}.split"), Op::Split { axis: 1, splits: vec![4, 4] }, &[a]).unwrap();
                Some((n1(&mut g, &name, Op::Concat { axis: 1 }, &[outs[1], outs[0]]), K::Full))
            }
            17 if ka == K::Full => {
                let (b, _) = pick(&mut r, &pool, Some(K::Full)).unwrap();
                let c = n1(&mut g, &format!("{name}.gt"), Op::Greater, &[a, b]);
                Some((n1(&mut g, &name, Op::Where, &[c, a, b]), K::Full))
            }
            18 => {
                let c = n1(&mut g, &format!("{name}.f16"), Op::Cast { to: graph_ir::DType::F16 }, &[a]);
                Some((n1(&mut g, &name, Op::Cast { to: F }, &[c]), ka))
            }
            19 if ka == K::Full => {
                if r.below(2) == 0 {
                    let op = CustomOp {
                        source: String::new(),
                        entry: "k".into(),
                        grid: [1, 1, 1],
                        block: [32, 1, 1],
                        outputs: vec![TensorSpec { dtype: F, shape: shape(K::Full).into() }],
                        ..Default::default()
                    };
                    Some((n1(&mut g, &name, Op::Custom(op), &[a]), K::Full))
                } else {
                    let to = graph_ir::op::MemSpace::Device;
                    Some((n1(&mut g, &name, Op::Memcpy { to }, &[a]), K::Full))
                }
            }
            _ => None,
        };
        if let Some(o) = out {
            pool.push(o);
            if r.below(10) == 0 && g.tensor(o.0).role != TensorRole::Output {
                g.mark_output(o.0).unwrap();
            }
        }
    }
    let last = pool.last().unwrap().0;
    for (t, _) in pool.iter().skip(2) {
        if g.consumers(*t).is_empty() && g.tensor(*t).role != TensorRole::Output {
            g.mark_output(*t).unwrap();
        }
    }
    if g.outputs().is_empty() {
        // Only sources so far: add one node so the graph is valid.
        let t = n1(&mut g, "tail", Op::Relu, &[last]);
        g.mark_output(t).unwrap();
    }
    g
}

fn caps_strategy() -> impl Strategy<Value = FusionCaps> {
    (any::<[bool; 7]>(), 1usize..10, 1usize..8).prop_map(|(b, max_ops, max_inputs)| FusionCaps {
        matmul_epilogue: b[0],
        gemm_epilogue: b[1],
        conv_epilogue: b[2],
        pool_epilogue: b[3],
        reduction_fusion: b[4],
        multi_output: b[5],
        injective_fusion: b[6],
        max_inputs,
        max_ops,
    })
}

/// Check the pass alone and through the whole pipeline with the same options.
fn check_all(g: &ComputeGraph, opts: &FusionOptions, streams: usize) {
    let p = fuse_streams(g, opts, streams);
    check(g, &p, &opts.caps);
    let again = fuse_streams(g, opts, streams);
    assert_eq!(names(g, &p), names(g, &again), "not deterministic");
    let mut po = PlanOptions::with_streams(streams);
    po.fusion = opts.clone();
    let plan = ExecutionPlan::build_with(g, &po).unwrap();
    if let Err(v) = verify(&plan) {
        panic!("{}: {v:?}", g.name());
    }
    let copies = p.groups.iter().filter(|x| x.kind == graph_passes::fusion::GroupKind::Copy).count();
    assert_eq!(plan.kernel_count_fused, p.groups.len() - copies);
    assert!(plan.stats().bytes_moved <= plan.stats().bytes_moved_unfused);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn rows_graphs_default_caps(seed in any::<u64>(), n in 1usize..60, streams in 1usize..4, horizontal in any::<bool>()) {
        let g = rows_graph(seed, n);
        check_all(&g, &FusionOptions { horizontal, ..Default::default() }, streams);
    }

    #[test]
    fn rows_graphs_random_caps(seed in any::<u64>(), n in 1usize..60, caps in caps_strategy(), horizontal in any::<bool>()) {
        let g = rows_graph(seed, n);
        check_all(&g, &FusionOptions { enabled: true, horizontal, caps }, 1);
    }

    #[test]
    fn random_dags(n in 1usize..300, fan_in in 1usize..5, seed in any::<u64>(), streams in 1usize..4, horizontal in any::<bool>()) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        check_all(&g, &FusionOptions { horizontal, ..Default::default() }, streams);
    }

    #[test]
    fn random_dags_random_caps(n in 1usize..200, fan_in in 1usize..5, seed in any::<u64>(), caps in caps_strategy()) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        check_all(&g, &FusionOptions { enabled: true, horizontal: true, caps }, 2);
    }

    #[test]
    fn families(layers in 1usize..4, blocks in 1usize..4, branches in 1usize..5, caps in caps_strategy(), streams in 1usize..4) {
        let graphs = vec![
            synth::chain(3 * layers + 1).unwrap(),
            synth::mlp(layers, 16, 2).unwrap(),
            synth::transformer(layers, 16, 2, 4, 1).unwrap(),
            synth::resnet_like(blocks, 4, 8).unwrap(),
            synth::inception_like(blocks, branches).unwrap(),
        ];
        for g in &graphs {
            check_all(g, &FusionOptions::default(), streams);
            check_all(g, &FusionOptions { enabled: true, horizontal: true, caps: caps.clone() }, streams);
        }
    }
}

#[test]
fn rows_graph_generator_covers_every_class() {
    // The generator is only useful if it produces what the properties are about.
    let mut seen = std::collections::HashSet::new();
    for seed in 0..40 {
        let g = rows_graph(seed, 60);
        g.validate().unwrap();
        for (_, n) in g.nodes() {
            seen.insert(n.op.name());
        }
    }
    for op in [
        "ReduceSum",
        "ReduceMax",
        "ReduceMean",
        "Softmax",
        "LayerNormalization",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Transpose",
        "MatMul",
        "Gemm",
        "Concat",
        "Slice",
        "Split",
        "Where",
        "Cast",
        "Custom",
        "Memcpy",
    ] {
        assert!(seen.contains(op), "generator never emits {op}");
    }
}
