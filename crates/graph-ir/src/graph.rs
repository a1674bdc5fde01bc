//! `ComputeGraph`: tensors and nodes in slotmaps, with a builder that infers shapes as nodes are added.
//!
//! Invariants kept by construction: names are unique (tensors and nodes each), every node's inputs exist before
//! it is added (so the graph is acyclic and nodes iterate in a topological order), each tensor has at most one
//! producer, and every tensor's shape and dtype agree with its producer's inference.

use serde::{Deserialize, Serialize};
use slotmap::{new_key_type, SecondaryMap, SlotMap};
use std::collections::HashMap;
use std::sync::Arc;

use crate::cost::{op_cost_of, OpCost, Operands};
use crate::error::{GraphError, GraphResult};
use crate::infer::{infer_stored, InferError};
use crate::op::{Op, OpCategory};
use crate::shape::MAX_RANK;
use crate::{DType, Shape, TensorSpec};

mod edit;
pub use edit::GraphEdit;

new_key_type! {
    /// Key of a tensor in its graph.
    pub struct TensorId;
    /// Key of a node in its graph.
    pub struct NodeId;
}

/// What a tensor is to the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorRole {
    /// Supplied by the caller at every run.
    Input,
    /// A model parameter: supplied once when a plan is prepared (or filled with seeded values).
    Weight,
    /// A small value known at compile time, carried in the graph (Reshape targets, scalars).
    Constant,
    /// Produced and consumed inside the graph; lives in the activation pool.
    Intermediate,
    /// Produced by a node and returned to the caller.
    Output,
}

impl TensorRole {
    /// Lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            TensorRole::Input => "input",
            TensorRole::Weight => "weight",
            TensorRole::Constant => "constant",
            TensorRole::Intermediate => "intermediate",
            TensorRole::Output => "output",
        }
    }

    /// True for tensors that no node produces (inputs, weights, constants).
    pub fn is_source(self) -> bool {
        matches!(self, TensorRole::Input | TensorRole::Weight | TensorRole::Constant)
    }
}

/// A tensor: name, element type, static shape and role. Constants also carry their bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Unique name (shared: a plan's values and parameters name the tensor without copying the text).
    pub name: Arc<str>,
    /// Element type.
    pub dtype: DType,
    /// Static shape.
    pub shape: Shape,
    /// Role in the graph.
    pub role: TensorRole,
    /// The node that writes it (`None` for inputs, weights and constants).
    pub producer: Option<NodeId>,
    /// Little-endian element bytes of a constant (`None` for every other role).
    pub data: Option<Arc<[u8]>>,
    /// The shape's element count, taken once at creation (a shape never changes after): every pass sizes
    /// tensors, and the count then needs no walk of the shape's extents, which live apart from the tensor.
    numel: usize,
}

impl Tensor {
    /// Size in bytes (validated not to overflow when the tensor was created).
    pub fn size_bytes(&self) -> usize {
        self.numel.saturating_mul(self.dtype.size_bytes())
    }

    /// Number of elements (validated not to overflow when the tensor was created): `shape.numel()`, kept.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Dtype and shape together.
    pub fn spec(&self) -> TensorSpec {
        TensorSpec { dtype: self.dtype, shape: self.shape.clone() }
    }
}

/// A node: one op applied to input tensors, producing output tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Unique name (shared with the plan's instructions and nodes, as the tensors' names are).
    pub name: Arc<str>,
    /// The op and its attributes.
    pub op: Op,
    /// Inputs, in the op's order.
    pub inputs: Vec<TensorId>,
    /// Outputs, in the op's order.
    pub outputs: Vec<TensorId>,
    /// The store dtype of a mixed-precision node (`None` for an ordinary node; ONNX imports never set it, a
    /// cuplan JSON graph may, with its `store` field): the node reads each float operand in whatever float dtype it is stored (widened
    /// exactly to f32), computes in f32 and stores its float outputs in this dtype. It stands for the casts that
    /// would otherwise sit around it; only ops that [`Op::stores_mixed`] have one.
    pub store: Option<DType>,
}

