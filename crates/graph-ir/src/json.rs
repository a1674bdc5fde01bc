//! The JSON graph format (`"format": "cuplan-graph", "version": 1` or `2`), documented in `docs/graph-format.md`.
//!
//! Version 2 adds named symbolic extents to input and weight declarations (`"shape": ["batch", 128]`), bound
//! to values at load ([`from_json_with_dims`]), as `--dim` binds an ONNX model's symbolic dims. Writing always
//! produces version 1: a loaded graph has only concrete extents.
//!
//! Loading parses with serde (reporting the JSON path, line and column of a malformed value), then assembles the
//! graph: nodes may appear in any order; they are added in a stable topological order (file order among ready
//! nodes), so a file already in topological order round-trips exactly. Cycles, dangling and doubly produced
//! tensors are reported by name.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::error::{GraphError, GraphResult};
use crate::graph::{ComputeGraph, Limits, TensorRole};
use crate::op::Op;
use crate::{DType, Shape};

/// The format name written in every document.
pub const FORMAT: &str = "cuplan-graph";
/// The format version this build writes (a loaded graph's extents are all concrete), and the oldest it reads.
pub const VERSION: u64 = 1;
/// The newest format version this build reads: version 1 plus named symbolic extents in tensor declarations.
pub const SYMBOLIC_VERSION: u64 = 2;

/// One extent of a declared shape: a number, or (version 2) the name of a symbol bound when the file is loaded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Extent {
    /// A fixed extent (negative values are rejected at load with the tensor's name).
    Fixed(i64),
    /// A named symbolic extent (`"batch"`), bound by [`from_json_with_dims`].
    Symbol(String),
}

impl From<i64> for Extent {
    fn from(v: i64) -> Self {
        Extent::Fixed(v)
    }
}

impl From<&str> for Extent {
    fn from(s: &str) -> Self {
        Extent::Symbol(s.to_string())
    }
}

impl Serialize for Extent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Extent::Fixed(v) => s.serialize_i64(*v),
            Extent::Symbol(name) => s.serialize_str(name),
        }
    }
}

