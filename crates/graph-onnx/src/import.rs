//! The importer proper: walks the nodes in topological order and builds the `ComputeGraph`.
//!
//! Each ONNX value is tracked as a [`Val`]: its element type and dims, its data when known at compile time
//! (initializers with data, `Constant` outputs, folded results), and its graph tensor once one exists.
//! Graph tensors are created lazily, on first use as an op's data input, so that initializers read only as
//! attributes (Reshape targets, Slice bounds, Pad pads, axes) never become tensors, and unused initializers
//! are dropped. For each node the importer first builds the graph-ir `Op` from attributes and constant inputs
//! ([`Importer::plan`], in `ops.rs`), then either folds it (all inputs constant and an integer/bool result,
//! see `fold.rs`) or adds it to the graph, whose builder infers the output shapes; those are checked against
//! the file's `value_info` and graph outputs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use graph_ir::{ComputeGraph, DType, Limits, Op, Shape, TensorId, TensorRole};

use crate::attr::Attrs;
use crate::error::OnnxError;
use crate::fold;
use crate::model::{node_label, show_decl, Parsed, Structure};
use crate::proto::{data_type, NodeProto};
use crate::tensor::TensorValue;
use crate::types::{code_of, dtype_of};
use crate::{ImportOptions, ImportStats, OnnxModel, WeightData};

/// One ONNX value as the importer knows it.
pub(crate) struct Val {
    /// ONNX element type.
    pub(crate) code: i32,
    /// Static dims.
    pub(crate) dims: Vec<usize>,
    /// Data, when known at compile time.
    pub(crate) konst: Option<TensorValue>,
    /// The graph tensor, once created.
    pub(crate) id: Option<TensorId>,
    /// Computed by constant folding (not an initializer of the file).
    pub(crate) folded: bool,
}

/// What a node becomes: a graph-ir op and the positions of the ONNX inputs that are its tensor inputs.
pub(crate) struct Planned {
    pub(crate) op: Op,
    pub(crate) inputs: Vec<usize>,
}

impl Planned {
    pub(crate) fn new(op: Op, inputs: Vec<usize>) -> Self {
        Planned { op, inputs }
    }
}

/// The node being imported, with what error messages need.
pub(crate) struct Ctx<'n> {
    pub(crate) node: &'n NodeProto,
    pub(crate) label: String,
    pub(crate) attrs: Attrs<'n>,
}

impl Ctx<'_> {
    pub(crate) fn op_type(&self) -> &str {
        &self.node.op_type
    }

    pub(crate) fn invalid(&self, problem: impl Into<String>) -> OnnxError {
        OnnxError::InvalidNode { node: self.label.clone(), op_type: self.node.op_type.clone(), problem: problem.into() }
    }

    pub(crate) fn unsupported(&self, what: impl Into<String>) -> OnnxError {
        OnnxError::Unsupported { node: self.label.clone(), op_type: self.node.op_type.clone(), what: what.into() }
    }

    /// The name of input `i`, `None` when absent (past the end or the empty name).
    pub(crate) fn input(&self, i: usize) -> Option<&str> {
        self.node.input.get(i).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// The name of a required input.
    pub(crate) fn required(&self, i: usize) -> Result<&str, OnnxError> {
        self.input(i).ok_or_else(|| OnnxError::MissingInput {
            node: self.label.clone(),
            op_type: self.node.op_type.clone(),
            index: i,
        })
    }
}

pub(crate) struct Importer<'o> {
    pub(crate) opts: &'o ImportOptions,
    graph: ComputeGraph,
    values: HashMap<String, Val>,
    /// The model's declared types and node order, shared by every import of one decode.
    structure: Arc<Structure>,
    /// Optional outputs (index 1 and up) that some node reads or the graph lists as outputs.
    used: HashSet<String>,
    weights: Vec<WeightData>,
    stats: ImportStats,
}