/// Size limits checked at construction, so hostile inputs fail with an error rather than exhausting memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Maximum number of nodes.
    pub max_nodes: usize,
    /// Maximum number of tensors.
    pub max_tensors: usize,
    /// Maximum bytes of one tensor.
    pub max_tensor_bytes: u64,
    /// Maximum bytes of one constant's inline data.
    pub max_constant_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_nodes: 16 << 20, max_tensors: 32 << 20, max_tensor_bytes: 1 << 44, max_constant_bytes: 16 << 20 }
    }
}

/// A compute graph: a DAG of ops over tensors.
#[derive(Clone, Debug)]
pub struct ComputeGraph {
    name: String,
    tensors: SlotMap<TensorId, Tensor>,
    nodes: SlotMap<NodeId, Node>,
    inputs: Vec<TensorId>,
    weights: Vec<TensorId>,
    outputs: Vec<TensorId>,
    consumers: SecondaryMap<TensorId, Vec<NodeId>>,
    tensor_by_name: HashMap<Arc<str>, TensorId>,
    node_by_name: HashMap<Arc<str>, NodeId>,
    limits: Limits,
}

impl Default for ComputeGraph {
    fn default() -> Self {
        ComputeGraph::new("graph")
    }
}

impl ComputeGraph {
    /// An empty graph with default limits.
    pub fn new(name: impl Into<String>) -> Self {
        Self::with_limits(name, Limits::default())
    }

    /// An empty graph with the given limits.
    pub fn with_limits(name: impl Into<String>, limits: Limits) -> Self {
        ComputeGraph {
            name: name.into(),
            tensors: SlotMap::with_key(),
            nodes: SlotMap::with_key(),
            inputs: Vec::new(),
            weights: Vec::new(),
            outputs: Vec::new(),
            consumers: SecondaryMap::new(),
            tensor_by_name: HashMap::new(),
            node_by_name: HashMap::new(),
            limits,
        }
    }

    /// Room for `nodes` more nodes and `tensors` more tensors, so that a builder that knows its size up front
    /// (an importer, a rewrite of another graph) does not regrow and rehash the name maps as it goes.
    pub fn reserve(&mut self, nodes: usize, tensors: usize) {
        let nodes = nodes.min(self.limits.max_nodes.saturating_sub(self.nodes.len()));
        let tensors = tensors.min(self.limits.max_tensors.saturating_sub(self.tensors.len()));
        self.nodes.reserve(nodes);
        self.node_by_name.reserve(nodes);
        self.tensors.reserve(tensors);
        self.tensor_by_name.reserve(tensors);
    }

    /// [`ComputeGraph::reserve`] plus headroom for the nodes and tensors a later in-place rewrite splices in
    /// (a quarter more, as [`GraphEdit`] does for a precision transform's casts): importers call this, so that the
    /// rewrite does not grow and rehash the name maps it has just filled.
    pub fn reserve_with_headroom(&mut self, nodes: usize, tensors: usize) {
        let extra = nodes / 4 + 16;
        self.reserve(nodes.saturating_add(extra), tensors.saturating_add(extra));
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limits this graph enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    // ------------------------------------------------------------------ building

    /// Add a graph input.
    pub fn add_input(&mut self, name: &str, dtype: DType, shape: impl Into<Shape>) -> GraphResult<TensorId> {
        let id = self.new_tensor(name, dtype, shape.into(), TensorRole::Input, None)?;
        self.inputs.push(id);
        Ok(id)
    }

    /// Add a weight (a parameter whose values are supplied when a plan is prepared).
    pub fn add_weight(&mut self, name: &str, dtype: DType, shape: impl Into<Shape>) -> GraphResult<TensorId> {
        let id = self.new_tensor(name, dtype, shape.into(), TensorRole::Weight, None)?;
        self.weights.push(id);
        Ok(id)
    }

    /// Add a constant with its little-endian element bytes.
    pub fn add_constant(
        &mut self,
        name: &str,
        dtype: DType,
        shape: impl Into<Shape>,
        data: Vec<u8>,
    ) -> GraphResult<TensorId> {
        let shape = shape.into();
        if data.len() > self.limits.max_constant_bytes {
            return Err(GraphError::LimitExceeded {
                what: format!("constant '{name}' data bytes"),
                value: data.len() as u64,
                limit: self.limits.max_constant_bytes as u64,
            });
        }
        let expected = shape.byte_size(dtype);
        if expected != Some(data.len()) {
            return Err(GraphError::ConstantData {
                tensor: name.to_string(),
                detail: format!(
                    "{} data bytes for shape {shape} of {dtype}, which needs {}",
                    data.len(),
                    expected.map_or("more than usize".to_string(), |e| e.to_string())
                ),
            });
        }
        if dtype == DType::Bool && data.iter().any(|&b| b > 1) {
            return Err(GraphError::ConstantData {
                tensor: name.to_string(),
                detail: "bool data must be 0 or 1".into(),
            });
        }
        let id = self.new_tensor(name, dtype, shape, TensorRole::Constant, Some(data.into()))?;
        self.weights.push(id);
        Ok(id)
    }

    /// Add a constant from f32 values (a convenience for scalars and small vectors).
    pub fn add_constant_f32(&mut self, name: &str, shape: impl Into<Shape>, values: &[f32]) -> GraphResult<TensorId> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_constant(name, DType::F32, shape, bytes)
    }

