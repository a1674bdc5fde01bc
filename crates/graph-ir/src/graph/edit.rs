//! In-place rewriting of an owned graph: [`ComputeGraph::edit`] opens a [`GraphEdit`] that re-places the graph's
//! nodes one by one in a new order (with new inputs or a new op, their outputs re-inferred), splices new nodes
//! between them, retypes sources and renames tensors; [`GraphEdit::finish`] stores the nodes in the new order, so
//! that creation order stays a topological order.
//!
//! A rewrite that builds a second graph copies every name and shape onto the heap and frees the first graph's;
//! an edit moves them. The precision transform is the user: on BERT-base the copy costs about half an f32 plan.

use slotmap::{SecondaryMap, SlotMap};
use std::sync::Arc;

use super::{ComputeGraph, Node, NodeId, Tensor, TensorId, TensorRole};
use crate::error::{GraphError, GraphResult};
use crate::infer::infer_stored;
use crate::op::Op;
use crate::{DType, Shape};

/// An in-place rewrite of an owned graph (module docs). Every node of the graph it was opened on must be placed
/// exactly once, after the producers of its inputs; new nodes are placed where they are added. A call that
/// returns an error may have changed the graph: drop the edit then.
#[derive(Debug)]
pub struct GraphEdit {
    g: ComputeGraph,
    /// Placed nodes (original and new), in the new order.
    order: Vec<NodeId>,
    /// Nodes of the original graph not placed yet.
    pending: SecondaryMap<NodeId, ()>,
    /// The dtype the input graph gave each tensor this edit has retyped.
    was: SecondaryMap<TensorId, DType>,
}

impl ComputeGraph {
    /// Open an in-place rewrite of this graph (see [`GraphEdit`]).
    pub fn edit(self) -> GraphEdit {
        let pending = self.nodes.keys().map(|n| (n, ())).collect();
        // No `reserve` for the nodes it may add: the name maps usually have the room already (their capacity is
        // rounded up), and reserving a fixed headroom would rehash them when they do not.
        let extra = self.nodes.len() / 4 + 16;
        let order = Vec::with_capacity(self.nodes.len() + extra);
        GraphEdit { g: self, order, pending, was: SecondaryMap::new() }
    }
}

fn edit_error(detail: String) -> GraphError {
    GraphError::Edit { detail }
}

impl GraphEdit {
    /// A tensor by id, as edited so far. Panics on a foreign id, as [`ComputeGraph::tensor`].
    pub fn tensor(&self, t: TensorId) -> &Tensor {
        self.g.tensor(t)
    }

    /// A node by id, as edited so far (an unplaced node still has its original inputs).
    pub fn node(&self, n: NodeId) -> &Node {
        self.g.node(n)
    }

    /// The node writing `t`, if any.
    pub fn producer(&self, t: TensorId) -> Option<NodeId> {
        self.g.producer(t)
    }

    /// Whether a tensor or a node already has this name.
    pub fn name_taken(&self, name: &str) -> bool {
        self.g.tensor_by_name.contains_key(name) || self.g.node_by_name.contains_key(name)
    }

    /// Whether `t` can be read by the next placed node: a source, or written by a placed node.
    fn available(&self, t: TensorId) -> bool {
        let placed = |p: NodeId| !self.pending.contains_key(p);
        self.g.tensors.get(t).is_some_and(|x| x.role.is_source() || x.producer.is_some_and(placed))
    }

    fn check_inputs(&self, node: &str, inputs: &[TensorId]) -> GraphResult<()> {
        for &t in inputs {
            if !self.g.tensors.contains_key(t) {
                return Err(GraphError::ForeignTensor { id: format!("{t:?}"), graph: self.g.name.clone() });
            }
            if !self.available(t) {
                let tensor = &self.g.tensors[t].name;
                return Err(edit_error(format!("node '{node}' is placed before the producer of its input '{tensor}'")));
            }
        }
        Ok(())
    }

