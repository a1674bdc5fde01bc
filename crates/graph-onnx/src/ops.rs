//! ONNX operator -> graph-ir `Op`, with the attribute defaults of the ONNX spec for opsets 13 to 21.
//!
//! Version differences handled here: Reduce* axes as attribute (ReduceMean/Max before 18) or input
//! (ReduceSum from 13, all from 18); Squeeze/Unsqueeze axes as input (13+, the attribute form is accepted
//! too); Split sizes as input (13+) or `num_outputs` (18+); Pad's `axes` input (18+) and `wrap` mode (19+,
//! rejected); Clip bounds as inputs; Dropout's `training_mode` input; BatchNormalization's `training_mode`
//! (14+, rejected when set); Shape's `start`/`end` (15+); Gelu (20+). Inputs that graph-ir takes as
//! attributes must be constants. Conv and pool `auto_pad` is resolved to explicit pads from the static
//! input shape.

use graph_ir::op::{ConvAttrs, GeluApprox, PadMode, PoolAttrs};
use graph_ir::shape::normalize_axis;
use graph_ir::Op;

use crate::error::OnnxError;
use crate::fold;
use crate::import::{Ctx, Importer, Planned};
use crate::proto::data_type;
use crate::tensor::{self, TensorValue};
use crate::types::dtype_of;

/// Converts attribute integers that must be non-negative.
fn usizes(c: &Ctx, attr: &str, v: &[i64]) -> Result<Vec<usize>, OnnxError> {
    v.iter()
        .map(|&x| usize::try_from(x).map_err(|_| c.attrs.err(attr, format!("has negative value {x} in {v:?}"))))
        .collect()
}