    /// Add a node applying `op` to `inputs`; outputs are inferred and named after the node (`name` for one
    /// output, `name:i` for several).
    pub fn add_node(&mut self, name: &str, op: Op, inputs: &[TensorId]) -> GraphResult<Vec<TensorId>> {
        let n = op.num_outputs();
        let names: Vec<String> =
            if n == 1 { vec![name.to_string()] } else { (0..n).map(|i| format!("{name}:{i}")).collect() };
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        self.add_node_named(name, op, inputs, &refs)
    }

    /// Add a node with explicitly named outputs.
    pub fn add_node_named(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[TensorId],
        output_names: &[&str],
    ) -> GraphResult<Vec<TensorId>> {
        self.add_node_stored(name, op, inputs, output_names, None)
    }

    /// Add a node with explicitly named outputs and a store dtype ([`Node::store`]; `None`: an ordinary node).
    pub fn add_node_stored(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[TensorId],
        output_names: &[&str],
        store: Option<DType>,
    ) -> GraphResult<Vec<TensorId>> {
        if name.is_empty() {
            return Err(GraphError::InvalidName { what: "node", name: name.to_string() });
        }
        if self.node_by_name.contains_key(name) {
            return Err(GraphError::DuplicateNode { name: name.to_string() });
        }
        if self.nodes.len() >= self.limits.max_nodes {
            return Err(GraphError::LimitExceeded {
                what: "node count".into(),
                value: self.nodes.len() as u64 + 1,
                limit: self.limits.max_nodes as u64,
            });
        }
        for &t in inputs {
            if !self.tensors.contains_key(t) {
                return Err(GraphError::ForeignTensor { id: format!("{t:?}"), graph: self.name.clone() });
            }
        }
        if !op.arity().accepts(inputs.len()) {
            return Err(GraphError::Arity {
                node: name.to_string(),
                op: op.name(),
                expected: op.arity().to_string(),
                got: inputs.len(),
            });
        }
        let specs = {
            let ins: Vec<(DType, &Shape)> =
                inputs.iter().map(|&t| (self.tensors[t].dtype, &self.tensors[t].shape)).collect();
            infer_stored(&op, store, &ins).map_err(|e| infer_error(name, &op, ins.len(), e))?
        };
        if specs.len() != output_names.len() {
            return Err(GraphError::OutputCount {
                node: name.to_string(),
                op: op.name(),
                expected: specs.len(),
                got: output_names.len(),
            });
        }
        for (i, o) in output_names.iter().enumerate() {
            if output_names[..i].contains(o) {
                return Err(GraphError::DuplicateTensor { name: o.to_string() });
            }
            self.check_new_tensor_name(o)?;
        }
        let node_name: Arc<str> = Arc::from(name);
        let node_id = self.nodes.insert(Node {
            name: Arc::clone(&node_name),
            op,
            inputs: inputs.to_vec(),
            outputs: Vec::new(),
            store,
        });
        let mut outs = Vec::with_capacity(specs.len());
        for (spec, oname) in specs.into_iter().zip(output_names) {
            // Names were checked above (unique among the outputs and new to the graph).
            match self.new_tensor_checked_name(oname, spec.dtype, spec.shape, TensorRole::Intermediate, None) {
                Ok(t) => {
                    self.tensors[t].producer = Some(node_id);
                    outs.push(t);
                }
                Err(e) => {
                    // Roll back so a failed call leaves the graph as it was.
                    for t in outs {
                        let removed = self.tensors.remove(t);
                        if let Some(r) = removed {
                            self.tensor_by_name.remove(&r.name);
                        }
                    }
                    self.nodes.remove(node_id);
                    return Err(e);
                }
            }
        }
        for &t in inputs {
            if let Some(list) = self.consumers.get_mut(t) {
                list.push(node_id);
            } else {
                self.consumers.insert(t, vec![node_id]);
            }
        }
        self.nodes[node_id].outputs = outs.clone();
        self.node_by_name.insert(node_name, node_id);
        Ok(outs)
    }

