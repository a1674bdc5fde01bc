//! Seeded generators of graph families for tests and benchmarks. Every graph they return validates.
//!
//! - `chain(n)`: n unary elementwise ops in a row (the launch-bound case; fusion's best case).
//! - `mlp(layers, width, batch)`: MatMul + bias + Relu per layer.
//! - `transformer(layers, hidden, heads, seq, batch)`: pre-norm blocks with real attention (LayerNorm, Q/K/V
//!   projections, reshapes and transposes per head, scaled scores, Softmax, context, output projection, residual
//!   adds, a Gelu MLP).
//! - `resnet_like(blocks, channels, image)`: a stem, basic residual blocks (Conv, BatchNorm, Relu, Add), global
//!   pooling and a classifier.
//! - `inception_like(modules, branches)`: modules of parallel branches of increasing depth joined by Concat.
//! - `random_dag(n, fan_in, seed)`: a random DAG of n nodes mixing unary, binary, n-ary (Concat + ReduceMax),
//!   MatMul and Softmax nodes, with mostly local and some long-range edges.

use crate::error::{GraphError, GraphResult};
use crate::graph::{ComputeGraph, TensorId};
use crate::op::{ConvAttrs, GeluApprox, Op, PoolAttrs};
use crate::rng::SplitMix64;
use crate::DType;

const F: DType = DType::F32;

fn synth_err(family: &'static str, detail: impl Into<String>) -> GraphError {
    GraphError::Synth { family, detail: detail.into() }
}

/// Add a node with one output and return it.
fn node1(g: &mut ComputeGraph, name: &str, op: Op, inputs: &[TensorId]) -> GraphResult<TensorId> {
    let outs = g.add_node(name, op, inputs)?;
    outs.first().copied().ok_or_else(|| synth_err("node", format!("node '{name}' produced no output")))
}

/// `n` unary elementwise ops over a `[1, 1024]` input, cycling Tanh, Neg, Sigmoid, Abs (values stay bounded).
pub fn chain(n: usize) -> GraphResult<ComputeGraph> {
    chain_with_width(n, 1024)
}

/// `chain` with a chosen row width.
pub fn chain_with_width(n: usize, width: usize) -> GraphResult<ComputeGraph> {
    if n == 0 || width == 0 {
        return Err(synth_err("chain", "length and width must be >= 1"));
    }
    let mut g = ComputeGraph::new(format!("chain_{n}"));
    let mut x = g.add_input("x", F, [1, width])?;
    for i in 0..n {
        let op = match i % 4 {
            0 => Op::Tanh,
            1 => Op::Neg,
            2 => Op::Sigmoid,
            _ => Op::Abs,
        };
        x = node1(&mut g, &format!("n{i}"), op, &[x])?;
    }
    g.mark_output(x)?;
    Ok(g)
}

/// A multi-layer perceptron: `layers` x (MatMul, Add bias, Relu) on `[batch, width]`.
pub fn mlp(layers: usize, width: usize, batch: usize) -> GraphResult<ComputeGraph> {
    if layers == 0 || width == 0 || batch == 0 {
        return Err(synth_err("mlp", "layers, width and batch must be >= 1"));
    }
    let mut g = ComputeGraph::new(format!("mlp_{layers}x{width}"));
    let mut x = g.add_input("x", F, [batch, width])?;
    for l in 0..layers {
        let w = g.add_weight(&format!("l{l}.w"), F, [width, width])?;
        let b = g.add_weight(&format!("l{l}.b"), F, [width])?;
        let h = node1(&mut g, &format!("l{l}.matmul"), Op::MatMul, &[x, w])?;
        let h = node1(&mut g, &format!("l{l}.bias"), Op::Add, &[h, b])?;
        x = if l + 1 < layers { node1(&mut g, &format!("l{l}.relu"), Op::Relu, &[h])? } else { h };
    }
    g.mark_output(x)?;
    Ok(g)
}

