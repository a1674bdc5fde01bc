//! Numeric execution of one instruction: a built-in op (ONNX semantics) over kernel-local values.
//!
//! Each op is one whole-tensor function with one formula per element, so a chain of elementwise instructions
//! gives the same bits fused (temporaries in kernel scratch) or not (temporaries through memory). Reductions
//! accumulate in f64 in a fixed order; MatMul, Gemm and Conv accumulate in f32 in k order (see `linalg`).

use graph_plan::ir::infer::{reduce_axes, slice_plan, Window};
use graph_plan::ir::op::{GeluApprox, PadMode};
use graph_plan::{DType, Op};

use crate::linalg;
use crate::math;
use crate::value::{broadcast_shape, expand, numel, strided_offsets, strides, Data, OpResult, Val};

/// Dtype and shape a program declares for a value.
pub(crate) struct Spec<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
}

fn norm_axis(axis: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

fn arity(ins: &[&Val], n: usize, op: &Op) -> OpResult<()> {
    if ins.len() < n {
        return Err(format!("{} needs {n} inputs, got {}", op.name(), ins.len()));
    }
    Ok(())
}

/// Evaluate `op` on `ins`; `outs` are the declared output specs (used by views and checked by the caller).
pub(crate) fn eval(op: &Op, ins: &[&Val], outs: &[Spec<'_>]) -> OpResult<Vec<Val>> {
    use Op::*;
    let one = |v: Val| Ok(vec![v]);
    match op {
        Neg | Abs | Relu => {
            arity(ins, 1, op)?;
            let x = ins[0];
            match &x.data {
                Data::F(v) => {
                    let f: fn(f32) -> f32 = match op {
                        Neg => |a| -a,
                        Abs => f32::abs,
                        _ => |a| if a < 0.0 { 0.0 } else { a },
                    };
                    one(Val::from_f(x.dtype, x.shape.clone(), v.iter().map(|&a| f(a)).collect()))
                }
                Data::I(v) => {
                    let f: fn(i64) -> i64 = match op {
                        Neg => i64::wrapping_neg,
                        Abs => i64::wrapping_abs,
                        _ => |a| a.max(0),
                    };
                    one(Val::from_i(x.dtype, x.shape.clone(), v.iter().map(|&a| f(a)).collect()))
                }
                Data::B(_) => Err(format!("{} needs a numeric input, got bool", op.name())),
            }
        }
        Exp
        | Log
        | Sqrt
        | Reciprocal
        | Sigmoid
        | Tanh
        | Erf
        | Gelu { .. }
        | Silu
        | HardSwish
        | HardSigmoid { .. }
        | Floor
        | Ceil
        | LeakyRelu { .. } => {
            arity(ins, 1, op)?;
            let x = ins[0];
            let v = x.f()?;
            let out: Vec<f32> = match op {
                Exp => v.iter().map(|&a| a.exp()).collect(),
                Log => v.iter().map(|&a| a.ln()).collect(),
                Sqrt => v.iter().map(|&a| a.sqrt()).collect(),
                Reciprocal => v.iter().map(|&a| 1.0 / a).collect(),
                Sigmoid => v.iter().map(|&a| math::sigmoid(a)).collect(),
                Tanh => v.iter().map(|&a| a.tanh()).collect(),
                Erf => v.iter().map(|&a| math::erf_f32(a)).collect(),
                Gelu { approximate: GeluApprox::None } => v.iter().map(|&a| math::gelu(a)).collect(),
                Gelu { approximate: GeluApprox::Tanh } => v.iter().map(|&a| math::gelu_tanh(a)).collect(),
                Silu => v.iter().map(|&a| math::silu(a)).collect(),
                HardSwish => v.iter().map(|&a| math::hard_swish(a)).collect(),
                HardSigmoid { alpha, beta } => v.iter().map(|&a| math::hard_sigmoid(a, *alpha, *beta)).collect(),
                Floor => v.iter().map(|&a| a.floor()).collect(),
                Ceil => v.iter().map(|&a| a.ceil()).collect(),
                LeakyRelu { alpha } => v.iter().map(|&a| if a < 0.0 { alpha * a } else { a }).collect(),
                _ => return Err(format!("{} is not a float unary op", op.name())),
            };
            one(Val::from_f(x.dtype, x.shape.clone(), out))
        }
        Not => {
            arity(ins, 1, op)?;
            let x = ins[0];
            one(Val::from_b(x.shape.clone(), x.b()?.iter().map(|&a| u8::from(a == 0)).collect()))
        }
        Clip { min, max } => {
            arity(ins, 1, op)?;
            let x = ins[0];
            match &x.data {
                Data::F(v) => {
                    // NaN stays NaN (numpy clip), unlike f32::max.
                    let out = v
                        .iter()
                        .map(|&a| {
                            let a = match min {
                                Some(lo) if a < *lo => *lo,
                                _ => a,
                            };
                            match max {
                                Some(hi) if a > *hi => *hi,
                                _ => a,
                            }
                        })
                        .collect();
                    one(Val::from_f(x.dtype, x.shape.clone(), out))
                }
                Data::I(v) => {
                    let lo = min.map(|m| m as i64);
                    let hi = max.map(|m| m as i64);
                    let out = v
                        .iter()
                        .map(|&a| {
                            let a = lo.map_or(a, |l| a.max(l));
                            hi.map_or(a, |h| a.min(h))
                        })
                        .collect();
                    one(Val::from_i(x.dtype, x.shape.clone(), out))
                }
                Data::B(_) => Err("Clip needs a numeric input, got bool".into()),
            }
        }
        Cast { to } => {
            arity(ins, 1, op)?;
            one(cast(ins[0], *to))
        }
        Add | Sub | Mul | Div | Max | Min => {
            arity(ins, 2, op)?;
            binary_arith(op, ins[0], ins[1])
        }
        Pow => {
            arity(ins, 2, op)?;
            pow(ins[0], ins[1]).map(|v| vec![v])
        }
        Equal | Less | LessOrEqual | Greater | GreaterOrEqual => {
            arity(ins, 2, op)?;
            compare(op, ins[0], ins[1]).map(|v| vec![v])
        }
        And | Or => {
            arity(ins, 2, op)?;
            let (a, b) = (ins[0], ins[1]);
            let shape = broadcast_shape(&a.shape, &b.shape)?;
            let av = expand(a.b()?, &a.shape, &shape)?;
            let bv = expand(b.b()?, &b.shape, &shape)?;
            let out = av.iter().zip(bv.iter()).map(|(&x, &y)| if matches!(op, And) { x & y } else { x | y }).collect();
            one(Val::from_b(shape, out))
        }
        Where => {
            arity(ins, 3, op)?;
            where_op(ins[0], ins[1], ins[2]).map(|v| vec![v])
        }
        BatchNormalization { epsilon } => {
            arity(ins, 5, op)?;
            batch_norm(ins, *epsilon).map(|v| vec![v])
        }
        MatMul => {
            arity(ins, 2, op)?;
            linalg::matmul(ins[0], ins[1]).map(|v| vec![v])
        }
        Gemm { alpha, beta, trans_a, trans_b } => {
            arity(ins, 2, op)?;
            linalg::gemm(ins[0], ins[1], ins.get(2).copied(), *alpha, *beta, *trans_a, *trans_b).map(|v| vec![v])
        }
        Conv(a) => {
            arity(ins, 2, op)?;
            let x = ins[0];
            if x.shape.len() < 3 || ins[1].shape.len() != x.shape.len() {
                return Err(format!("Conv needs X and W of equal rank >= 3, got {:?} and {:?}", x.shape, ins[1].shape));
            }
            let w =
                Window::resolve(&ins[1].shape[2..], &a.strides, &a.pads, &a.dilations).map_err(|e| format!("{e:?}"))?;
            linalg::conv(x, ins[1], ins.get(2).copied(), &w, a.group.max(1)).map(|v| vec![v])
        }
        MaxPool(a) | AveragePool(a) => {
            arity(ins, 1, op)?;
            let w =
                Window::resolve(&a.kernel_shape, &a.strides, &a.pads, &a.dilations).map_err(|e| format!("{e:?}"))?;
            linalg::pool(ins[0], &w, a.ceil_mode, matches!(op, MaxPool(_)), a.count_include_pad).map(|v| vec![v])
        }
        GlobalAveragePool => {
            arity(ins, 1, op)?;
            let x = ins[0];
            if x.shape.len() < 3 {
                return Err(format!("GlobalAveragePool needs rank >= 3, got {:?}", x.shape));
            }
            let axes: Vec<usize> = (2..x.shape.len()).collect();
            reduce(x, &axes, true, Reduce::Mean).map(|v| vec![v])
        }
        ReduceSum { axes, keepdims } | ReduceMean { axes, keepdims } | ReduceMax { axes, keepdims } => {
            arity(ins, 1, op)?;
            let x = ins[0];
            let axes = reduce_axes(axes.as_deref(), x.shape.len()).map_err(|e| format!("{e:?}"))?;
            let kind = match op {
                ReduceSum { .. } => Reduce::Sum,
                ReduceMean { .. } => Reduce::Mean,
                _ => Reduce::Max,
            };
            reduce(x, &axes, *keepdims, kind).map(|v| vec![v])
        }
        Softmax { axis } => {
            arity(ins, 1, op)?;
            softmax(ins[0], *axis).map(|v| vec![v])
        }
        LayerNormalization { axis, epsilon } => {
            arity(ins, 2, op)?;
            layer_norm(ins[0], ins[1], ins.get(2).copied(), *axis, *epsilon).map(|v| vec![v])
        }
        Reshape { .. } | Flatten { .. } | Squeeze { .. } | Unsqueeze { .. } | Identity | Memcpy { .. } => {
            // Views reinterpret the bytes with the declared shape; a Memcpy inside a program is a plain copy.
            arity(ins, 1, op)?;
            let spec = outs.first().ok_or_else(|| format!("{} has no declared output", op.name()))?;
            one(ins[0].reshaped(spec.shape.to_vec())?)
        }
        Transpose { perm } => {
            arity(ins, 1, op)?;
            transpose(ins[0], perm.as_deref()).map(|v| vec![v])
        }
        Slice { starts, ends, axes, steps } => {
            arity(ins, 1, op)?;
            let x = ins[0];
            let plan =
                slice_plan(&graph_plan::Shape::from(x.shape.clone()), starts, ends, axes.as_deref(), steps.as_deref())
                    .map_err(|e| format!("{e:?}"))?;
            let st = strides(&x.shape);
            let out_shape: Vec<usize> = plan.iter().map(|a| a.count).collect();
            // Offsets per axis, then the odometer sums them.
            let per_axis: Vec<Vec<usize>> = plan
                .iter()
                .zip(&st)
                .map(|(a, &s)| (0..a.count).map(|i| (a.start + i as i64 * a.step) as usize * s).collect())
                .collect();
            let idx = index_product(&per_axis);
            one(take(x, &idx, out_shape))
        }
        Concat { axis } => {
            if ins.is_empty() {
                return Err("Concat needs at least one input".into());
            }
            concat(ins, *axis).map(|v| vec![v])
        }
        Gather { axis } => {
            arity(ins, 2, op)?;
            gather(ins[0], ins[1], *axis).map(|v| vec![v])
        }
        Expand { shape } => {
            arity(ins, 1, op)?;
            let x = ins[0];
            let target: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
            let out = broadcast_shape(&x.shape, &target)?;
            let st = crate::value::broadcast_strides(&x.shape, &out)?;
            let idx = strided_offsets(&out, &st);
            one(take(x, &idx, out))
        }
        Pad { pads, mode, value } => {
            arity(ins, 1, op)?;
            pad(ins[0], pads, *mode, *value).map(|v| vec![v])
        }
        Split { axis, splits } => {
            arity(ins, 1, op)?;
            split(ins[0], *axis, splits)
        }
        Custom(_) => Err("custom kernels run through the executor's registered closures".into()),
    }
}

/// Elements of `x` at flat offsets `idx`, as a value of `shape`.
pub(crate) fn take(x: &Val, idx: &[usize], shape: Vec<usize>) -> Val {
    match &x.data {
        Data::F(v) => Val::from_f(x.dtype, shape, idx.iter().map(|&i| v[i]).collect()),
        Data::I(v) => Val::from_i(x.dtype, shape, idx.iter().map(|&i| v[i]).collect()),
        Data::B(v) => Val::from_b(shape, idx.iter().map(|&i| v[i]).collect()),
    }
}

/// All sums `a0 + a1 + ...` with `ai` from `per_axis[i]`, in row-major order.
fn index_product(per_axis: &[Vec<usize>]) -> Vec<usize> {
    let mut out = vec![0usize];
    for axis in per_axis {
        let mut next = Vec::with_capacity(out.len() * axis.len());
        for &b in &out {
            for &o in axis {
                next.push(b + o);
            }
        }
        out = next;
    }
    out
}

fn cast(x: &Val, to: DType) -> Val {
    let shape = x.shape.clone();
    match (&x.data, to) {
        (_, DType::Bool) => Val::from_b(
            shape,
            match &x.data {
                Data::F(v) => v.iter().map(|&a| u8::from(a != 0.0)).collect(),
                Data::I(v) => v.iter().map(|&a| u8::from(a != 0)).collect(),
                Data::B(v) => v.to_vec(),
            },
        ),
        (Data::F(v), DType::F32 | DType::F16 | DType::BF16) => Val::from_f(to, shape, v.to_vec()),
        (Data::I(v), DType::F32 | DType::F16 | DType::BF16) => {
            Val::from_f(to, shape, v.iter().map(|&a| a as f32).collect())
        }
        (Data::B(v), DType::F32 | DType::F16 | DType::BF16) => {
            Val::from_f(to, shape, v.iter().map(|&a| a as f32).collect())
        }
        // Float to int truncates toward zero and saturates at the target's range (Rust `as`; NaN -> 0).
        (Data::F(v), _) => {
            let f: fn(f32) -> i64 = match to {
                DType::I32 => |a| a as i32 as i64,
                DType::I8 => |a| a as i8 as i64,
                DType::U8 => |a| a as u8 as i64,
                _ => |a| a as i64,
            };
            Val::from_i(to, shape, v.iter().map(|&a| f(a)).collect())
        }
        (Data::I(v), _) => Val::from_i(to, shape, v.to_vec()),
        (Data::B(v), _) => Val::from_i(to, shape, v.iter().map(|&a| a as i64).collect()),
    }
}

fn binary_arith(op: &Op, a: &Val, b: &Val) -> OpResult<Vec<Val>> {
    let shape = broadcast_shape(&a.shape, &b.shape)?;
    match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => {
            let xv = expand(x, &a.shape, &shape)?;
            let yv = expand(y, &b.shape, &shape)?;
            let f: fn(f32, f32) -> f32 = match op {
                Op::Add => |p, q| p + q,
                Op::Sub => |p, q| p - q,
                Op::Mul => |p, q| p * q,
                Op::Div => |p, q| p / q,
                // numpy maximum/minimum: NaN propagates.
                Op::Max => |p, q| if p.is_nan() || q.is_nan() { f32::NAN } else { p.max(q) },
                _ => |p, q| if p.is_nan() || q.is_nan() { f32::NAN } else { p.min(q) },
            };
            let out = xv.iter().zip(yv.iter()).map(|(&p, &q)| f(p, q)).collect();
            Ok(vec![Val::from_f(a.dtype, shape, out)])
        }
        (Data::I(x), Data::I(y)) => {
            let xv = expand(x, &a.shape, &shape)?;
            let yv = expand(y, &b.shape, &shape)?;
            let mut out = Vec::with_capacity(xv.len());
            for (&p, &q) in xv.iter().zip(yv.iter()) {
                out.push(match op {
                    Op::Add => p.wrapping_add(q),
                    Op::Sub => p.wrapping_sub(q),
                    Op::Mul => p.wrapping_mul(q),
                    Op::Div => {
                        if q == 0 {
                            return Err("integer division by zero".into());
                        }
                        p.wrapping_div(q)
                    }
                    Op::Max => p.max(q),
                    _ => p.min(q),
                });
            }
            Ok(vec![Val::from_i(a.dtype, shape, out)])
        }
        _ => Err(format!("{} needs two numeric inputs of one kind, got {} and {}", op.name(), a.dtype, b.dtype)),
    }
}

fn pow(a: &Val, b: &Val) -> OpResult<Val> {
    let shape = broadcast_shape(&a.shape, &b.shape)?;
    let bf: Vec<f64> = b.to_f64();
    let yv = expand(&bf, &b.shape, &shape)?;
    match &a.data {
        Data::F(x) => {
            let xv = expand(x, &a.shape, &shape)?;
            let out = xv.iter().zip(yv.iter()).map(|(&p, &q)| (p as f64).powf(q) as f32).collect();
            Ok(Val::from_f(a.dtype, shape, out))
        }
        Data::I(x) => {
            let xv = expand(x, &a.shape, &shape)?;
            let out = xv
                .iter()
                .zip(yv.iter())
                .map(|(&p, &q)| {
                    if matches!(b.data, Data::F(_)) {
                        // An integer base with a float exponent: compute in f64, truncate (saturating).
                        (p as f64).powf(q) as i64
                    } else if q < 0.0 {
                        match p {
                            1 => 1,
                            -1 => {
                                if (q as i64) % 2 == 0 {
                                    1
                                } else {
                                    -1
                                }
                            }
                            _ => 0,
                        }
                    } else {
                        p.wrapping_pow(q.min(u32::MAX as f64) as u32)
                    }
                })
                .collect();
            Ok(Val::from_i(a.dtype, shape, out))
        }
        Data::B(_) => Err("Pow needs a numeric base, got bool".into()),
    }
}

fn compare(op: &Op, a: &Val, b: &Val) -> OpResult<Val> {
    let shape = broadcast_shape(&a.shape, &b.shape)?;
    let test = |o: std::cmp::Ordering| -> bool {
        use std::cmp::Ordering::*;
        match op {
            Op::Equal => o == Equal,
            Op::Less => o == Less,
            Op::LessOrEqual => o != Greater,
            Op::Greater => o == Greater,
            _ => o != Less,
        }
    };
    let out: Vec<u8> = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => {
            let xv = expand(x, &a.shape, &shape)?;
            let yv = expand(y, &b.shape, &shape)?;
            // Any comparison with NaN is false.
            xv.iter().zip(yv.iter()).map(|(p, q)| p.partial_cmp(q).is_some_and(test) as u8).collect()
        }
        (Data::I(x), Data::I(y)) => {
            let xv = expand(x, &a.shape, &shape)?;
            let yv = expand(y, &b.shape, &shape)?;
            xv.iter().zip(yv.iter()).map(|(p, q)| test(p.cmp(q)) as u8).collect()
        }
        (Data::B(x), Data::B(y)) => {
            let xv = expand(x, &a.shape, &shape)?;
            let yv = expand(y, &b.shape, &shape)?;
            xv.iter().zip(yv.iter()).map(|(p, q)| test(p.cmp(q)) as u8).collect()
        }
        _ => return Err(format!("{} needs inputs of one dtype, got {} and {}", op.name(), a.dtype, b.dtype)),
    };
    Ok(Val::from_b(shape, out))
}