/// Runs the whole import on a parsed model.
pub(crate) fn build(parsed: Parsed, opts: &ImportOptions) -> Result<OnnxModel, OnnxError> {
    let Parsed { opset, producer, ir_version, graph: gp, initializers, inputs, structure } = parsed;
    let name = if gp.name.is_empty() { "onnx".to_string() } else { gp.name.clone() };
    let limits = Limits { max_tensor_bytes: opts.max_tensor_bytes, ..Limits::default() };
    // Which optional outputs (beyond the first) some node or the graph reads: few, so only those are kept.
    let optional: HashSet<&str> = gp.node.iter().flat_map(|n| n.output.iter().skip(1)).map(String::as_str).collect();
    let used: HashSet<String> = gp
        .node
        .iter()
        .flat_map(|n| &n.input)
        .chain(gp.output.iter().map(|o| &o.name))
        .filter(|name| optional.contains(name.as_str()))
        .cloned()
        .collect();
    let mut imp = Importer {
        opts,
        graph: ComputeGraph::with_limits(name, limits),
        values: HashMap::with_capacity(gp.node.len() * 2 + initializers.len()),
        structure: Arc::clone(&structure),
        used,
        weights: Vec::new(),
        stats: ImportStats { onnx_nodes: gp.node.len(), ..ImportStats::default() },
    };
    // Sizes known up front (bounded by what was parsed, and capped by the limits): no regrowing name maps.
    imp.graph.reserve_with_headroom(gp.node.len(), gp.node.len() + initializers.len() + inputs.len());

    for input in inputs {
        let dtype = dtype_of(input.dtype).ok_or_else(|| OnnxError::UnsupportedDtype {
            tensor: input.name.clone(),
            dtype: data_type::name(input.dtype),
            code: input.dtype,
        })?;
        let id = imp.graph.add_input(&input.name, dtype, Shape::new(input.dims.clone()))?;
        imp.values
            .insert(input.name, Val { code: input.dtype, dims: input.dims, konst: None, id: Some(id), folded: false });
    }
    for (name, init) in initializers {
        imp.check_declared(&name, init.dtype, &init.dims)?;
        let konst = init.value;
        imp.values.insert(name, Val { code: init.dtype, dims: init.dims, konst, id: None, folded: false });
    }

    for &i in &structure.order {
        imp.node(&gp.node[i], i)?;
    }

    for o in &gp.output {
        imp.mark_output(&o.name)?;
    }
    imp.graph.validate()?;
    imp.stats.graph_nodes = imp.graph.num_nodes();
    imp.stats.unused_initializers = imp.values.values().filter(|v| v.id.is_none() && v.konst.is_some()).count();
    Ok(OnnxModel { graph: imp.graph, weights: imp.weights, opset, ir_version, producer, stats: imp.stats })
}