/// A stack of pre-norm transformer blocks on `[batch, seq, hidden]`.
pub fn transformer(layers: usize, hidden: usize, heads: usize, seq: usize, batch: usize) -> GraphResult<ComputeGraph> {
    if layers == 0 || hidden == 0 || heads == 0 || seq == 0 || batch == 0 {
        return Err(synth_err("transformer", "all sizes must be >= 1"));
    }
    if hidden % heads != 0 {
        return Err(synth_err("transformer", format!("hidden {hidden} is not divisible by heads {heads}")));
    }
    let dh = hidden / heads;
    let (b, s, h, nh) = (batch as i64, seq as i64, hidden as i64, heads as i64);
    let mut g = ComputeGraph::new(format!("transformer_{layers}l_{hidden}h"));
    let mut x = g.add_input("x", F, [batch, seq, hidden])?;
    let scale = g.add_constant_f32("attn_scale", [], &[1.0 / (dh as f32).sqrt()])?;
    for l in 0..layers {
        let p = |n: &str| format!("l{l}.{n}");
        let w = |g: &mut ComputeGraph, n: &str, shape: &[usize]| g.add_weight(&p(n), F, shape);
        // attention
        let g1 = w(&mut g, "ln1.scale", &[hidden])?;
        let b1 = w(&mut g, "ln1.bias", &[hidden])?;
        let ln1 = node1(&mut g, &p("ln1"), Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[x, g1, b1])?;
        let proj = |g: &mut ComputeGraph, n: &str| -> GraphResult<TensorId> {
            let wt = w(g, &format!("{n}.w"), &[hidden, hidden])?;
            let bt = w(g, &format!("{n}.b"), &[hidden])?;
            let m = node1(g, &p(&format!("{n}.matmul")), Op::MatMul, &[ln1, wt])?;
            let a = node1(g, &p(&format!("{n}.bias")), Op::Add, &[m, bt])?;
            node1(
                g,
                &p(&format!("{n}.split_heads")),
                Op::Reshape { shape: vec![b, s, nh, dh as i64], allowzero: false },
                &[a],
            )
        };
        let q = proj(&mut g, "q")?;
        let k = proj(&mut g, "k")?;
        let v = proj(&mut g, "v")?;
        let q = node1(&mut g, &p("q.transpose"), Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[q])?;
        let k = node1(&mut g, &p("k.transpose"), Op::Transpose { perm: Some(vec![0, 2, 3, 1]) }, &[k])?;
        let v = node1(&mut g, &p("v.transpose"), Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[v])?;
        let sc = node1(&mut g, &p("scores"), Op::MatMul, &[q, k])?;
        let sc = node1(&mut g, &p("scale"), Op::Mul, &[sc, scale])?;
        let pr = node1(&mut g, &p("softmax"), Op::Softmax { axis: -1 }, &[sc])?;
        let ctx = node1(&mut g, &p("context"), Op::MatMul, &[pr, v])?;
        let ctx = node1(&mut g, &p("merge.transpose"), Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[ctx])?;
        let ctx = node1(&mut g, &p("merge_heads"), Op::Reshape { shape: vec![b, s, h], allowzero: false }, &[ctx])?;
        let wo = w(&mut g, "o.w", &[hidden, hidden])?;
        let bo = w(&mut g, "o.b", &[hidden])?;
        let o = node1(&mut g, &p("o.matmul"), Op::MatMul, &[ctx, wo])?;
        let o = node1(&mut g, &p("o.bias"), Op::Add, &[o, bo])?;
        x = node1(&mut g, &p("residual1"), Op::Add, &[x, o])?;
        // MLP
        let g2 = w(&mut g, "ln2.scale", &[hidden])?;
        let b2 = w(&mut g, "ln2.bias", &[hidden])?;
        let ln2 = node1(&mut g, &p("ln2"), Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[x, g2, b2])?;
        let w1 = w(&mut g, "fc1.w", &[hidden, 4 * hidden])?;
        let bb1 = w(&mut g, "fc1.b", &[4 * hidden])?;
        let f = node1(&mut g, &p("fc1.matmul"), Op::MatMul, &[ln2, w1])?;
        let f = node1(&mut g, &p("fc1.bias"), Op::Add, &[f, bb1])?;
        let f = node1(&mut g, &p("gelu"), Op::Gelu { approximate: GeluApprox::None }, &[f])?;
        let w2 = w(&mut g, "fc2.w", &[4 * hidden, hidden])?;
        let bb2 = w(&mut g, "fc2.b", &[hidden])?;
        let f = node1(&mut g, &p("fc2.matmul"), Op::MatMul, &[f, w2])?;
        let f = node1(&mut g, &p("fc2.bias"), Op::Add, &[f, bb2])?;
        x = node1(&mut g, &p("residual2"), Op::Add, &[x, f])?;
    }
    g.mark_output(x)?;
    Ok(g)
}