fn where_op(c: &Val, x: &Val, y: &Val) -> OpResult<Val> {
    let shape = broadcast_shape(&broadcast_shape(&c.shape, &x.shape)?, &y.shape)?;
    let cv = expand(c.b()?, &c.shape, &shape)?;
    match (&x.data, &y.data) {
        (Data::F(p), Data::F(q)) => {
            let pv = expand(p, &x.shape, &shape)?;
            let qv = expand(q, &y.shape, &shape)?;
            let out =
                cv.iter().zip(pv.iter().zip(qv.iter())).map(|(&k, (&a, &b))| if k != 0 { a } else { b }).collect();
            Ok(Val::from_f(x.dtype, shape, out))
        }
        (Data::I(p), Data::I(q)) => {
            let pv = expand(p, &x.shape, &shape)?;
            let qv = expand(q, &y.shape, &shape)?;
            let out =
                cv.iter().zip(pv.iter().zip(qv.iter())).map(|(&k, (&a, &b))| if k != 0 { a } else { b }).collect();
            Ok(Val::from_i(x.dtype, shape, out))
        }
        (Data::B(p), Data::B(q)) => {
            let pv = expand(p, &x.shape, &shape)?;
            let qv = expand(q, &y.shape, &shape)?;
            let out =
                cv.iter().zip(pv.iter().zip(qv.iter())).map(|(&k, (&a, &b))| if k != 0 { a } else { b }).collect();
            Ok(Val::from_b(shape, out))
        }
        _ => Err(format!("Where needs X and Y of one dtype, got {} and {}", x.dtype, y.dtype)),
    }
}