    /// Give source `t` (an input, weight or constant) dtype `dtype`; a constant takes `data` as its new bytes
    /// (required for a constant, refused for the others).
    pub fn retype_source(&mut self, t: TensorId, dtype: DType, data: Option<Vec<u8>>) -> GraphResult<()> {
        let limits = self.g.limits;
        let Some(x) = self.g.tensors.get_mut(t) else {
            return Err(GraphError::ForeignTensor { id: format!("{t:?}"), graph: self.g.name.clone() });
        };
        let name = &x.name;
        match (x.role, &data) {
            (TensorRole::Constant, Some(d)) => {
                if x.shape.byte_size(dtype) != Some(d.len()) {
                    return Err(GraphError::ConstantData {
                        tensor: name.to_string(),
                        detail: format!("{} data bytes for shape {} of {dtype}", d.len(), x.shape),
                    });
                }
            }
            (TensorRole::Input | TensorRole::Weight, None) => {}
            (role, _) => {
                return Err(edit_error(format!(
                    "retype_source: tensor '{name}' is a {role:?}{}",
                    if data.is_some() { " and takes no data" } else { " and needs its new data" }
                )))
            }
        }
        let bytes = x.shape.byte_size(dtype);
        if bytes.is_none_or(|b| b as u64 > limits.max_tensor_bytes) {
            return Err(GraphError::LimitExceeded {
                what: format!("tensor '{name}' bytes as {dtype}"),
                value: bytes.map_or(u64::MAX, |b| b as u64),
                limit: limits.max_tensor_bytes,
            });
        }
        if x.dtype != dtype {
            if let Some(e) = self.was.entry(t) {
                e.or_insert(x.dtype);
            }
        }
        x.dtype = dtype;
        if let Some(d) = data {
            x.data = Some(Arc::from(d));
        }
        Ok(())
    }

    /// Place original node `n` next, reading `inputs` and computing `op` (its own op when `None`); its outputs keep
    /// their ids, names and shapes and take the dtypes inference gives for the new inputs.
    pub fn place(&mut self, n: NodeId, op: Option<Op>, inputs: &[TensorId]) -> GraphResult<()> {
        self.place_with(n, op, inputs, None)
    }

    /// Place original node `n` next as a mixed-precision node ([`Node::store`]): it reads `inputs` whatever
    /// their float dtypes and stores its float outputs in `store`. Its op must [`Op::stores_mixed`].
    pub fn place_stored(&mut self, n: NodeId, inputs: &[TensorId], store: DType) -> GraphResult<()> {
        self.place_with(n, None, inputs, Some(store))
    }

    fn place_with(&mut self, n: NodeId, op: Option<Op>, inputs: &[TensorId], store: Option<DType>) -> GraphResult<()> {
        if self.pending.remove(n).is_none() {
            let what = match self.g.nodes.get(n) {
                Some(node) => format!("node '{}' is placed twice, or was added by this edit", node.name),
                None => format!("node id {n:?} does not belong to graph '{}'", self.g.name),
            };
            return Err(edit_error(what));
        }
        self.check_inputs(&self.g.nodes[n].name, inputs)?;
        // Inference is a function of the op and its operands' dtypes and shapes: a node with its own op whose
        // operands have the dtypes and shapes its original inputs had keeps its outputs as they are.
        let node = &self.g.nodes[n];
        let dtype_was = |t: TensorId| self.was.get(t).copied().unwrap_or(self.g.tensors[t].dtype);
        let same = op.is_none()
            && store.is_none()
            && node.inputs.len() == inputs.len()
            && node.inputs.iter().zip(inputs).all(|(&old, &new)| {
                let (a, b) = (&self.g.tensors[old], &self.g.tensors[new]);
                b.dtype == dtype_was(old) && b.shape == a.shape
            });
        if same {
            return self.rewire(n, inputs);
        }
        if op.is_none() && store.is_none() && node.store.is_none() {
            if let Some((from, to)) = float_renaming(node, inputs, &self.g.tensors, dtype_was) {
                return self.rename_outputs(n, inputs, from, to);
            }
        }
        if let Some(op) = op {
            self.g.nodes[n].op = op;
        }
        if store.is_some() {
            self.g.nodes[n].store = store;
        }
        // Infer from the new inputs; every output keeps its shape and takes the inferred dtype.
        let node = &self.g.nodes[n];
        let specs = {
            // The operands on the stack for the usual few inputs (this runs once per node of the graph).
            const ON_STACK: usize = 8;
            static NONE: std::sync::LazyLock<Shape> = std::sync::LazyLock::new(Shape::scalar);
            let mut stack = [(DType::F32, &*NONE); ON_STACK];
            let heap: Vec<(DType, &Shape)>;
            let operand = |t: TensorId| (self.g.tensors[t].dtype, &self.g.tensors[t].shape);
            let ins: &[(DType, &Shape)] = if inputs.len() <= ON_STACK {
                for (slot, &t) in stack.iter_mut().zip(inputs) {
                    *slot = operand(t);
                }
                &stack[..inputs.len()]
            } else {
                heap = inputs.iter().map(|&t| operand(t)).collect();
                &heap
            };
            infer_stored(&node.op, node.store, ins)
                .map_err(|e| super::infer_error(&node.name, &node.op, ins.len(), e))?
        };
        if specs.len() != node.outputs.len() {
            let (name, op, got) = (node.name.clone(), node.op.name(), node.outputs.len());
            return Err(GraphError::OutputCount { node: name.to_string(), op, expected: specs.len(), got });
        }
        let limit = self.g.limits.max_tensor_bytes;
        for (spec, &o) in specs.into_iter().zip(&node.outputs) {
            let x = &mut self.g.tensors[o];
            if spec.shape != x.shape {
                return Err(GraphError::DeclaredMismatch {
                    tensor: x.name.to_string(),
                    declared: format!("{} {}", x.dtype, x.shape),
                    inferred: format!("{} {} after the edit of node '{}'", spec.dtype, spec.shape, node.name),
                });
            }
            let bytes = x.shape.byte_size(spec.dtype);
            if bytes.is_none_or(|b| b as u64 > limit) {
                return Err(GraphError::LimitExceeded {
                    what: format!("tensor '{}' bytes as {}", x.name, spec.dtype),
                    value: bytes.map_or(u64::MAX, |b| b as u64),
                    limit,
                });
            }
            if x.dtype != spec.dtype {
                if let Some(e) = self.was.entry(o) {
                    e.or_insert(x.dtype);
                }
            }
            x.dtype = spec.dtype;
        }
        self.rewire(n, inputs)
    }