impl<'de> Deserialize<'de> for Extent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Extent;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an extent: an integer or the name of a symbol")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Extent, E> {
                Ok(Extent::Fixed(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Extent, E> {
                i64::try_from(v).map(Extent::Fixed).map_err(|_| E::custom(format!("extent {v} is too large")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Extent, E> {
                if v.is_empty() {
                    return Err(E::custom("a symbol name must be non-empty"));
                }
                Ok(Extent::Symbol(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A tensor declaration (inputs and weights).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorDecl {
    /// Unique tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Extents: integers (negative values are rejected with the tensor's name) or, from version 2, symbol
    /// names bound at load.
    pub shape: Vec<Extent>,
}

/// A constant with its values (numbers for numeric dtypes, booleans for bool).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConstantDecl {
    /// Unique tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: Vec<i64>,
    /// Values in row-major order.
    pub data: Vec<serde_json::Value>,
}

/// A node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDecl {
    /// Unique node name.
    pub name: String,
    /// The op: a bare name (`"Relu"`) or an object with its attributes (`{"Softmax": {"axis": -1}}`).
    pub op: Op,
    /// Input tensor names in the op's order.
    pub inputs: Vec<String>,
    /// Output tensor names; when absent, outputs are named after the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Vec<String>>,
    /// The store dtype of a mixed-precision node ([`crate::Node::store`]); absent for ordinary nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<DType>,
}

/// A whole graph document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphDoc {
    /// Always `"cuplan-graph"`.
    pub format: String,
    /// Format version (1, or 2 when a declaration uses a symbolic extent).
    pub version: u64,
    /// Graph name.
    pub name: String,
    /// Graph inputs, in order.
    #[serde(default)]
    pub inputs: Vec<TensorDecl>,
    /// Weights.
    #[serde(default)]
    pub weights: Vec<TensorDecl>,
    /// Constants with inline values.
    #[serde(default)]
    pub constants: Vec<ConstantDecl>,
    /// Nodes (any order; cycles are errors).
    pub nodes: Vec<NodeDecl>,
    /// Names of the graph outputs, in order.
    pub outputs: Vec<String>,
}

#[derive(Deserialize)]
struct Header {
    format: Option<serde_json::Value>,
    version: Option<serde_json::Value>,
}

fn json_error(path: String, e: &serde_json::Error) -> GraphError {
    let path = if path.is_empty() || path == "." { ".".to_string() } else { path };
    // serde_json appends " at line L column C" to its messages; the fields carry them already.
    let msg = e.to_string();
    let message = match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    GraphError::Json { path, line: e.line(), column: e.column(), message }
}

/// Parse a graph from JSON text with default limits.
pub fn from_json(text: &str) -> GraphResult<ComputeGraph> {
    from_json_with_limits(text, Limits::default())
}

/// Parse a graph from JSON text, enforcing `limits`. A symbolic extent is an error naming it (see
/// [`from_json_with_dims`]).
pub fn from_json_with_limits(text: &str, limits: Limits) -> GraphResult<ComputeGraph> {
    from_json_with_dims(text, limits, &HashMap::new())
}

/// Parse a graph from JSON text, enforcing `limits`, with the symbolic extents of version-2 declarations bound
/// by `dims` (`--dim NAME=VALUE`). A symbol without a binding, and a binding that names no symbol of the file,
/// are errors naming them.
pub fn from_json_with_dims(text: &str, limits: Limits, dims: &HashMap<String, usize>) -> GraphResult<ComputeGraph> {
    // The header first, so that a file of another kind is named as such rather than by its first odd field.
    let header: Header = serde_json::from_str(text).map_err(|e| json_error(".".into(), &e))?;
    match &header.format {
        Some(serde_json::Value::String(s)) if s == FORMAT => {}
        Some(v) => return Err(GraphError::WrongFormat { found: v.to_string() }),
        None => return Err(GraphError::WrongFormat { found: "missing".into() }),
    }
    match header.version.as_ref().and_then(serde_json::Value::as_u64) {
        Some(VERSION..=SYMBOLIC_VERSION) => {}
        Some(v) => return Err(GraphError::UnsupportedVersion { found: v, supported: SYMBOLIC_VERSION }),
        None => {
            return Err(GraphError::Json {
                path: "version".into(),
                line: 0,
                column: 0,
                message: format!("expected an unsigned integer, found {:?}", header.version),
            })
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let doc: GraphDoc = match serde_path_to_error::deserialize(&mut de) {
        Ok(d) => d,
        Err(e) => {
            let path = e.path().to_string();
            return Err(json_error(path, e.inner()));
        }
    };
    doc.into_graph_with_dims(limits, dims)
}

fn to_shape(name: &str, dims: &[i64]) -> GraphResult<Shape> {
    let mut out = Vec::with_capacity(dims.len());
    if dims.len() > crate::shape::MAX_RANK {
        return Err(GraphError::RankTooLarge { tensor: name.into(), rank: dims.len(), limit: crate::shape::MAX_RANK });
    }
    for (axis, &d) in dims.iter().enumerate() {
        if d < 0 {
            return Err(GraphError::InvalidDim { tensor: name.into(), axis, value: d });
        }
        out.push(usize::try_from(d).map_err(|_| GraphError::InvalidDim { tensor: name.into(), axis, value: d })?);
    }
    Ok(Shape::from(out))
}

/// Resolves one declaration's extents: symbols through `dims`, refused in version-1 documents.
fn bind(t: &TensorDecl, version: u64, dims: &HashMap<String, usize>) -> GraphResult<Vec<i64>> {
    let mut out = Vec::with_capacity(t.shape.len());
    for (axis, e) in t.shape.iter().enumerate() {
        out.push(match e {
            Extent::Fixed(v) => *v,
            Extent::Symbol(s) if version < SYMBOLIC_VERSION => {
                return Err(GraphError::Json {
                    path: format!("shape of '{}', axis {axis}", t.name),
                    line: 0,
                    column: 0,
                    message: format!(
                        "the symbolic extent {s:?} needs \"version\": {SYMBOLIC_VERSION} (this document is version {version})"
                    ),
                })
            }
            Extent::Symbol(s) => {
                let v = dims.get(s).ok_or_else(|| GraphError::UnboundSymbol {
                    tensor: t.name.clone(),
                    axis,
                    symbol: s.clone(),
                })?;
                i64::try_from(*v).map_err(|_| GraphError::InvalidDim { tensor: t.name.clone(), axis, value: i64::MAX })?
            }
        });
    }
    Ok(out)
}

impl GraphDoc {
    /// The symbol names the declarations use, sorted.
    pub fn symbols(&self) -> BTreeSet<&str> {
        self.inputs
            .iter()
            .chain(&self.weights)
            .flat_map(|t| &t.shape)
            .filter_map(|e| match e {
                Extent::Symbol(s) => Some(s.as_str()),
                Extent::Fixed(_) => None,
            })
            .collect()
    }

    /// Assemble the graph: declare sources, order the nodes topologically, infer shapes, mark outputs. A
    /// symbolic extent is an error naming it (see [`GraphDoc::into_graph_with_dims`]).
    pub fn into_graph(self, limits: Limits) -> GraphResult<ComputeGraph> {
        self.into_graph_with_dims(limits, &HashMap::new())
    }

    /// [`GraphDoc::into_graph`] with the symbolic extents bound by `dims`; every binding must name a symbol
    /// the declarations use.
    pub fn into_graph_with_dims(self, limits: Limits, dims: &HashMap<String, usize>) -> GraphResult<ComputeGraph> {
        let symbols = self.symbols();
        let mut unused: Vec<&String> = dims.keys().filter(|k| !symbols.contains(k.as_str())).collect();
        unused.sort();
        if let Some(first) = unused.first() {
            let known = if symbols.is_empty() {
                "none".to_string()
            } else {
                symbols.iter().copied().collect::<Vec<_>>().join(", ")
            };
            return Err(GraphError::UnusedSymbolBinding { symbol: (*first).clone(), known });
        }
        let mut g = ComputeGraph::with_limits(self.name.clone(), limits);
        if self.nodes.len() > limits.max_nodes {
            return Err(GraphError::LimitExceeded {
                what: "node count".into(),
                value: self.nodes.len() as u64,
                limit: limits.max_nodes as u64,
            });
        }
        g.reserve_with_headroom(self.nodes.len(), self.nodes.len() + self.inputs.len() + self.weights.len());
        for t in &self.inputs {
            g.add_input(&t.name, t.dtype, to_shape(&t.name, &bind(t, self.version, dims)?)?)?;
        }
        for t in &self.weights {
            g.add_weight(&t.name, t.dtype, to_shape(&t.name, &bind(t, self.version, dims)?)?)?;
        }
        for c in &self.constants {
            let shape = to_shape(&c.name, &c.shape)?;
            let data = encode_values(&c.name, c.dtype, &c.data)?;
            g.add_constant(&c.name, c.dtype, shape, data)?;
        }
        let order = topo_order(&g, &self.nodes)?;
        for i in order {
            let n = &self.nodes[i];
            let mut ins = Vec::with_capacity(n.inputs.len());
            for name in &n.inputs {
                // Present: topo_order checked every input and added producers first.
                let id = g
                    .tensor_id(name)
                    .ok_or_else(|| GraphError::UnknownTensor { node: n.name.clone(), tensor: name.clone() })?;
                ins.push(id);
            }
            let named;
            let outs: &[String] = match &n.outputs {
                Some(o) => o,
                None => {
                    named = output_names(n);
                    &named
                }
            };
            let refs: Vec<&str> = outs.iter().map(String::as_str).collect();
            g.add_node_stored(&n.name, n.op.clone(), &ins, &refs, n.store)?;
        }
        for name in &self.outputs {
            let id = g.tensor_id(name).ok_or_else(|| GraphError::OutputNotProduced { tensor: name.clone() })?;
            g.mark_output(id)?;
        }
        g.validate()?;
        Ok(g)
    }
}

/// The names a node's outputs will have.
fn output_names(n: &NodeDecl) -> Vec<String> {
    match &n.outputs {
        Some(o) => o.clone(),
        None => {
            let k = n.op.num_outputs();
            if k == 1 {
                vec![n.name.clone()]
            } else {
                (0..k).map(|i| format!("{}:{i}", n.name)).collect()
            }
        }
    }
}

/// Kahn's algorithm over node indices with file order as the tie-break; on a cycle, reports one.
fn topo_order(g: &ComputeGraph, nodes: &[NodeDecl]) -> GraphResult<Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
    let outs: Vec<Vec<String>> = nodes.iter().map(output_names).collect();
    let mut seen_nodes: HashMap<&str, ()> = HashMap::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        if seen_nodes.insert(n.name.as_str(), ()).is_some() {
            return Err(GraphError::DuplicateNode { name: n.name.clone() });
        }
        for o in &outs[i] {
            if let Some(id) = g.tensor_id(o) {
                return Err(GraphError::WritesSource {
                    node: n.name.clone(),
                    tensor: o.clone(),
                    role: g.tensor(id).role.name(),
                });
            }
            if let Some(&j) = producer.get(o.as_str()) {
                return Err(GraphError::DoubleProducer {
                    tensor: o.clone(),
                    first: nodes[j].name.clone(),
                    second: n.name.clone(),
                });
            }
            producer.insert(o.as_str(), i);
        }
    }
    // Dependencies: node i waits for the producers of its inputs.
    let mut indeg = vec![0usize; nodes.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for name in &n.inputs {
            match producer.get(name.as_str()) {
                Some(&p) => {
                    indeg[i] += 1;
                    users[p].push(i);
                    deps[i].push(p);
                }
                None => {
                    if g.tensor_id(name).is_none() {
                        return Err(GraphError::UnknownTensor { node: n.name.clone(), tensor: name.clone() });
                    }
                }
            }
        }
    }
    // A min-heap on the index keeps file order among ready nodes.
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
        (0..nodes.len()).filter(|&i| indeg[i] == 0).map(std::cmp::Reverse).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            indeg[u] -= 1;
            if indeg[u] == 0 {
                ready.push(std::cmp::Reverse(u));
            }
        }
    }
    if order.len() == nodes.len() {
        return Ok(order);
    }
    // Every unfinished node has an unfinished dependency: walk those until a node repeats.
    let Some(start) = (0..nodes.len()).find(|&i| indeg[i] > 0) else {
        return Ok(order);
    };
    let mut pos: HashMap<usize, usize> = HashMap::new();
    let mut path = Vec::new();
    let mut cur = start;
    loop {
        if let Some(&p) = pos.get(&cur) {
            let mut cycle: Vec<String> = path[p..].iter().map(|&i: &usize| nodes[i].name.clone()).collect();
            // The walk followed dependencies (consumer -> producer); report in data-flow order.
            cycle.reverse();
            return Err(GraphError::Cycle { nodes: cycle });
        }
        pos.insert(cur, path.len());
        path.push(cur);
        let mut q: VecDeque<usize> = deps[cur].iter().copied().filter(|&d| indeg[d] > 0).collect();
        match q.pop_front() {
            Some(next) => cur = next,
            None => return Err(GraphError::Cycle { nodes: vec![nodes[cur].name.clone()] }),
        }
    }
}

fn encode_values(name: &str, dtype: DType, values: &[serde_json::Value]) -> GraphResult<Vec<u8>> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    let bad = |i: usize, v: &serde_json::Value| GraphError::ConstantData {
        tensor: name.into(),
        detail: format!("data[{i}] = {v} is not a valid {dtype} value"),
    };
    for (i, v) in values.iter().enumerate() {
        match dtype {
            DType::Bool => match v.as_bool() {
                Some(b) => out.push(b as u8),
                None => return Err(bad(i, v)),
            },
            DType::F32 | DType::F16 | DType::BF16 => {
                let x = v.as_f64().ok_or_else(|| bad(i, v))?;
                let f = x as f32;
                // A finite number too large for the dtype would silently become infinity (and then save as
                // null); reject it instead.
                let narrowed = match dtype {
                    DType::F16 => half::f16::from_f32(f).is_finite(),
                    DType::BF16 => half::bf16::from_f32(f).is_finite(),
                    _ => f.is_finite(),
                };
                if !narrowed {
                    return Err(GraphError::ConstantData {
                        tensor: name.into(),
                        detail: format!("data[{i}] = {v} is out of range for {dtype}"),
                    });
                }
                match dtype {
                    DType::F32 => out.extend_from_slice(&f.to_le_bytes()),
                    DType::F16 => out.extend_from_slice(&half::f16::from_f32(f).to_le_bytes()),
                    _ => out.extend_from_slice(&half::bf16::from_f32(f).to_le_bytes()),
                }
            }
            DType::I64 => out.extend_from_slice(&v.as_i64().ok_or_else(|| bad(i, v))?.to_le_bytes()),
            DType::I32 => {
                let x = v.as_i64().and_then(|x| i32::try_from(x).ok()).ok_or_else(|| bad(i, v))?;
                out.extend_from_slice(&x.to_le_bytes());
            }
            DType::I8 => {
                let x = v.as_i64().and_then(|x| i8::try_from(x).ok()).ok_or_else(|| bad(i, v))?;
                out.extend_from_slice(&x.to_le_bytes());
            }
            DType::U8 => {
                let x = v.as_i64().and_then(|x| u8::try_from(x).ok()).ok_or_else(|| bad(i, v))?;
                out.push(x);
            }
        }
    }
    Ok(out)
}

/// Decode little-endian constant bytes to JSON values (the inverse of loading).
pub fn decode_values(dtype: DType, data: &[u8]) -> Vec<serde_json::Value> {
    let w = dtype.size_bytes();
    data.chunks_exact(w)
        .map(|c| match dtype {
            DType::Bool => serde_json::Value::Bool(c[0] != 0),
            DType::F32 => f64_value(f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64),
            DType::F16 => f64_value(half::f16::from_le_bytes([c[0], c[1]]).to_f64()),
            DType::BF16 => f64_value(half::bf16::from_le_bytes([c[0], c[1]]).to_f64()),
            DType::I64 => serde_json::Value::from(i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
            DType::I32 => serde_json::Value::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I8 => serde_json::Value::from(c[0] as i8),
            DType::U8 => serde_json::Value::from(c[0]),
        })
        .collect()
}

fn f64_value(f: f64) -> serde_json::Value {
    // JSON has no NaN or infinity: such constants are written as null and rejected on load.
    serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

fn dims(s: &Shape) -> Vec<i64> {
    // Every extent fits: the graph rejects larger ones when the tensor is created.
    s.0.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect()
}

impl ComputeGraph {
    /// The graph as a document.
    pub fn to_doc(&self) -> GraphDoc {
        let decl = |id| {
            let t = self.tensor(id);
            TensorDecl {
                name: t.name.to_string(),
                dtype: t.dtype,
                shape: dims(&t.shape).into_iter().map(Extent::Fixed).collect(),
            }
        };
        let mut weights = Vec::new();
        let mut constants = Vec::new();
        for &w in self.weights() {
            let t = self.tensor(w);
            match (&t.role, &t.data) {
                (TensorRole::Constant, Some(d)) => constants.push(ConstantDecl {
                    name: t.name.to_string(),
                    dtype: t.dtype,
                    shape: dims(&t.shape),
                    data: decode_values(t.dtype, d),
                }),
                _ => weights.push(decl(w)),
            }
        }
        GraphDoc {
            format: FORMAT.into(),
            version: VERSION,
            name: self.name().to_string(),
            inputs: self.inputs().iter().map(|&i| decl(i)).collect(),
            weights,
            constants,
            nodes: self
                .nodes()
                .map(|(_, n)| NodeDecl {
                    name: n.name.to_string(),
                    op: n.op.clone(),
                    inputs: n.inputs.iter().map(|&t| self.tensor(t).name.to_string()).collect(),
                    outputs: Some(n.outputs.iter().map(|&t| self.tensor(t).name.to_string()).collect()),
                    store: n.store,
                })
                .collect(),
            outputs: self.outputs().iter().map(|&t| self.tensor(t).name.to_string()).collect(),
        }
    }

    /// The graph as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data to a String cannot fail; fall back to an empty object for safety.
        serde_json::to_string_pretty(&self.to_doc()).unwrap_or_else(|_| "{}".into())
    }
}