#[allow(clippy::too_many_arguments)] // a private helper mirroring a layer's hyper-parameters
fn conv_bn(
    g: &mut ComputeGraph,
    name: &str,
    x: TensorId,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    relu: bool,
) -> GraphResult<TensorId> {
    let w = g.add_weight(&format!("{name}.w"), F, [cout, cin, k, k])?;
    let pad = k / 2;
    let attrs = ConvAttrs { strides: vec![stride, stride], pads: vec![pad; 4], dilations: vec![], group: 1 };
    let c = node1(g, &format!("{name}.conv"), Op::Conv(attrs), &[x, w])?;
    let params: Vec<TensorId> = ["scale", "bias", "mean", "var"]
        .iter()
        .map(|p| g.add_weight(&format!("{name}.bn.{p}"), F, [cout]))
        .collect::<GraphResult<_>>()?;
    let bn = node1(
        g,
        &format!("{name}.bn"),
        Op::BatchNormalization { epsilon: 1e-5 },
        &[c, params[0], params[1], params[2], params[3]],
    )?;
    if relu {
        node1(g, &format!("{name}.relu"), Op::Relu, &[bn])
    } else {
        Ok(bn)
    }
}

/// A small ResNet: stem conv, `blocks` basic residual blocks at `channels`, global pooling, 10-way classifier.
pub fn resnet_like(blocks: usize, channels: usize, image: usize) -> GraphResult<ComputeGraph> {
    if blocks == 0 || channels == 0 || image < 4 {
        return Err(synth_err("resnet_like", "blocks and channels must be >= 1 and image >= 4"));
    }
    let mut g = ComputeGraph::new(format!("resnet_like_{blocks}b_{channels}c"));
    let x = g.add_input("image", F, [1, 3, image, image])?;
    let mut h = conv_bn(&mut g, "stem", x, 3, channels, 3, 1, true)?;
    for i in 0..blocks {
        let a = conv_bn(&mut g, &format!("b{i}.a"), h, channels, channels, 3, 1, true)?;
        let c = conv_bn(&mut g, &format!("b{i}.b"), a, channels, channels, 3, 1, false)?;
        let s = node1(&mut g, &format!("b{i}.add"), Op::Add, &[c, h])?;
        h = node1(&mut g, &format!("b{i}.relu"), Op::Relu, &[s])?;
    }
    let p = node1(&mut g, "pool", Op::GlobalAveragePool, &[h])?;
    let f = node1(&mut g, "flatten", Op::Flatten { axis: 1 }, &[p])?;
    let w = g.add_weight("fc.w", F, [10, channels])?;
    let b = g.add_weight("fc.b", F, [10])?;
    let y = node1(&mut g, "fc", Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: true }, &[f, w, b])?;
    g.mark_output(y)?;
    Ok(g)
}