    /// Place `n` reading `inputs`, whose float operands are its old ones with dtype `from` renamed to `to`
    /// ([`float_renaming`]): its outputs of dtype `from` take `to`, the others keep theirs.
    fn rename_outputs(&mut self, n: NodeId, inputs: &[TensorId], from: DType, to: DType) -> GraphResult<()> {
        let limit = self.g.limits.max_tensor_bytes;
        for i in 0..self.g.nodes[n].outputs.len() {
            let o = self.g.nodes[n].outputs[i];
            let x = &mut self.g.tensors[o];
            if x.dtype != from {
                continue;
            }
            let bytes = x.shape.byte_size(to);
            if bytes.is_none_or(|b| b as u64 > limit) {
                return Err(GraphError::LimitExceeded {
                    what: format!("tensor '{}' bytes as {to}", x.name),
                    value: bytes.map_or(u64::MAX, |b| b as u64),
                    limit,
                });
            }
            if let Some(e) = self.was.entry(o) {
                e.or_insert(from);
            }
            x.dtype = to;
        }
        self.rewire(n, inputs)
    }

    /// Node `n` reads `inputs` from now on, and is placed next. The consumer lists are not touched: nothing
    /// reads them during an edit, and `finish` rebuilds them all in the new order.
    fn rewire(&mut self, n: NodeId, inputs: &[TensorId]) -> GraphResult<()> {
        let own = &mut self.g.nodes[n].inputs;
        if own != inputs {
            // In the node's own list (no allocation unless it grows).
            own.clear();
            own.extend_from_slice(inputs);
        }
        self.order.push(n);
        Ok(())
    }

    /// Add a new node, placed next, as [`ComputeGraph::add_node_named`] (inputs must be available).
    pub fn add_node(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[TensorId],
        output_names: &[&str],
    ) -> GraphResult<Vec<TensorId>> {
        self.check_inputs(name, inputs)?;
        let outs = self.g.add_node_named(name, op, inputs, output_names)?;
        if let Some(n) = outs.first().and_then(|&o| self.g.producer(o)) {
            self.order.push(n);
        }
        Ok(outs)
    }

    /// Rename tensor `t` to the unused name `name`.
    pub fn rename_tensor(&mut self, t: TensorId, name: &str) -> GraphResult<()> {
        if !self.g.tensors.contains_key(t) {
            return Err(GraphError::ForeignTensor { id: format!("{t:?}"), graph: self.g.name.clone() });
        }
        self.g.check_new_tensor_name(name)?;
        let name: Arc<str> = Arc::from(name);
        let old = std::mem::replace(&mut self.g.tensors[t].name, Arc::clone(&name));
        self.g.tensor_by_name.remove(&old);
        self.g.tensor_by_name.insert(name, t);
        Ok(())
    }