impl Importer<'_> {
    /// Evaluates the ops graph-ir has no equivalent for (Constant, Shape, Size, ConstantOfShape, Range,
    /// GatherElements, Mod, CumSum, Sign, Xor, Trilu, and Tile of a constant), which must have constant
    /// inputs: the shape arithmetic, position ids and masks of dynamic exports once their symbols are bound.
    /// `None` for every other op.
    pub(crate) fn fold_special(&self, c: &Ctx) -> Result<Option<Vec<TensorValue>>, OnnxError> {
        let max = self.opts.max_fold_bytes;
        let folded = |r: Result<TensorValue, String>| match r {
            Ok(v) => Ok(Some(vec![v])),
            Err(e) => Err(c.invalid(e)),
        };
        match c.op_type() {
            "Constant" => self.constant(c).map(|v| Some(vec![v])),
            "Shape" => {
                let dims = self.dims(c, 0)?;
                let r = dims.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let start = clamp(c.attrs.int("start", 0)?);
                let end = clamp(c.attrs.int("end", r)?);
                let v: Vec<i64> = dims[start..end.max(start)].iter().map(|&d| d as i64).collect();
                Ok(Some(vec![fold::i64_value(vec![v.len()], &v)]))
            }
            "Size" => {
                let n: usize = self.dims(c, 0)?.iter().product();
                Ok(Some(vec![fold::i64_value(vec![], &[n as i64])]))
            }
            "ConstantOfShape" => {
                let shape = self.const_ints(c, 0)?.ok_or_else(|| self.missing(c, 0))?;
                let value = match c.attrs.tensor_opt("value")? {
                    Some(t) => Some(self.tensor_attr(c, "value", t)?),
                    None => None,
                };
                folded(fold::constant_of_shape(&shape, value.as_ref(), max))
            }
            "Range" => {
                let (s, l, d) = (self.req_const(c, 0)?, self.req_const(c, 1)?, self.req_const(c, 2)?);
                match fold::range(&s, &l, &d, max) {
                    Ok(Some(v)) => Ok(Some(vec![v])),
                    Ok(None) => folded(fold::range_float(&s, &l, &d, max)),
                    Err(e) => Err(c.invalid(e)),
                }
            }
            "Mod" => {
                let op = if c.attrs.flag("fmod", false)? { "FMod" } else { "Mod" };
                let (a, b) = (self.req_const(c, 0)?, self.req_const(c, 1)?);
                match fold::binary(op, &a, &b, max) {
                    Ok(Some(v)) => Ok(Some(vec![v])),
                    Ok(None) => Err(c.unsupported("floating-point Mod")),
                    Err(e) => Err(c.invalid(e)),
                }
            }
            "CumSum" => {
                let x = self.req_const(c, 0)?;
                let axis = match self.const_ints(c, 1)?.as_deref() {
                    Some(&[a]) => a,
                    Some(other) => return Err(c.invalid(format!("axis must hold one value, holds {other:?}"))),
                    None => return Err(self.missing(c, 1)),
                };
                let (exclusive, reverse) = (c.attrs.flag("exclusive", false)?, c.attrs.flag("reverse", false)?);
                match fold::cumsum(&x, axis, exclusive, reverse) {
                    Ok(Some(v)) => Ok(Some(vec![v])),
                    Ok(None) => Err(c.unsupported("floating-point CumSum")),
                    Err(e) => Err(c.invalid(e)),
                }
            }
            "Sign" | "Xor" => {
                let a = self.req_const(c, 0)?;
                let r = if c.op_type() == "Sign" {
                    fold::unary("Sign", &a)
                } else {
                    fold::binary("Xor", &a, &self.req_const(c, 1)?, max)
                };
                match r {
                    Ok(Some(v)) => Ok(Some(vec![v])),
                    Ok(None) => Err(c.unsupported(format!("floating-point {}", c.op_type()))),
                    Err(e) => Err(c.invalid(e)),
                }
            }
            // Causal masks of dynamic exports: Trilu over a constant (ConstantOfShape of the bound sequence).
            "Trilu" => {
                let x = self.req_const(c, 0)?;
                let k = match self.const_ints(c, 1)?.as_deref() {
                    None => 0,
                    Some(&[k]) => k,
                    Some(other) => return Err(c.invalid(format!("k must hold one value, holds {other:?}"))),
                };
                folded(fold::trilu(&x, k, c.attrs.flag("upper", true)?))
            }
            // Tile of a constant folds; of run-time data it is planned as an Expand (see `plan`).
            "Tile" if c.input(0).is_some_and(|n| self.val(c, n).is_ok_and(|v| v.konst.is_some())) => {
                let repeats = self.const_ints(c, 1)?.ok_or_else(|| self.missing(c, 1))?;
                folded(fold::tile(&self.req_const(c, 0)?, &repeats, max))
            }
            "GatherElements" => {
                let (data, idx) = (self.req_const(c, 0)?, self.req_const(c, 1)?);
                folded(fold::gather_elements(c.attrs.int("axis", 0)?, &data, &idx, max))
            }
            _ => Ok(None),
        }
    }

    fn missing(&self, c: &Ctx, i: usize) -> OnnxError {
        OnnxError::MissingInput { node: c.label.clone(), op_type: c.node.op_type.clone(), index: i }
    }

    fn req_const(&self, c: &Ctx, i: usize) -> Result<TensorValue, OnnxError> {
        c.required(i)?;
        self.const_input(c, i)?.ok_or_else(|| self.missing(c, i))
    }

    fn tensor_attr(&self, c: &Ctx, attr: &str, t: &crate::proto::TensorProto) -> Result<TensorValue, OnnxError> {
        let name = format!("{}.{attr}", c.label);
        let (h, data) =
            tensor::decode_in(&name, t.clone(), self.opts.max_tensor_bytes, self.opts.external_data_dir.as_deref())?;
        let bytes = data.ok_or_else(|| c.attrs.err(attr, "tensor has dims but no data"))?;
        Ok(TensorValue::new(h.dtype, h.dims, bytes))
    }

    /// The value of a Constant node (exactly one of its value attributes).
    fn constant(&self, c: &Ctx) -> Result<TensorValue, OnnxError> {
        let names: Vec<&str> = c.attrs.names().collect();
        let [one] = names.as_slice() else {
            return Err(c.invalid(format!("needs exactly one value attribute, has {names:?}")));
        };
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        Ok(match *one {
            "value" => {
                let t = c.attrs.tensor_opt("value")?.ok_or_else(|| c.attrs.err("value", "missing"))?;
                self.tensor_attr(c, "value", t)?
            }
            "value_float" => {
                let f = c.attrs.float("value_float", 0.0)?;
                TensorValue::new(data_type::FLOAT, vec![], f32s(&[f]))
            }
            "value_floats" => {
                let v = c.attrs.floats_opt("value_floats")?.unwrap_or_default();
                TensorValue::new(data_type::FLOAT, vec![v.len()], f32s(&v))
            }
            "value_int" => fold::i64_value(vec![], &[c.attrs.int("value_int", 0)?]),
            "value_ints" => {
                let v = c.attrs.ints_opt("value_ints")?.unwrap_or_default();
                fold::i64_value(vec![v.len()], &v)
            }
            other => return Err(c.unsupported(format!("Constant attribute '{other}'"))),
        })
    }

    /// A list given as an attribute (older opsets) or as constant input `i` (newer ones); both is an error.
    fn attr_or_input(&self, c: &Ctx, attr: &str, i: usize) -> Result<Option<Vec<i64>>, OnnxError> {
        match (c.attrs.ints_opt(attr)?, self.const_ints(c, i)?) {
            (Some(_), Some(_)) => Err(c.invalid(format!("{attr} given both as attribute and as input {i}"))),
            (x, None) | (None, x) => Ok(x),
        }
    }

    /// Builds the graph-ir op for a node; `None` when the op type has no mapping.
    pub(crate) fn plan(&self, c: &Ctx) -> Result<Option<Planned>, OnnxError> {
        let a = &c.attrs;
        let unary = |op: Op| Ok(Some(Planned::new(op, vec![0])));
        let binary = |op: Op| Ok(Some(Planned::new(op, vec![0, 1])));
        let present =
            |from: usize| -> Vec<usize> { (from..c.node.input.len()).filter(|&i| c.input(i).is_some()).collect() };
        match c.op_type() {
            "Neg" => unary(Op::Neg),
            "Abs" => unary(Op::Abs),
            "Exp" => unary(Op::Exp),
            "Log" => unary(Op::Log),
            "Sqrt" => unary(Op::Sqrt),
            "Reciprocal" => unary(Op::Reciprocal),
            "Relu" => unary(Op::Relu),
            "Sigmoid" => unary(Op::Sigmoid),
            "Tanh" => unary(Op::Tanh),
            "Erf" => unary(Op::Erf),
            "Floor" => unary(Op::Floor),
            "Ceil" => unary(Op::Ceil),
            "Not" => unary(Op::Not),
            "HardSwish" => unary(Op::HardSwish),
            "LeakyRelu" => unary(Op::LeakyRelu { alpha: a.float("alpha", 0.01)? }),
            "HardSigmoid" => unary(Op::HardSigmoid { alpha: a.float("alpha", 0.2)?, beta: a.float("beta", 0.5)? }),
            "Gelu" => {
                let approximate = match a.string("approximate", "none")?.as_str() {
                    "none" => GeluApprox::None,
                    "tanh" => GeluApprox::Tanh,
                    other => return Err(a.err("approximate", format!("must be 'none' or 'tanh', got '{other}'"))),
                };
                unary(Op::Gelu { approximate })
            }
            "Clip" => {
                let bound = |i| -> Result<Option<f32>, OnnxError> { Ok(self.const_scalar(c, i)?.map(|v| v as f32)) };
                // graph-ir takes finite bounds only: an infinite bound that does not clamp is no bound.
                let min = bound(1)?.filter(|v| *v != f32::NEG_INFINITY);
                let max = bound(2)?.filter(|v| *v != f32::INFINITY);
                unary(Op::Clip { min, max })
            }
            "Cast" => {
                let to = a.int_opt("to")?.ok_or_else(|| a.err("to", "is required"))?;
                let code = i32::try_from(to).unwrap_or(-1);
                let to = dtype_of(code).ok_or_else(|| OnnxError::UnsupportedDtype {
                    tensor: c.node.output[0].clone(),
                    dtype: data_type::name(code),
                    code,
                })?;
                unary(Op::Cast { to })
            }
            "CastLike" => unary(Op::Cast { to: self.dtype(c, 1)? }),
            "Add" => binary(Op::Add),
            "Sub" => binary(Op::Sub),
            "Mul" => binary(Op::Mul),
            "Div" => binary(Op::Div),
            "Pow" => binary(Op::Pow),
            "Equal" => binary(Op::Equal),
            "Less" => binary(Op::Less),
            "LessOrEqual" => binary(Op::LessOrEqual),
            "Greater" => binary(Op::Greater),
            "GreaterOrEqual" => binary(Op::GreaterOrEqual),
            "And" => binary(Op::And),
            "Or" => binary(Op::Or),
            "Sum" | "Max" | "Min" => {
                let op = match c.op_type() {
                    "Sum" => Op::Add,
                    "Max" => Op::Max,
                    _ => Op::Min,
                };
                if c.node.input.is_empty() || c.node.input.iter().any(String::is_empty) {
                    return Err(c.invalid("needs one or more inputs, none empty"));
                }
                Ok(Some(Planned::new(op, (0..c.node.input.len()).collect())))
            }
            "Where" => Ok(Some(Planned::new(Op::Where, vec![0, 1, 2]))),
            "MatMul" => binary(Op::MatMul),
            "Gemm" => {
                let op = Op::Gemm {
                    alpha: a.float("alpha", 1.0)?,
                    beta: a.float("beta", 1.0)?,
                    trans_a: a.flag("transA", false)?,
                    trans_b: a.flag("transB", false)?,
                };
                let mut ins = vec![0, 1];
                ins.extend(present(2));
                Ok(Some(Planned::new(op, ins)))
            }
            "Conv" => {
                let x = self.dims(c, 0)?;
                let w = self.dims(c, 1)?;
                if x.len() < 3 || w.len() != x.len() {
                    return Err(c.invalid(format!("X {x:?} and W {w:?} must share a rank >= 3")));
                }
                let kernel = w[2..].to_vec();
                if let Some(k) = a.ints_opt("kernel_shape")? {
                    if usizes(c, "kernel_shape", &k)? != kernel {
                        return Err(a.err("kernel_shape", format!("{k:?} disagrees with the weight's dims {w:?}")));
                    }
                }
                let strides = usizes(c, "strides", &a.ints_opt("strides")?.unwrap_or_default())?;
                let dilations = usizes(c, "dilations", &a.ints_opt("dilations")?.unwrap_or_default())?;
                let group = a.int("group", 1)?;
                if group < 1 {
                    return Err(a.err("group", format!("must be >= 1, got {group}")));
                }
                let pads = self.pads(c, &x[2..], &kernel, &strides, &dilations)?;
                let op = Op::Conv(ConvAttrs { strides, pads, dilations, group: group as usize });
                let mut ins = vec![0, 1];
                ins.extend(present(2));
                Ok(Some(Planned::new(op, ins)))
            }
            "MaxPool" | "AveragePool" => {
                let x = self.dims(c, 0)?;
                if x.len() < 3 {
                    return Err(c.invalid(format!("X {x:?} must have rank >= 3")));
                }
                let kernel = a.ints_opt("kernel_shape")?.ok_or_else(|| a.err("kernel_shape", "is required"))?;
                let kernel = usizes(c, "kernel_shape", &kernel)?;
                let strides = usizes(c, "strides", &a.ints_opt("strides")?.unwrap_or_default())?;
                let dilations = usizes(c, "dilations", &a.ints_opt("dilations")?.unwrap_or_default())?;
                let pads = self.pads(c, &x[2..], &kernel, &strides, &dilations)?;
                let attrs = PoolAttrs {
                    kernel_shape: kernel,
                    strides,
                    pads,
                    dilations,
                    ceil_mode: a.flag("ceil_mode", false)?,
                    count_include_pad: a.flag("count_include_pad", false)?,
                };
                unary(if c.op_type() == "MaxPool" { Op::MaxPool(attrs) } else { Op::AveragePool(attrs) })
            }
            "GlobalAveragePool" => unary(Op::GlobalAveragePool),
            "GlobalMaxPool" => {
                let r = self.dims(c, 0)?.len() as i64;
                if r < 3 {
                    return Err(c.invalid("X must have rank >= 3"));
                }
                unary(Op::ReduceMax { axes: Some((2..r).collect()), keepdims: true })
            }
            "BatchNormalization" => {
                if a.flag("training_mode", false)? {
                    return Err(c.unsupported("training_mode=1 (only inference BatchNormalization is supported)"));
                }
                for i in 0..5 {
                    c.required(i)?;
                }
                Ok(Some(Planned::new(Op::BatchNormalization { epsilon: a.float("epsilon", 1e-5)? }, (0..5).collect())))
            }
            "ReduceSum" | "ReduceMean" | "ReduceMax" => {
                let axes = self.attr_or_input(c, "axes", 1)?;
                let keepdims = a.flag("keepdims", true)?;
                let axes = match axes {
                    Some(v) if !v.is_empty() => Some(v),
                    _ if a.flag("noop_with_empty_axes", false)? => return unary(Op::Identity),
                    _ => None,
                };
                unary(match c.op_type() {
                    "ReduceSum" => Op::ReduceSum { axes, keepdims },
                    "ReduceMean" => Op::ReduceMean { axes, keepdims },
                    _ => Op::ReduceMax { axes, keepdims },
                })
            }
            "Softmax" => unary(Op::Softmax { axis: a.int("axis", -1)? }),
            "LayerNormalization" => {
                let op = Op::LayerNormalization { axis: a.int("axis", -1)?, epsilon: a.float("epsilon", 1e-5)? };
                c.required(1)?;
                let mut ins = vec![0, 1];
                ins.extend(present(2));
                Ok(Some(Planned::new(op, ins)))
            }
            "Reshape" => {
                let shape = self.const_ints(c, 1)?.ok_or_else(|| self.missing(c, 1))?;
                unary(Op::Reshape { shape, allowzero: a.flag("allowzero", false)? })
            }
            "Flatten" => unary(Op::Flatten { axis: a.int("axis", 1)? }),
            "Squeeze" => unary(Op::Squeeze { axes: self.attr_or_input(c, "axes", 1)? }),
            "Unsqueeze" => {
                let axes = self.attr_or_input(c, "axes", 1)?.ok_or_else(|| self.missing(c, 1))?;
                unary(Op::Unsqueeze { axes })
            }
            "Identity" => unary(Op::Identity),
            "Dropout" => {
                // Inference: the identity. A training_mode input that is true (or not constant) is not.
                if c.input(2).is_some() && self.const_scalar(c, 2)? != Some(0.0) {
                    return Err(c.unsupported("training_mode=true (Dropout in training)"));
                }
                unary(Op::Identity)
            }
            "Transpose" => {
                let perm = match a.ints_opt("perm")? {
                    Some(p) => Some(usizes(c, "perm", &p)?),
                    None => None,
                };
                unary(Op::Transpose { perm })
            }
            "Slice" => {
                let starts = self.const_ints(c, 1)?.ok_or_else(|| self.missing(c, 1))?;
                let ends = self.const_ints(c, 2)?.ok_or_else(|| self.missing(c, 2))?;
                unary(Op::Slice { starts, ends, axes: self.const_ints(c, 3)?, steps: self.const_ints(c, 4)? })
            }
            "Concat" => {
                let axis = a.int_opt("axis")?.ok_or_else(|| a.err("axis", "is required"))?;
                if c.node.input.is_empty() || c.node.input.iter().any(String::is_empty) {
                    return Err(c.invalid("needs one or more inputs, none empty"));
                }
                Ok(Some(Planned::new(Op::Concat { axis }, (0..c.node.input.len()).collect())))
            }
            "Gather" => binary(Op::Gather { axis: a.int("axis", 0)? }),
            "Expand" => {
                let shape = self.const_ints(c, 1)?.ok_or_else(|| self.missing(c, 1))?;
                unary(Op::Expand { shape })
            }
            "Tile" => {
                // Tile equals Expand when every repeated axis has extent 1 (the common repeat of a batch-1
                // tensor); other tilings of run-time data have no graph-ir op.
                let x = self.dims(c, 0)?;
                let repeats = self.const_ints(c, 1)?.ok_or_else(|| self.missing(c, 1))?;
                let dims = fold::tile_dims(&x, &repeats).map_err(|e| c.invalid(e))?;
                if x.iter().zip(&repeats).any(|(&d, &k)| k != 1 && d != 1) {
                    return Err(c.unsupported(format!(
                        "Tile of run-time data with dims {x:?} by {repeats:?} (only axes of extent 1 may repeat)"
                    )));
                }
                unary(Op::Expand { shape: dims.iter().map(|&d| d as i64).collect() })
            }
            "Pad" => self.pad(c).map(Some),
            "Split" => self.split(c).map(Some),
            _ => Ok(None),
        }
    }

    /// Explicit begin-then-end pads for a Conv or pool, resolving `auto_pad` against the input's spatial
    /// extents (ONNX: SAME_UPPER puts the odd padding at the end, SAME_LOWER at the beginning).
    fn pads(
        &self,
        c: &Ctx,
        spatial: &[usize],
        kernel: &[usize],
        strides: &[usize],
        dilations: &[usize],
    ) -> Result<Vec<usize>, OnnxError> {
        let a = &c.attrs;
        let n = spatial.len();
        let explicit = a.ints_opt("pads")?;
        let mode = a.string("auto_pad", "NOTSET")?;
        match mode.as_str() {
            "NOTSET" => usizes(c, "pads", &explicit.unwrap_or_default()),
            "VALID" | "SAME_UPPER" | "SAME_LOWER" if explicit.as_ref().is_some_and(|p| p.iter().any(|&v| v != 0)) => {
                Err(a.err("pads", format!("cannot be combined with auto_pad={mode}")))
            }
            "VALID" => Ok(vec![0; 2 * n]),
            "SAME_UPPER" | "SAME_LOWER" => {
                if kernel.len() != n {
                    return Err(a.err("kernel_shape", format!("has {} values for {n} spatial axes", kernel.len())));
                }
                let pick = |v: &[usize], attr: &str| -> Result<Vec<usize>, OnnxError> {
                    match v.len() {
                        0 => Ok(vec![1; n]),
                        l if l == n => Ok(v.to_vec()),
                        l => Err(a.err(attr, format!("has {l} values for {n} spatial axes"))),
                    }
                };
                let (s, d) = (pick(strides, "strides")?, pick(dilations, "dilations")?);
                let mut pads = vec![0usize; 2 * n];
                for i in 0..n {
                    if s[i] == 0 || kernel[i] == 0 {
                        return Err(a.err("strides", "strides and kernel extents must be >= 1"));
                    }
                    let out = spatial[i].div_ceil(s[i]);
                    let eff = d[i].saturating_mul(kernel[i] - 1).saturating_add(1);
                    let total =
                        (out.saturating_sub(1)).saturating_mul(s[i]).saturating_add(eff).saturating_sub(spatial[i]);
                    let small = total / 2;
                    let (begin, end) =
                        if mode == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                    pads[i] = begin;
                    pads[i + n] = end;
                }
                Ok(pads)
            }
            other => Err(a.err("auto_pad", format!("unknown value '{other}'"))),
        }
    }

    fn pad(&self, c: &Ctx) -> Result<Planned, OnnxError> {
        let a = &c.attrs;
        let mode = match a.string("mode", "constant")?.as_str() {
            "constant" => PadMode::Constant,
            "reflect" => PadMode::Reflect,
            "edge" => PadMode::Edge,
            "wrap" => return Err(c.unsupported("mode 'wrap'")),
            other => return Err(a.err("mode", format!("unknown value '{other}'"))),
        };
        let pads = self.const_ints(c, 1)?.ok_or_else(|| self.missing(c, 1))?;
        let value = self.const_scalar(c, 2)?.unwrap_or(0.0) as f32;
        let pads = match self.const_ints(c, 3)? {
            None => pads,
            Some(axes) => {
                let r = self.dims(c, 0)?.len();
                if pads.len() != 2 * axes.len() {
                    return Err(c.invalid(format!("pads has {} values for {} axes", pads.len(), axes.len())));
                }
                let mut full = vec![0i64; 2 * r];
                for (k, &ax) in axes.iter().enumerate() {
                    let i = normalize_axis(ax, r)
                        .ok_or_else(|| c.invalid(format!("axis {ax} out of range for rank {r}")))?;
                    full[i] = pads[k];
                    full[i + r] = pads[k + axes.len()];
                }
                full
            }
        };
        Ok(Planned::new(Op::Pad { pads, mode, value }, vec![0]))
    }

    fn split(&self, c: &Ctx) -> Result<Planned, OnnxError> {
        let a = &c.attrs;
        let x = self.dims(c, 0)?;
        let axis = a.int("axis", 0)?;
        let ax = normalize_axis(axis, x.len())
            .ok_or_else(|| a.err("axis", format!("{axis} out of range for rank {}", x.len())))?;
        let extent = x[ax];
        let n = c.node.output.len();
        // Sizes come from the `split` input (13+); the attribute form (before 13) is accepted too.
        let splits = match (self.attr_or_input(c, "split", 1)?, a.int_opt("num_outputs")?) {
            (Some(s), _) => usizes(c, "split", &s)?,
            (None, Some(k)) => {
                if k < 1 || k as usize != n {
                    return Err(a.err("num_outputs", format!("is {k} but the node has {n} outputs")));
                }
                // Opset 18: chunks of ceil(extent / k); the last takes what is left.
                let chunk = extent.div_ceil(n);
                let last = chunk
                    .checked_mul(n - 1)
                    .and_then(|used| extent.checked_sub(used))
                    .ok_or_else(|| a.err("num_outputs", format!("{n} chunks of {chunk} exceed the extent {extent}")))?;
                let mut v = vec![chunk; n - 1];
                v.push(last);
                v
            }
            (None, None) => {
                if n == 0 || extent % n != 0 {
                    return Err(c.invalid(format!("cannot split extent {extent} evenly into {n} outputs")));
                }
                vec![extent / n; n]
            }
        };
        if splits.len() != n {
            return Err(c.invalid(format!("split has {} sizes for {n} outputs", splits.len())));
        }
        Ok(Planned::new(Op::Split { axis, splits }, vec![0]))
    }
}