/// Inception-style modules on `[1, 64, 28, 28]`: branch `j` has `j` 3x3 convs after a 1x1 (branch 0 is a max
/// pool then a 1x1), all concatenated on channels.
pub fn inception_like(modules: usize, branches: usize) -> GraphResult<ComputeGraph> {
    if modules == 0 || branches == 0 {
        return Err(synth_err("inception_like", "modules and branches must be >= 1"));
    }
    let c = 16 * branches;
    let bc = 16;
    let mut g = ComputeGraph::new(format!("inception_like_{modules}m_{branches}b"));
    let x = g.add_input("image", F, [1, 3, 28, 28])?;
    let mut h = conv_bn(&mut g, "stem", x, 3, c, 3, 1, true)?;
    for m in 0..modules {
        let mut outs = Vec::with_capacity(branches);
        for j in 0..branches {
            let name = format!("m{m}.br{j}");
            let o = if j == 0 && branches > 1 {
                let pool =
                    PoolAttrs { kernel_shape: vec![3, 3], strides: vec![1, 1], pads: vec![1; 4], ..Default::default() };
                let p = node1(&mut g, &format!("{name}.pool"), Op::MaxPool(pool), &[h])?;
                conv_bn(&mut g, &format!("{name}.proj"), p, c, bc, 1, 1, true)?
            } else {
                let mut t = conv_bn(&mut g, &format!("{name}.reduce"), h, c, bc, 1, 1, true)?;
                for d in 0..j {
                    t = conv_bn(&mut g, &format!("{name}.conv{d}"), t, bc, bc, 3, 1, true)?;
                }
                t
            };
            outs.push(o);
        }
        h = if outs.len() == 1 {
            outs[0]
        } else {
            node1(&mut g, &format!("m{m}.concat"), Op::Concat { axis: 1 }, &outs)?
        };
    }
    let p = node1(&mut g, "pool", Op::GlobalAveragePool, &[h])?;
    let f = node1(&mut g, "flatten", Op::Flatten { axis: 1 }, &[p])?;
    let w = g.add_weight("fc.w", F, [10, c])?;
    let y = node1(&mut g, "fc", Op::Gemm { alpha: 1.0, beta: 0.0, trans_a: false, trans_b: true }, &[f, w])?;
    g.mark_output(y)?;
    Ok(g)
}