    /// Make `new` (written by a node) the graph output in `old`'s place; `old` becomes an intermediate.
    pub fn replace_output(&mut self, old: TensorId, new: TensorId) -> GraphResult<()> {
        let Some(i) = self.g.outputs.iter().position(|&o| o == old) else {
            let name = self.g.get_tensor(old).map_or_else(|| format!("{old:?}"), |x| x.name.to_string());
            return Err(edit_error(format!("replace_output: '{name}' is no graph output")));
        };
        match self.g.tensors.get(new) {
            Some(x) if x.role == TensorRole::Intermediate => {}
            Some(x) => return Err(GraphError::OutputNotProduced { tensor: x.name.to_string() }),
            None => return Err(GraphError::ForeignTensor { id: format!("{new:?}"), graph: self.g.name.clone() }),
        }
        self.g.outputs[i] = new;
        self.g.tensors[old].role = TensorRole::Intermediate;
        self.g.tensors[new].role = TensorRole::Output;
        Ok(())
    }

    /// End the edit: every original node must have been placed. The nodes are stored in the placed order (new
    /// ids), and producers, consumer lists and the name map follow.
    pub fn finish(self) -> GraphResult<ComputeGraph> {
        let GraphEdit { mut g, order, pending, .. } = self;
        if let Some((n, _)) = pending.iter().next() {
            let left = pending.len();
            return Err(edit_error(format!("node '{}' (and {} more) was never placed", g.nodes[n].name, left - 1)));
        }
        let mut old = std::mem::replace(&mut g.nodes, SlotMap::with_capacity_and_key(order.len()));
        let mut new_id: SecondaryMap<NodeId, NodeId> = SecondaryMap::with_capacity(order.len());
        for n in order {
            let node = old.remove(n).ok_or_else(|| edit_error(format!("node id {n:?} placed twice")))?;
            new_id.insert(n, g.nodes.insert(node));
        }
        for (_, list) in g.consumers.iter_mut() {
            list.clear();
        }
        for (n, node) in &g.nodes {
            for &t in &node.inputs {
                if let Some(e) = g.consumers.entry(t) {
                    e.or_default().push(n);
                }
            }
        }
        for (_, x) in g.tensors.iter_mut() {
            if let Some(p) = x.producer {
                x.producer = Some(new_id[p]);
            }
        }
        for id in g.node_by_name.values_mut() {
            *id = new_id[*id];
        }
        Ok(g)
    }
}

/// `Some((from, to))` when `node`'s new operands `inputs` have its old operands' shapes and dtypes except that
/// every operand of float dtype `from` now has float dtype `to`, a dtype no old operand had: a consistent renaming
/// of one float type. Inference treats the float dtypes alike (it asks only `is_float`, equality and bool), so
/// such a node's outputs are its old ones with `from` renamed to `to` (checked on every case of infer's tests),
/// which saves re-inferring it: the precision transform retypes most nodes this way. Not for `Cast` and custom
/// ops, whose output dtypes are attributes.
fn float_renaming(
    node: &Node,
    inputs: &[TensorId],
    tensors: &SlotMap<TensorId, Tensor>,
    dtype_was: impl Fn(TensorId) -> DType,
) -> Option<(DType, DType)> {
    if matches!(node.op, Op::Cast { .. } | Op::Custom(_)) || node.inputs.len() != inputs.len() {
        return None;
    }
    let mut map: Option<(DType, DType)> = None;
    for (&old, &new) in node.inputs.iter().zip(inputs) {
        let (a, b) = (&tensors[old], &tensors[new]);
        if b.shape != a.shape {
            return None;
        }
        let (was, now) = (dtype_was(old), b.dtype);
        if was == now {
            continue;
        }
        match map {
            None if was.is_float() && now.is_float() => map = Some((was, now)),
            Some(m) if m == (was, now) => {}
            _ => return None,
        }
    }
    let (from, to) = map?;
    // Uniform: no operand kept `from`, and none had `to` before (the renaming must be one-to-one).
    let uniform = node.inputs.iter().zip(inputs).all(|(&old, &new)| {
        let was = dtype_was(old);
        was != to && (was != from || tensors[new].dtype == to)
    });
    uniform.then_some((from, to))
}