impl Importer<'_> {
    /// The value named `name`, which topological order guarantees is defined.
    pub(crate) fn val(&self, c: &Ctx, name: &str) -> Result<&Val, OnnxError> {
        self.values.get(name).ok_or_else(|| OnnxError::UndefinedTensor {
            node: c.label.clone(),
            op_type: c.node.op_type.clone(),
            tensor: name.to_string(),
        })
    }

    /// Dims of required input `i`.
    pub(crate) fn dims(&self, c: &Ctx, i: usize) -> Result<Vec<usize>, OnnxError> {
        Ok(self.val(c, c.required(i)?)?.dims.clone())
    }

    /// The compile-time value of input `i`: `None` when the input is absent, an error when it is present but
    /// computed at run time.
    pub(crate) fn const_input(&self, c: &Ctx, i: usize) -> Result<Option<TensorValue>, OnnxError> {
        let Some(name) = c.input(i) else { return Ok(None) };
        match &self.val(c, name)?.konst {
            Some(k) => Ok(Some(k.clone())),
            None => Err(OnnxError::NonConstantInput {
                node: c.label.clone(),
                op_type: c.node.op_type.clone(),
                index: i,
                tensor: name.to_string(),
            }),
        }
    }

    /// A constant integer input as a list (`None` when absent).
    pub(crate) fn const_ints(&self, c: &Ctx, i: usize) -> Result<Option<Vec<i64>>, OnnxError> {
        let Some(v) = self.const_input(c, i)? else { return Ok(None) };
        if v.dims.len() > 1 {
            return Err(c.invalid(format!("input {i} must be a scalar or 1-D, has dims {:?}", v.dims)));
        }
        v.to_i64s()
            .map(Some)
            .ok_or_else(|| c.invalid(format!("input {i} must be integer, is {}", data_type::name(v.dtype))))
    }

    /// A constant scalar input (one element) as f64 (`None` when absent).
    pub(crate) fn const_scalar(&self, c: &Ctx, i: usize) -> Result<Option<f64>, OnnxError> {
        let Some(v) = self.const_input(c, i)? else { return Ok(None) };
        match v.to_f64s().as_slice() {
            [x] => Ok(Some(*x)),
            other => Err(c.invalid(format!("input {i} must hold one value, holds {}", other.len()))),
        }
    }

    /// The graph tensor of value `name`, creating it on first use: a constant (data inline in the graph) when
    /// small, a weight otherwise (data, if any, in [`OnnxModel::weights`]).
    fn materialize(&mut self, name: &str) -> Result<TensorId, OnnxError> {
        let (code, dims, konst, folded) = match self.values.get(name) {
            Some(Val { id: Some(id), .. }) => return Ok(*id),
            Some(v) => (v.code, v.dims.clone(), v.konst.clone(), v.folded),
            None => return Err(OnnxError::UndefinedOutput(name.to_string())),
        };
        let dtype = dtype_of(code).ok_or_else(|| OnnxError::UnsupportedDtype {
            tensor: name.to_string(),
            dtype: data_type::name(code),
            code,
        })?;
        let max_constant = self.graph.limits().max_constant_bytes;
        let inline_limit = if folded && self.opts.inline_folded {
            max_constant
        } else {
            self.opts.inline_constant_bytes.min(max_constant)
        };
        let shape = Shape::new(dims);
        let id = match konst {
            Some(k) if k.bytes.len() <= inline_limit => {
                self.graph.add_constant(name, dtype, shape, k.bytes.to_vec())?
            }
            Some(k) => {
                let id = self.graph.add_weight(name, dtype, shape.clone())?;
                self.weights.push(WeightData {
                    tensor: id,
                    name: name.to_string(),
                    dtype,
                    shape,
                    bytes: k.bytes.clone(),
                });
                id
            }
            None => self.graph.add_weight(name, dtype, shape)?,
        };
        if let Some(v) = self.values.get_mut(name) {
            v.id = Some(id);
        }
        Ok(id)
    }

    /// Checks a value's type and dims against what the file declares for it, if anything.
    fn check_declared(&self, name: &str, code: i32, dims: &[usize]) -> Result<(), OnnxError> {
        let Some(decl) = self.structure.declared.get(name) else { return Ok(()) };
        let type_ok = decl.elem_type == 0 || decl.elem_type == code;
        let resolved = decl.resolved(&self.opts.dims);
        let dims_ok = match &resolved {
            None => true,
            Some(r) => r.len() == dims.len() && r.iter().zip(dims).all(|(d, &x)| d.is_none_or(|d| d == x)),
        };
        if type_ok && dims_ok {
            return Ok(());
        }
        let shown = |code: i32, dims: String| format!("{} {dims}", data_type::name(code));
        Err(OnnxError::ShapeMismatch {
            tensor: name.to_string(),
            declared: shown(decl.elem_type, resolved.map_or_else(|| "[unknown rank]".to_string(), |r| show_decl(&r))),
            inferred: shown(code, format!("{:?}", dims)),
        })
    }

    fn define(&mut self, name: &str, val: Val) -> Result<(), OnnxError> {
        self.check_declared(name, val.code, &val.dims)?;
        self.values.insert(name.to_string(), val);
        Ok(())
    }

    /// A unique, non-empty node name for graph-ir.
    fn node_name(&self, preferred: &str, fallback: &str) -> String {
        let base = if preferred.is_empty() { fallback } else { preferred };
        if self.graph.node_id(base).is_none() {
            return base.to_string();
        }
        (1..).map(|k| format!("{base}_{k}")).find(|n| self.graph.node_id(n).is_none()).unwrap_or_default()
    }

    /// A tensor name no ONNX value and no graph tensor uses.
    fn fresh_tensor_name(&self, base: &str) -> String {
        (0..)
            .map(|k| format!("{base}/{k}"))
            .find(|n| !self.values.contains_key(n) && self.graph.tensor_id(n).is_none())
            .unwrap_or_default()
    }

    fn node(&mut self, node: &NodeProto, index: usize) -> Result<(), OnnxError> {
        let label = node_label(node, index);
        if !(node.domain.is_empty() || node.domain == "ai.onnx") {
            return Err(OnnxError::UnsupportedOp {
                node: label,
                op_type: node.op_type.clone(),
                domain: node.domain.clone(),
            });
        }
        let c = Ctx { node, label, attrs: Attrs::new(node)? };
        if node.output.first().is_none_or(String::is_empty) {
            return Err(c.invalid("has no output"));
        }

        // Ops graph-ir lacks: they must fold to constants.
        if let Some(values) = self.fold_special(&c)? {
            return self.define_folded(&c, values);
        }
        let Some(planned) = self.plan(&c)? else {
            return Err(OnnxError::UnsupportedOp {
                node: c.label.clone(),
                op_type: node.op_type.clone(),
                domain: node.domain.clone(),
            });
        };
        if let Some(v) = self.try_fold(&c, &planned)? {
            return self.define_folded(&c, vec![v]);
        }
        self.add(&c, planned)
    }

    /// Records folded values for the node's outputs.
    fn define_folded(&mut self, c: &Ctx, values: Vec<TensorValue>) -> Result<(), OnnxError> {
        if values.len() < c.node.output.iter().filter(|o| !o.is_empty()).count() {
            return Err(c.unsupported("outputs beyond the first when folding constants"));
        }
        for (name, v) in c.node.output.iter().zip(values) {
            if name.is_empty() {
                continue;
            }
            self.define(name, Val { code: v.dtype, dims: v.dims.clone(), konst: Some(v), id: None, folded: true })?;
        }
        self.stats.folded_nodes += 1;
        Ok(())
    }

    /// Folds a graph-ir op whose tensor inputs are all constants when the result is integer or bool, or an f32
    /// result of a correctly rounded operation (`fold::float_exact`).
    fn try_fold(&self, c: &Ctx, p: &Planned) -> Result<Option<TensorValue>, OnnxError> {
        let mut ins = Vec::with_capacity(p.inputs.len());
        for &i in &p.inputs {
            let name = c.required(i)?;
            match &self.val(c, name)?.konst {
                Some(k) => ins.push(k.clone()),
                None => return Ok(None),
            }
        }
        if ins.is_empty() {
            return Ok(None);
        }
        let refs: Vec<&TensorValue> = ins.iter().collect();
        // Decide from types alone whether the result would be an index value, before computing anything.
        let result_code = match &p.op {
            Op::Equal | Op::Less | Op::LessOrEqual | Op::Greater | Op::GreaterOrEqual | Op::And | Op::Or | Op::Not => {
                data_type::BOOL
            }
            Op::Cast { to } => code_of(*to),
            Op::Where => refs.get(1).map_or(0, |v| v.dtype),
            _ => refs[0].dtype,
        };
        let max = self.opts.max_fold_bytes;
        if !fold::is_index_type(result_code) {
            return fold::float_exact(&p.op, &refs, max)
                .map_err(|e| c.invalid(format!("while folding constants: {e}")));
        }
        let binary = p.op.arity() == graph_ir::op::Arity::Exact(2);
        let r = match &p.op {
            Op::Identity | Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. } => {
                fold::view(&p.op, refs[0]).map(Some)
            }
            Op::Concat { axis } => fold::concat(*axis, &refs, max).map(Some),
            Op::Gather { axis } if refs.len() == 2 => fold::gather(*axis, refs[0], refs[1], max).map(Some),
            Op::Slice { .. } => fold::slice(&p.op, refs[0], max).map(Some),
            Op::Expand { shape } => fold::expand(shape, refs[0], max).map(Some),
            Op::Where if refs.len() == 3 => fold::where_(refs[0], refs[1], refs[2], max).map(Some),
            Op::Cast { to } => Ok(fold::cast_to_int(refs[0], code_of(*to))),
            Op::Neg | Op::Abs | Op::Not => fold::unary(p.op.name(), refs[0]),
            Op::Transpose { .. } => fold::transpose(&p.op, refs[0], max).map(Some),
            // Variadic Sum/Max/Min (one input: the identity) fold left to right, as `add` chains them.
            _ if binary && refs.len() == 1 => Ok(Some(refs[0].clone())),
            op if binary => {
                let mut acc = refs[0].clone();
                for next in &refs[1..] {
                    match fold::binary(op.name(), &acc, next, max) {
                        Ok(Some(v)) => acc = v,
                        other => return other.map_err(|e| c.invalid(format!("while folding constants: {e}"))),
                    }
                }
                Ok(Some(acc))
            }
            _ => Ok(None),
        };
        r.map_err(|e| c.invalid(format!("while folding constants: {e}")))
    }

    /// Adds the planned op to the graph (chaining variadic Sum/Max/Min), and records its outputs.
    fn add(&mut self, c: &Ctx, p: Planned) -> Result<(), OnnxError> {
        let mut ids = Vec::with_capacity(p.inputs.len());
        for &i in &p.inputs {
            let name = c.required(i)?.to_string();
            ids.push(self.materialize(&name)?);
        }
        let n_out = p.op.num_outputs();
        let outs = &c.node.output;
        if outs.len() < n_out || outs[..n_out].iter().any(String::is_empty) {
            return Err(c.invalid(format!("lists {} outputs, {} needs {n_out}", outs.len(), p.op.name())));
        }
        for (k, extra) in outs.iter().enumerate().skip(n_out) {
            if !extra.is_empty() && self.used.contains(extra) {
                return Err(c.unsupported(format!("optional output {k} ('{extra}'), which the graph reads")));
            }
        }
        let fallback = format!("{}_{}", c.op_type(), self.graph.num_nodes());
        let name = self.node_name(&c.node.name, &fallback);

        // Variadic Sum/Max/Min: one input is an Identity, more than two a left-to-right chain.
        let binary = p.op.arity() == graph_ir::op::Arity::Exact(2);
        let (op, ids) = if binary && ids.len() == 1 {
            (Op::Identity, ids)
        } else if binary && ids.len() > 2 {
            let mut acc = ids[0];
            for (k, &next) in ids[1..ids.len() - 1].iter().enumerate() {
                let t = self.fresh_tensor_name(&outs[0]);
                let n = self.node_name(&format!("{name}/{k}"), &fallback);
                acc = self.graph.add_node_named(&n, p.op.clone(), &[acc, next], &[t.as_str()])?[0];
            }
            (p.op, vec![acc, ids[ids.len() - 1]])
        } else {
            (p.op, ids)
        };
        let out_names: Vec<&str> = outs[..n_out].iter().map(String::as_str).collect();
        let out_ids = self.graph.add_node_named(&name, op, &ids, &out_names)?;
        for (oname, id) in out_names.iter().zip(out_ids) {
            let t = self.graph.tensor(id);
            let (code, dims) = (code_of(t.dtype), t.shape.0.to_vec());
            self.define(oname, Val { code, dims, konst: None, id: Some(id), folded: false })?;
        }
        Ok(())
    }

    /// Marks a graph output. graph-ir outputs must be produced by a node, so a folded constant output is
    /// moved under a fresh name and copied out through an Identity node.
    fn mark_output(&mut self, name: &str) -> Result<(), OnnxError> {
        let not_computed = || {
            OnnxError::UnsupportedFeature(format!(
                "graph output '{name}' is a graph input or weight; cuplan outputs must be computed by a node"
            ))
        };
        let v = self.values.get(name).ok_or_else(|| OnnxError::UndefinedOutput(name.to_string()))?;
        if let Some(id) = v.id {
            return match self.graph.tensor(id).role {
                TensorRole::Intermediate | TensorRole::Output => Ok(self.graph.mark_output(id)?),
                _ => Err(not_computed()),
            };
        }
        if v.konst.is_none() {
            return Err(not_computed());
        }
        let src_name = self.fresh_tensor_name(name);
        let Some(v) = self.values.remove(name) else { return Err(not_computed()) };
        let (code, dims) = (v.code, v.dims.clone());
        self.values.insert(src_name.clone(), v);
        let src = self.materialize(&src_name)?;
        let node = self.node_name(name, "output");
        let out = self.graph.add_node_named(&node, Op::Identity, &[src], &[name])?[0];
        self.graph.mark_output(out)?;
        self.values.insert(name.to_string(), Val { code, dims, konst: None, id: Some(out), folded: false });
        Ok(())
    }

    /// The graph-ir dtype of required input `i` (CastLike's target).
    pub(crate) fn dtype(&self, c: &Ctx, i: usize) -> Result<DType, OnnxError> {
        let name = c.required(i)?;
        let code = self.val(c, name)?.code;
        dtype_of(code).ok_or_else(|| OnnxError::UnsupportedDtype {
            tensor: name.to_string(),
            dtype: data_type::name(code),
            code,
        })
    }
}