fn batch_norm(ins: &[&Val], eps: f32) -> OpResult<Val> {
    let x = ins[0];
    if x.shape.len() < 2 {
        return Err(format!("BatchNormalization needs rank >= 2, got {:?}", x.shape));
    }
    let c = x.shape[1];
    let params: Vec<&[f32]> = ins[1..5].iter().map(|v| v.f()).collect::<OpResult<_>>()?;
    if params.iter().any(|p| p.len() != c) {
        return Err(format!("BatchNormalization parameters must have {c} elements"));
    }
    let (scale, bias, mean, var) = (params[0], params[1], params[2], params[3]);
    // Per channel: y = (x - mean) * (scale / sqrt(var + eps)) + B, in f64, rounded once.
    let a: Vec<f64> = (0..c).map(|i| scale[i] as f64 / (var[i] as f64 + eps as f64).sqrt()).collect();
    let inner: usize = x.shape[2..].iter().product();
    let xv = x.f()?;
    let mut out = Vec::with_capacity(xv.len());
    for (i, &v) in xv.iter().enumerate() {
        let ch = (i / inner.max(1)) % c.max(1);
        out.push(((v as f64 - mean[ch] as f64) * a[ch] + bias[ch] as f64) as f32);
    }
    Ok(Val::from_f(x.dtype, x.shape.clone(), out))
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Reduce {
    Sum,
    Mean,
    Max,
}

/// Reduce `x` over sorted, distinct `axes`. Each output accumulates its inputs in row-major order (f64 for
/// floats, wrapping i64 for integers).
pub(crate) fn reduce(x: &Val, axes: &[usize], keepdims: bool, kind: Reduce) -> OpResult<Val> {
    let r = x.shape.len();
    let kept: Vec<usize> = (0..r).map(|i| if axes.contains(&i) { 1 } else { x.shape[i] }).collect();
    let out_n = numel(&kept);
    let count: usize = axes.iter().map(|&a| x.shape[a]).product();
    // Output offset of every input element: kept strides, 0 on reduced axes.
    let kst = strides(&kept);
    let st: Vec<usize> = (0..r).map(|i| if axes.contains(&i) { 0 } else { kst[i] }).collect();
    let map = strided_offsets(&x.shape, &st);
    let out_shape: Vec<usize> =
        if keepdims { kept.clone() } else { (0..r).filter(|i| !axes.contains(i)).map(|i| x.shape[i]).collect() };
    match &x.data {
        Data::F(v) => {
            let mut acc = vec![if kind == Reduce::Max { f64::NEG_INFINITY } else { 0.0 }; out_n];
            for (&o, &a) in map.iter().zip(v.iter()) {
                let a = a as f64;
                match kind {
                    Reduce::Max => {
                        if a > acc[o] || a.is_nan() {
                            acc[o] = a
                        }
                    }
                    _ => acc[o] += a,
                }
            }
            if kind == Reduce::Mean {
                for a in &mut acc {
                    *a /= count as f64;
                }
            }
            Ok(Val::from_f(x.dtype, out_shape, acc.into_iter().map(|a| a as f32).collect()))
        }
        Data::I(v) => {
            let mut acc = vec![if kind == Reduce::Max { i64::MIN } else { 0 }; out_n];
            for (&o, &a) in map.iter().zip(v.iter()) {
                acc[o] = match kind {
                    Reduce::Max => acc[o].max(a),
                    _ => acc[o].wrapping_add(a),
                };
            }
            if kind == Reduce::Mean {
                if count == 0 {
                    return Err("integer mean over an empty axis".into());
                }
                for a in &mut acc {
                    *a /= count as i64;
                }
            }
            Ok(Val::from_i(x.dtype, out_shape, acc))
        }
        Data::B(_) => Err("reductions need numeric input, got bool".into()),
    }
}

fn softmax(x: &Val, axis: i64) -> OpResult<Val> {
    let a = norm_axis(axis, x.shape.len())?;
    let len = x.shape[a];
    let inner: usize = x.shape[a + 1..].iter().product();
    let outer: usize = x.shape[..a].iter().product();
    let v = x.f()?;
    let mut out = vec![0f32; v.len()];
    let mut e = vec![0f64; len];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * len * inner + k * inner + i;
            let m = (0..len)
                .map(|k| v[at(k)] as f64)
                .fold(f64::NEG_INFINITY, |p, q| if q > p || q.is_nan() { q } else { p });
            let mut s = 0f64;
            for (k, ek) in e.iter_mut().enumerate() {
                *ek = (v[at(k)] as f64 - m).exp();
                s += *ek;
            }
            for (k, ek) in e.iter().enumerate() {
                out[at(k)] = (ek / s) as f32;
            }
        }
    }
    Ok(Val::from_f(x.dtype, x.shape.clone(), out))
}