/// A random DAG of exactly `n` nodes on `[1, 64]` tensors; each logical node reads 1..=`fan_in` earlier
/// tensors. Sinks are the outputs. Deterministic for a seed.
pub fn random_dag(n: usize, fan_in: usize, seed: u64) -> GraphResult<ComputeGraph> {
    const W: usize = 64;
    if n == 0 || fan_in == 0 {
        return Err(synth_err("random_dag", "n and fan_in must be >= 1"));
    }
    let mut rng = SplitMix64::new(seed);
    let mut g = ComputeGraph::new(format!("random_dag_{n}_{fan_in}_{seed}"));
    let mut pool: Vec<TensorId> = Vec::with_capacity(n + 2);
    let inputs = 1 + rng.below(2) as usize;
    for i in 0..inputs {
        pool.push(g.add_input(&format!("in{i}"), F, [1, W])?);
    }
    let w = g.add_weight("w", F, [W, W])?;
    let mut consumed = vec![false; 0];
    consumed.resize(pool.len(), false);
    let mut count = 0usize;
    // Pick an earlier tensor: mostly from a recent window, sometimes anywhere (long edges make branches).
    let pick = |rng: &mut SplitMix64, len: usize| -> usize {
        if rng.below(8) == 0 {
            rng.below(len as u64) as usize
        } else {
            let window = len.min(16);
            len - 1 - rng.below(window as u64) as usize
        }
    };
    while count < n {
        let remaining = n - count;
        let k = 1 + rng.below(fan_in as u64) as usize;
        let kind = rng.below(10);
        let name = format!("n{count}");
        let out = if k >= 3 && remaining >= 2 {
            let mut ins = Vec::with_capacity(k);
            for _ in 0..k {
                ins.push(pick(&mut rng, pool.len()));
            }
            let ts: Vec<TensorId> = ins.iter().map(|&i| pool[i]).collect();
            for i in ins {
                consumed[i] = true;
            }
            let cat = node1(&mut g, &format!("{name}.cat"), Op::Concat { axis: 0 }, &ts)?;
            count += 2;
            node1(&mut g, &name, Op::ReduceMax { axes: Some(vec![0]), keepdims: true }, &[cat])?
        } else if k >= 2 {
            let a = pick(&mut rng, pool.len());
            let b = pick(&mut rng, pool.len());
            consumed[a] = true;
            consumed[b] = true;
            let op = match kind % 3 {
                0 => Op::Add,
                1 => Op::Mul,
                _ => Op::Max,
            };
            count += 1;
            node1(&mut g, &name, op, &[pool[a], pool[b]])?
        } else {
            let a = pick(&mut rng, pool.len());
            consumed[a] = true;
            let op = match kind {
                0 | 1 => Op::MatMul,
                2 => Op::Softmax { axis: -1 },
                3 => Op::Relu,
                4 => Op::Tanh,
                5 => Op::Sigmoid,
                6 => Op::Neg,
                7 => Op::Reshape { shape: vec![W as i64, 1], allowzero: false },
                8 => Op::Exp,
                _ => Op::Abs,
            };
            count += 1;
            match op {
                Op::MatMul => node1(&mut g, &name, op, &[pool[a], w])?,
                Op::Reshape { .. } => {
                    // A view round trip: [1, W] -> [W, 1] -> back, so the pool keeps one shape.
                    let r = node1(&mut g, &format!("{name}.view"), op, &[pool[a]])?;
                    if count < n {
                        count += 1;
                        node1(&mut g, &name, Op::Reshape { shape: vec![1, W as i64], allowzero: false }, &[r])?
                    } else {
                        // No room for the second view: the [W, 1] view ends the graph as an output.
                        g.mark_output(r)?;
                        pool.push(r);
                        consumed.push(true);
                        continue;
                    }
                }
                Op::Exp => {
                    let t = node1(&mut g, &name, Op::Tanh, &[pool[a]])?;
                    // exp of a tanh stays bounded
                    if count < n {
                        count += 1;
                        node1(&mut g, &format!("{name}.exp"), op, &[t])?
                    } else {
                        t
                    }
                }
                _ => node1(&mut g, &name, op, &[pool[a]])?,
            }
        };
        pool.push(out);
        consumed.push(false);
    }
    for (i, &t) in pool.iter().enumerate().skip(inputs) {
        if !consumed[i] && g.producer(t).is_some() && g.tensor(t).role != crate::TensorRole::Output {
            g.mark_output(t)?;
        }
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_validate_with_expected_sizes() {
        let c = chain(10).unwrap();
        assert_eq!(c.num_nodes(), 10);
        c.validate().unwrap();
        let m = mlp(3, 32, 4).unwrap();
        assert_eq!(m.num_nodes(), 3 * 3 - 1);
        m.validate().unwrap();
        let t = transformer(2, 64, 4, 16, 1).unwrap();
        t.validate().unwrap();
        let out = t.tensor(t.outputs()[0]);
        assert_eq!(*out.shape.0, vec![1, 16, 64]);
        let r = resnet_like(2, 8, 16).unwrap();
        r.validate().unwrap();
        assert_eq!(*r.tensor(r.outputs()[0]).shape.0, vec![1, 10]);
        let i = inception_like(2, 4).unwrap();
        i.validate().unwrap();
        for n in [1, 2, 3, 50, 500] {
            let d = random_dag(n, 3, 42).unwrap();
            assert_eq!(d.num_nodes(), n, "random_dag({n})");
            d.validate().unwrap();
        }
    }

    #[test]
    fn random_dag_is_deterministic() {
        let a = random_dag(200, 4, 9).unwrap().to_json();
        let b = random_dag(200, 4, 9).unwrap().to_json();
        assert_eq!(a, b);
        let c = random_dag(200, 4, 10).unwrap().to_json();
        assert_ne!(a, c);
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(matches!(transformer(1, 10, 3, 4, 1), Err(GraphError::Synth { family: "transformer", .. })));
        assert!(matches!(chain(0), Err(GraphError::Synth { .. })));
        assert!(matches!(random_dag(0, 1, 0), Err(GraphError::Synth { .. })));
    }
}