    /// Mark a node-produced tensor as a graph output.
    pub fn mark_output(&mut self, t: TensorId) -> GraphResult<()> {
        let Some(tensor) = self.tensors.get_mut(t) else {
            return Err(GraphError::ForeignTensor { id: format!("{t:?}"), graph: self.name.clone() });
        };
        match tensor.role {
            TensorRole::Output => Err(GraphError::DuplicateOutput { tensor: tensor.name.to_string() }),
            TensorRole::Intermediate => {
                tensor.role = TensorRole::Output;
                self.outputs.push(t);
                Ok(())
            }
            _ => Err(GraphError::OutputNotProduced { tensor: tensor.name.to_string() }),
        }
    }

    fn check_new_tensor_name(&self, name: &str) -> GraphResult<()> {
        if name.is_empty() {
            return Err(GraphError::InvalidName { what: "tensor", name: name.to_string() });
        }
        if self.tensor_by_name.contains_key(name) {
            return Err(GraphError::DuplicateTensor { name: name.to_string() });
        }
        Ok(())
    }

    fn new_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: Shape,
        role: TensorRole,
        data: Option<Arc<[u8]>>,
    ) -> GraphResult<TensorId> {
        self.check_new_tensor_name(name)?;
        self.new_tensor_checked_name(name, dtype, shape, role, data)
    }

    /// `new_tensor` for a name already checked by `check_new_tensor_name`.
    fn new_tensor_checked_name(
        &mut self,
        name: &str,
        dtype: DType,
        shape: Shape,
        role: TensorRole,
        data: Option<Arc<[u8]>>,
    ) -> GraphResult<TensorId> {
        if shape.rank() > MAX_RANK {
            return Err(GraphError::RankTooLarge { tensor: name.to_string(), rank: shape.rank(), limit: MAX_RANK });
        }
        // Extents are i64 in the JSON format and in ONNX: a larger one (possible when another extent is 0,
        // so that the size does not overflow) would be written back as a negative number.
        if let Some((axis, &d)) = shape.0.iter().enumerate().find(|(_, &d)| i64::try_from(d).is_err()) {
            return Err(GraphError::LimitExceeded {
                what: format!("tensor '{name}' extent on axis {axis}"),
                value: d as u64,
                limit: i64::MAX as u64,
            });
        }
        let bytes = shape.byte_size(dtype);
        match bytes {
            Some(b) if (b as u64) <= self.limits.max_tensor_bytes => {}
            Some(b) => {
                return Err(GraphError::LimitExceeded {
                    what: format!("tensor '{name}' bytes"),
                    value: b as u64,
                    limit: self.limits.max_tensor_bytes,
                })
            }
            None => {
                return Err(GraphError::SizeOverflow {
                    tensor: name.to_string(),
                    shape: shape.to_string(),
                    dtype: dtype.to_string(),
                })
            }
        }
        if self.tensors.len() >= self.limits.max_tensors {
            return Err(GraphError::LimitExceeded {
                what: "tensor count".into(),
                value: self.tensors.len() as u64 + 1,
                limit: self.limits.max_tensors as u64,
            });
        }
        let name: Arc<str> = Arc::from(name);
        // `byte_size` above checked the count too.
        let numel = shape.numel().unwrap_or(usize::MAX);
        let id =
            self.tensors.insert(Tensor { name: Arc::clone(&name), dtype, shape, role, producer: None, data, numel });
        self.tensor_by_name.insert(name, id);
        Ok(id)
    }

    // ------------------------------------------------------------------ queries

    /// A tensor by id. Panics on a foreign id (ids come from this graph).
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id]
    }

    /// A tensor by id, `None` if foreign.
    pub fn get_tensor(&self, id: TensorId) -> Option<&Tensor> {
        self.tensors.get(id)
    }

    /// A node by id. Panics on a foreign id (ids come from this graph).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }

    /// A node by id, `None` if foreign.
    pub fn get_node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id)
    }

    /// All tensors, in creation order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = (TensorId, &Tensor)> + '_ {
        self.tensors.iter()
    }

    /// All nodes, in creation order (a topological order, since inputs precede their consumers).
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = (NodeId, &Node)> + '_ {
        self.nodes.iter()
    }

    /// Node ids in creation order.
    pub fn node_ids(&self) -> impl ExactSizeIterator<Item = NodeId> + '_ {
        self.nodes.keys()
    }

    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Number of tensors.
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Graph inputs in order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }

    /// Weights and constants in creation order.
    pub fn weights(&self) -> &[TensorId] {
        &self.weights
    }

    /// Graph outputs in order.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// The node producing `t`, if any.
    pub fn producer(&self, t: TensorId) -> Option<NodeId> {
        self.tensors.get(t).and_then(|x| x.producer)
    }

    /// Nodes reading `t`, in creation order (a node reading `t` twice appears twice).
    pub fn consumers(&self, t: TensorId) -> &[NodeId] {
        self.consumers.get(t).map_or(&[], Vec::as_slice)
    }

    /// A tensor id by name.
    pub fn tensor_id(&self, name: &str) -> Option<TensorId> {
        self.tensor_by_name.get(name).copied()
    }

    /// A node id by name.
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_by_name.get(name).copied()
    }

    /// The cost of one node from its shapes and dtypes (read in place: no shape is copied).
    pub fn node_cost(&self, id: NodeId) -> OpCost {
        let n = &self.nodes[id];
        op_cost_of(
            &n.op,
            &GraphOperands { tensors: &self.tensors, ids: &n.inputs },
            &GraphOperands { tensors: &self.tensors, ids: &n.outputs },
        )
    }

    /// Number of nodes per category.
    pub fn category_counts(&self) -> Vec<(OpCategory, usize)> {
        let mut counts: Vec<(OpCategory, usize)> = Vec::new();
        for (_, n) in self.nodes.iter() {
            let c = n.op.category();
            match counts.iter_mut().find(|(k, _)| *k == c) {
                Some((_, v)) => *v += 1,
                None => counts.push((c, 1)),
            }
        }
        counts
    }

    /// Whole-graph checks that the builder cannot make on each call: the graph has nodes and outputs.
    pub fn validate(&self) -> GraphResult<()> {
        if self.nodes.is_empty() {
            return Err(GraphError::EmptyGraph { graph: self.name.clone() });
        }
        if self.outputs.is_empty() {
            return Err(GraphError::NoOutputs { graph: self.name.clone() });
        }
        Ok(())
    }
}

/// A node's inputs or outputs as `op_cost_of` reads them, borrowed from the graph.
struct GraphOperands<'a> {
    tensors: &'a SlotMap<TensorId, Tensor>,
    ids: &'a [TensorId],
}

impl Operands for GraphOperands<'_> {
    fn count(&self) -> usize {
        self.ids.len()
    }
    fn operand(&self, i: usize) -> (DType, &Shape) {
        let t = &self.tensors[self.ids[i]];
        (t.dtype, &t.shape)
    }
}

/// Attach the node's name to an inference error.
pub(crate) fn infer_error(node: &str, op: &Op, got: usize, e: InferError) -> GraphError {
    let node = node.to_string();
    let opn = op.name();
    match e {
        InferError::Arity(expected) => GraphError::Arity { node, op: opn, expected, got },
        InferError::Shape(detail) => GraphError::ShapeMismatch { node, op: opn, detail },
        InferError::DType(detail) => GraphError::DTypeMismatch { node, op: opn, detail },
        InferError::Attr(attr, detail) => GraphError::InvalidAttribute { node, op: opn, attr, detail },
    }
}