fn layer_norm(x: &Val, scale: &Val, bias: Option<&Val>, axis: i64, eps: f32) -> OpResult<Val> {
    let a = norm_axis(axis, x.shape.len())?;
    let norm_shape = &x.shape[a..];
    let n: usize = norm_shape.iter().product();
    let sv = expand(scale.f()?, &scale.shape, norm_shape)?;
    let bv = match bias {
        Some(b) => Some(expand(b.f()?, &b.shape, norm_shape)?),
        None => None,
    };
    let v = x.f()?;
    let mut out = vec![0f32; v.len()];
    if n == 0 {
        return Ok(Val::from_f(x.dtype, x.shape.clone(), out));
    }
    for (row, orow) in v.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean = row.iter().map(|&q| q as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|&q| (q as f64 - mean) * (q as f64 - mean)).sum::<f64>() / n as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for k in 0..n {
            let mut y = (row[k] as f64 - mean) * inv * sv[k] as f64;
            if let Some(b) = &bv {
                y += b[k] as f64;
            }
            orow[k] = y as f32;
        }
    }
    Ok(Val::from_f(x.dtype, x.shape.clone(), out))
}

fn transpose(x: &Val, perm: Option<&[usize]>) -> OpResult<Val> {
    let r = x.shape.len();
    let perm: Vec<usize> = match perm {
        Some(p) => p.to_vec(),
        None => (0..r).rev().collect(),
    };
    if perm.len() != r || perm.iter().any(|&p| p >= r) {
        return Err(format!("perm {perm:?} does not fit rank {r}"));
    }
    let st = strides(&x.shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let out_st: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let idx = strided_offsets(&out_shape, &out_st);
    Ok(take(x, &idx, out_shape))
}

fn concat(ins: &[&Val], axis: i64) -> OpResult<Val> {
    let first = ins[0];
    let a = norm_axis(axis, first.shape.len())?;
    let outer: usize = first.shape[..a].iter().product();
    let inner: usize = first.shape[a + 1..].iter().product();
    let mut out_shape = first.shape.clone();
    out_shape[a] = ins.iter().map(|v| v.shape.get(a).copied().unwrap_or(0)).sum();
    for v in ins {
        if v.shape.len() != first.shape.len() || v.dtype != first.dtype {
            return Err(format!(
                "Concat inputs differ: {} {:?} vs {} {:?}",
                v.dtype, v.shape, first.dtype, first.shape
            ));
        }
    }
    // Flat offsets into the concatenation of all inputs' elements.
    let mut base = Vec::with_capacity(ins.len());
    let mut total = 0usize;
    for v in ins {
        base.push(total);
        total += v.len();
    }
    let mut idx = Vec::with_capacity(total);
    for o in 0..outer {
        for (v, &b) in ins.iter().zip(&base) {
            let blk = v.shape[a] * inner;
            idx.extend((0..blk).map(|j| b + o * blk + j));
        }
    }
    let joined = match &first.data {
        Data::F(_) => {
            let mut all = Vec::with_capacity(total);
            for v in ins {
                all.extend_from_slice(v.f()?);
            }
            Val::from_f(first.dtype, vec![total], all)
        }
        Data::I(_) => {
            let mut all = Vec::with_capacity(total);
            for v in ins {
                all.extend(v.ints()?);
            }
            Val::from_i(first.dtype, vec![total], all)
        }
        Data::B(_) => {
            let mut all = Vec::with_capacity(total);
            for v in ins {
                all.extend_from_slice(v.b()?);
            }
            Val::from_b(vec![total], all)
        }
    };
    Ok(take(&joined, &idx, out_shape))
}

fn gather(data: &Val, indices: &Val, axis: i64) -> OpResult<Val> {
    let a = norm_axis(axis, data.shape.len())?;
    let dim = data.shape[a];
    let outer: usize = data.shape[..a].iter().product();
    let inner: usize = data.shape[a + 1..].iter().product();
    let ids = indices.ints()?;
    let mut norm = Vec::with_capacity(ids.len());
    for (k, &i) in ids.iter().enumerate() {
        let j = if i < 0 { i + dim as i64 } else { i };
        if !(0..dim as i64).contains(&j) {
            return Err(format!("index {i} (element {k} of the indices) is out of range for axis {a} of extent {dim}"));
        }
        norm.push(j as usize);
    }
    let mut out_shape = data.shape[..a].to_vec();
    out_shape.extend_from_slice(&indices.shape);
    out_shape.extend_from_slice(&data.shape[a + 1..]);
    let mut idx = Vec::with_capacity(outer * norm.len() * inner);
    for o in 0..outer {
        for &j in &norm {
            let b = (o * dim + j) * inner;
            idx.extend(b..b + inner);
        }
    }
    Ok(take(data, &idx, out_shape))
}

fn pad(x: &Val, pads: &[i64], mode: PadMode, value: f32) -> OpResult<Val> {
    let r = x.shape.len();
    if pads.len() != 2 * r {
        return Err(format!("Pad needs {} pads for rank {r}, got {}", 2 * r, pads.len()));
    }
    let st = strides(&x.shape);
    let mut out_shape = Vec::with_capacity(r);
    // Per axis, the input index of each output index (None: the constant).
    let mut maps: Vec<Vec<Option<usize>>> = Vec::with_capacity(r);
    for k in 0..r {
        let (b, e) = (pads[k], pads[k + r]);
        let dim = x.shape[k] as i64;
        let n = dim + b + e;
        if n < 0 {
            return Err(format!("axis {k}: extent {dim} with pads ({b}, {e}) is negative"));
        }
        out_shape.push(n as usize);
        let mut m = Vec::with_capacity(n as usize);
        for o in 0..n {
            let i = o - b;
            let src = if (0..dim).contains(&i) {
                Some(i)
            } else {
                match mode {
                    PadMode::Constant => None,
                    PadMode::Edge => Some(i.clamp(0, dim - 1)),
                    PadMode::Reflect => {
                        if dim == 1 {
                            Some(0)
                        } else {
                            // Mirror without repeating the edge; fold until inside (pads < dim keeps this to one).
                            let period = 2 * (dim - 1);
                            let j = i.rem_euclid(period);
                            Some(if j < dim { j } else { period - j })
                        }
                    }
                }
            };
            if src.is_some_and(|s| s < 0 || s >= dim) {
                return Err(format!("axis {k}: cannot pad an empty axis in {mode:?} mode"));
            }
            m.push(src.map(|s| s as usize * st[k]));
        }
        maps.push(m);
    }
    // Odometer over output indices; None anywhere means the fill value.
    let n = numel(&out_shape);
    let mut idx: Vec<Option<usize>> = vec![Some(0)];
    for m in &maps {
        let mut next = Vec::with_capacity(idx.len() * m.len());
        for b in &idx {
            for o in m {
                next.push(match (b, o) {
                    (Some(p), Some(q)) => Some(p + q),
                    _ => None,
                });
            }
        }
        idx = next;
    }
    debug_assert_eq!(idx.len(), n);
    Ok(match &x.data {
        Data::F(v) => Val::from_f(x.dtype, out_shape, idx.iter().map(|i| i.map_or(value, |i| v[i])).collect()),
        Data::I(v) => {
            let fill = value as i64;
            Val::from_i(x.dtype, out_shape, idx.iter().map(|i| i.map_or(fill, |i| v[i])).collect())
        }
        Data::B(v) => {
            let fill = u8::from(value != 0.0);
            Val::from_b(out_shape, idx.iter().map(|i| i.map_or(fill, |i| v[i])).collect())
        }
    })
}

fn split(x: &Val, axis: i64, splits: &[usize]) -> OpResult<Vec<Val>> {
    let a = norm_axis(axis, x.shape.len())?;
    if splits.iter().sum::<usize>() != x.shape[a] {
        return Err(format!("splits {splits:?} do not sum to extent {} of axis {a}", x.shape[a]));
    }
    let outer: usize = x.shape[..a].iter().product();
    let inner: usize = x.shape[a + 1..].iter().product();
    let dim = x.shape[a];
    let mut outs = Vec::with_capacity(splits.len());
    let mut at = 0usize;
    for &s in splits {
        let mut idx = Vec::with_capacity(outer * s * inner);
        for o in 0..outer {
            let b = (o * dim + at) * inner;
            idx.extend(b..b + s * inner);
        }
        let mut shape = x.shape.clone();
        shape[a] = s;
        outs.push(take(x, &idx, shape));
        at += s;
    }
    Ok(outs)
}
