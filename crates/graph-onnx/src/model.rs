//! The structural front end: decode the file, check the opset, read types, initializers and graph inputs,
//! and order the nodes (ONNX asks for topological order but files do not always keep it).
//!
//! Nothing here knows about operators; `import` maps the ordered nodes onto graph-ir ops.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::error::OnnxError;
use crate::proto::{tensor_shape_proto::dimension, type_proto, GraphProto, ModelProto, NodeProto, ValueInfoProto};
use crate::tensor::{self, TensorValue};
use crate::ImportOptions;

/// Lowest default-domain opset we import. Opset 13 moved Squeeze/Unsqueeze/Split axes and ReduceSum axes to
/// inputs; supporting older ones would double the attribute handling for little gain.
pub const MIN_OPSET: i64 = 13;
/// Highest default-domain opset we import (ONNX 1.16's opset; 22+ only add types and ops we do not map).
pub const MAX_OPSET: i64 = 21;

/// One dimension as a file declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DeclDim {
    /// A static extent.
    Known(usize),
    /// A named symbolic extent.
    Symbolic(String),
    /// Neither value nor name.
    Unknown,
}

/// A tensor type as a file declares it (graph input, output or value_info).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeclType {
    /// ONNX element type (0 when unset).
    pub(crate) elem_type: i32,
    /// The dims, or `None` when the rank is unknown.
    pub(crate) dims: Option<Vec<DeclDim>>,
}

impl DeclType {
    /// Resolves symbolic dims through `bindings`; a dim that stays unresolved becomes `None`.
    pub(crate) fn resolved(&self, bindings: &HashMap<String, usize>) -> Option<Vec<Option<usize>>> {
        self.dims.as_ref().map(|dims| {
            dims.iter()
                .map(|d| match d {
                    DeclDim::Known(v) => Some(*v),
                    DeclDim::Symbolic(s) => bindings.get(s).copied(),
                    DeclDim::Unknown => None,
                })
                .collect()
        })
    }
}

/// Human-readable dims with symbolic names and `?` for unknown ones, for error messages.
pub(crate) fn show_decl(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.map_or_else(|| "?".to_string(), |v| v.to_string())).collect();
    format!("[{}]", parts.join(", "))
}

/// Reads a `ValueInfoProto`'s tensor type.
pub(crate) fn decl_type(v: &ValueInfoProto) -> Result<DeclType, OnnxError> {
    let bad = |problem: &str| OnnxError::BadType { value: v.name.clone(), problem: problem.to_string() };
    let ty = v.r#type.as_ref().ok_or_else(|| bad("has no type"))?;
    let t = match &ty.value {
        Some(type_proto::Value::TensorType(t)) => t,
        Some(other) => return Err(bad(&format!("has type {}; only tensor types are supported", other.kind()))),
        None => return Err(bad("has an empty type")),
    };
    let dims = match &t.shape {
        None => None,
        Some(s) => Some(
            s.dim
                .iter()
                .map(|d| match &d.value {
                    Some(dimension::Value::DimValue(x)) => {
                        usize::try_from(*x).map(DeclDim::Known).map_err(|_| bad(&format!("has negative dimension {x}")))
                    }
                    Some(dimension::Value::DimParam(p)) if !p.is_empty() => Ok(DeclDim::Symbolic(p.clone())),
                    _ => Ok(DeclDim::Unknown),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(DeclType { elem_type: t.elem_type, dims })
}

/// An initializer: its validated header and its data, if the file carries any.
#[derive(Clone)]
pub(crate) struct Initializer {
    /// The element type (ONNX code).
    pub(crate) dtype: i32,
    /// The dims.
    pub(crate) dims: Vec<usize>,
    /// The data; `None` for a weight whose values are supplied at run time.
    pub(crate) value: Option<TensorValue>,
}

/// A graph input after binding its symbolic dims.
pub(crate) struct Input {
    pub(crate) name: String,
    pub(crate) dtype: i32,
    pub(crate) dims: Vec<usize>,
}

/// The model's structure, checked and ordered.
pub(crate) struct Parsed {
    /// Default-domain opset version.
    pub(crate) opset: i64,
    /// `producer_name` and `producer_version`, space-separated.
    pub(crate) producer: String,
    /// The file's IR version.
    pub(crate) ir_version: i64,
    /// The graph, with nodes in file order (shared by every import of one decode).
    pub(crate) graph: Arc<GraphProto>,
    /// Initializers by name, in file order.
    pub(crate) initializers: Vec<(String, Initializer)>,
    /// Graph inputs that are not initializers, in file order, with static dims.
    pub(crate) inputs: Vec<Input>,
    /// The declared types and the node order (shared by every import of one decode).
    pub(crate) structure: Arc<Structure>,
}

/// What the checks of a model's structure find that no symbolic dim changes: computed once per decode, so
/// that a plan set's members share it instead of each re-checking and re-ordering the graph.
pub(crate) struct Structure {
    /// Declared types of intermediates and outputs, by name.
    pub(crate) declared: HashMap<String, DeclType>,
    /// Node indices in a topological order (file order wherever the file's order is valid).
    pub(crate) order: Vec<usize>,
    /// For each graph input, whether an initializer of the same name makes it a weight (older exporters
    /// list weights as inputs too).
    is_initializer: Vec<bool>,
}

/// Decodes and checks everything but the operators.
pub(crate) fn parse(bytes: &[u8], opts: &ImportOptions) -> Result<Parsed, OnnxError> {
    bind(decode(bytes, opts)?, opts)
}

/// A model decoded once: the protobuf, its default opset, and its initializers (their data shared, not
/// copied, by clones), before any symbolic dim is bound. What [`bind`] turns into a [`Parsed`] model at given
/// dims, as often as a plan set needs.
#[derive(Clone)]
pub(crate) struct Decoded {
    opset: i64,
    producer: String,
    ir_version: i64,
    /// Shared, not copied, by each bind: a plan set imports one decode once per member.
    graph: Arc<GraphProto>,
    initializers: Vec<(String, Initializer)>,
    /// The structure checked at decode; `None` when a check failed, so that [`bind`] reports the first
    /// problem in the order a full check meets it (a dims error of a graph input before a duplicate name).
    structure: Option<Arc<Structure>>,
}

/// Decodes the protobuf and the initializers (the part of parsing that does not depend on `opts.dims`).
pub(crate) fn decode(bytes: &[u8], opts: &ImportOptions) -> Result<Decoded, OnnxError> {
    use prost::Message;
    if bytes.len() as u64 > opts.max_file_bytes {
        return Err(OnnxError::FileTooLarge { bytes: bytes.len() as u64, limit: opts.max_file_bytes });
    }
    let model = ModelProto::decode(bytes)?;
    let opset = default_opset(&model)?;
    let producer = format!("{} {}", model.producer_name, model.producer_version).trim().to_string();
    let ir_version = model.ir_version;
    let mut graph = model.graph.ok_or(OnnxError::NoGraph)?;
    if !graph.sparse_initializer.is_empty() {
        return Err(OnnxError::UnsupportedFeature(format!("{} sparse initializer(s)", graph.sparse_initializer.len())));
    }

    // The initializers move out of the graph so that their data is never copied.
    let mut initializers = Vec::with_capacity(graph.initializer.len());
    for t in std::mem::take(&mut graph.initializer) {
        let name = t.name.clone();
        let (h, data) = tensor::decode_in(&name, t, opts.max_tensor_bytes, opts.external_data_dir.as_deref())?;
        let value = data.map(|d| TensorValue::new(h.dtype, h.dims.clone(), d));
        initializers.push((name, Initializer { dtype: h.dtype, dims: h.dims, value }));
    }
    let structure = check_structure(&graph, &initializers, None).ok().map(|(s, _)| Arc::new(s));
    Ok(Decoded { opset, producer, ir_version, graph: Arc::new(graph), initializers, structure })
}

/// Binds `opts.dims` to the graph inputs; the rest of the structure (declared types, a topological order) was
/// checked once at decode.
pub(crate) fn bind(decoded: Decoded, opts: &ImportOptions) -> Result<Parsed, OnnxError> {
    let Decoded { opset, producer, ir_version, graph, initializers, structure } = decoded;
    let (structure, inputs) = match structure {
        Some(s) => {
            let inputs = bind_inputs(&graph, &s.is_initializer, opts)?;
            (s, inputs)
        }
        // A check failed at decode: run them all again, binding the inputs where a full check does, so the
        // error reported is the first one met.
        None => {
            let (s, inputs) = check_structure(&graph, &initializers, Some(opts))?;
            (Arc::new(s), inputs.unwrap_or_default())
        }
    };
    Ok(Parsed { opset, producer, ir_version, graph, initializers, inputs, structure })
}

/// Checks the structure: no name defined twice (initializers, graph inputs, node outputs), the declared types,
/// a topological order, every graph output defined. With `bind` the graph inputs' dims are bound too, between
/// the initializer and the input checks, so the first problem is reported whether or not dims are given.
fn check_structure(
    graph: &GraphProto,
    initializers: &[(String, Initializer)],
    bind: Option<&ImportOptions>,
) -> Result<(Structure, Option<Vec<Input>>), OnnxError> {
    let mut seen: HashMap<&str, String> = HashMap::with_capacity(initializers.len() + graph.input.len());
    for (name, _) in initializers {
        if let Some(first) = seen.insert(name, "an initializer".to_string()) {
            return Err(OnnxError::DuplicateDefinition {
                tensor: name.clone(),
                first,
                second: "an initializer".to_string(),
            });
        }
    }
    let is_initializer: Vec<bool> = graph.input.iter().map(|v| seen.contains_key(v.name.as_str())).collect();
    let inputs = bind.map(|opts| bind_inputs(graph, &is_initializer, opts)).transpose()?;
    for (v, _) in graph.input.iter().zip(&is_initializer).filter(|(_, &init)| !init) {
        if let Some(first) = seen.insert(&v.name, "a graph input".to_string()) {
            return Err(OnnxError::DuplicateDefinition {
                tensor: v.name.clone(),
                first,
                second: "a graph input".to_string(),
            });
        }
    }

    let mut declared = HashMap::with_capacity(graph.value_info.len() + graph.output.len());
    for v in graph.value_info.iter().chain(&graph.output) {
        // An untyped value_info or output declares nothing to check; inference alone decides.
        if v.r#type.is_none() {
            continue;
        }
        let ty = decl_type(v)?;
        declared.insert(v.name.clone(), ty);
    }

    let order = topo_order(&graph.node, &seen)?;
    for o in &graph.output {
        let produced = graph.node.iter().any(|n| n.output.contains(&o.name));
        if !produced && !seen.contains_key(o.name.as_str()) {
            return Err(OnnxError::UndefinedOutput(o.name.clone()));
        }
    }
    Ok((Structure { declared, order, is_initializer }, inputs))
}

fn default_opset(model: &ModelProto) -> Result<i64, OnnxError> {
    let v = model.opset_import.iter().find(|o| o.domain.is_empty() || o.domain == "ai.onnx").map_or(0, |o| o.version);
    if (MIN_OPSET..=MAX_OPSET).contains(&v) {
        Ok(v)
    } else {
        Err(OnnxError::OpsetOutOfRange { domain: String::new(), version: v, min: MIN_OPSET, max: MAX_OPSET })
    }
}

/// Reads the graph inputs that are not initializers (older exporters list weights as inputs too), binding
/// symbolic dims from the options. Every binding must name a symbolic dim of some input, so that a typo in
/// `--dim` is reported instead of silently ignored.
fn bind_inputs(graph: &GraphProto, is_initializer: &[bool], opts: &ImportOptions) -> Result<Vec<Input>, OnnxError> {
    let mut used: HashSet<&str> = HashSet::new();
    let mut all_symbols: Vec<String> = Vec::new();
    let mut inputs = Vec::new();
    for (v, _) in graph.input.iter().zip(is_initializer).filter(|(_, &init)| !init) {
        let ty = decl_type(v)?;
        tensor::elem_size(ty.elem_type).ok_or_else(|| OnnxError::UnsupportedDtype {
            tensor: v.name.clone(),
            dtype: crate::proto::data_type::name(ty.elem_type),
            code: ty.elem_type,
        })?;
        let decl = ty.dims.ok_or_else(|| OnnxError::BadType {
            value: v.name.clone(),
            problem: "has no shape; graph inputs need a static or symbolic shape".to_string(),
        })?;
        let mut dims = Vec::with_capacity(decl.len());
        for (axis, d) in decl.iter().enumerate() {
            dims.push(match d {
                DeclDim::Known(x) => *x,
                DeclDim::Symbolic(s) => {
                    if !all_symbols.contains(s) {
                        all_symbols.push(s.clone());
                    }
                    match opts.dims.get_key_value(s) {
                        Some((k, &x)) => {
                            used.insert(k.as_str());
                            x
                        }
                        None => return Err(OnnxError::UnboundDim { input: v.name.clone(), axis, dim: s.clone() }),
                    }
                }
                DeclDim::Unknown => return Err(OnnxError::UnknownDim { input: v.name.clone(), axis }),
            });
        }
        let signed: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let numel = tensor::checked_numel(&v.name, &signed)?;
        let size = tensor::elem_size(ty.elem_type).unwrap_or(1) as u64;
        if (numel as u64).checked_mul(size).is_none_or(|b| b > opts.max_tensor_bytes) {
            return Err(OnnxError::TensorTooLarge {
                tensor: v.name.clone(),
                dims: signed,
                limit: opts.max_tensor_bytes,
            });
        }
        inputs.push(Input { name: v.name.clone(), dtype: ty.elem_type, dims });
    }
    let mut unused: Vec<&String> = opts.dims.keys().filter(|k| !used.contains(k.as_str())).collect();
    unused.sort();
    if let Some(dim) = unused.first() {
        return Err(OnnxError::UnusedDimBinding {
            dim: (*dim).clone(),
            known: if all_symbols.is_empty() { "none".to_string() } else { all_symbols.join(", ") },
        });
    }
    Ok(inputs)
}

/// A display name for a node: its name, or `#index` for unnamed nodes.
pub(crate) fn node_label(node: &NodeProto, index: usize) -> String {
    if node.name.is_empty() {
        format!("#{index}")
    } else {
        node.name.clone()
    }
}

/// Orders the nodes so that every tensor is defined before it is read, keeping file order where possible
/// (Kahn's algorithm, always taking the lowest ready index). Reports undefined tensors, tensors defined
/// twice, and cycles with the nodes on one cycle. O((N + E) log N).
fn topo_order(nodes: &[NodeProto], predefined: &HashMap<&str, String>) -> Result<Vec<usize>, OnnxError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if let Some(first) = predefined.get(o.as_str()) {
                return Err(OnnxError::DuplicateDefinition {
                    tensor: o.clone(),
                    first: first.clone(),
                    second: format!("node '{}'", node_label(n, i)),
                });
            }
            if let Some(&j) = producer.get(o.as_str()) {
                return Err(OnnxError::DuplicateDefinition {
                    tensor: o.clone(),
                    first: format!("node '{}'", node_label(&nodes[j], j)),
                    second: format!("node '{}'", node_label(n, i)),
                });
            }
            producer.insert(o, i);
        }
    }
    let mut indegree = vec![0usize; nodes.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for inp in n.input.iter().filter(|s| !s.is_empty()) {
            match producer.get(inp.as_str()) {
                Some(&p) => {
                    indegree[i] += 1;
                    users[p].push(i);
                }
                None if predefined.contains_key(inp.as_str()) => {}
                None => {
                    return Err(OnnxError::UndefinedTensor {
                        node: node_label(n, i),
                        op_type: n.op_type.clone(),
                        tensor: inp.clone(),
                    })
                }
            }
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..nodes.len()).filter(|&i| indegree[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.push(Reverse(u));
            }
        }
    }
    if order.len() == nodes.len() {
        return Ok(order);
    }
    // Every node left has an unprocessed predecessor; walking predecessors from any of them must revisit a
    // node, and the part of the walk from that node on is a cycle.
    let stuck: Vec<usize> = (0..nodes.len()).filter(|&i| indegree[i] > 0).collect();
    let mut pos: HashMap<usize, usize> = HashMap::new();
    let mut walk = Vec::new();
    let mut cur = stuck[0];
    loop {
        if let Some(&p) = pos.get(&cur) {
            let mut cycle: Vec<String> = walk[p..].iter().rev().map(|&i| node_label(&nodes[i], i)).collect();
            cycle.push(cycle[0].clone());
            return Err(OnnxError::Cycle { nodes: cycle });
        }
        pos.insert(cur, walk.len());
        walk.push(cur);
        // A stuck node has at least one stuck predecessor (its remaining indegree counts them).
        let pred =
            nodes[cur].input.iter().filter_map(|inp| producer.get(inp.as_str()).copied()).find(|&p| indegree[p] > 0);
        match pred {
            Some(p) => cur = p,
            None => {
                // Unreachable for a consistent indegree table; report what we have rather than panic.
                return Err(OnnxError::Cycle { nodes: walk.iter().map(|&i| node_label(&nodes[i], i)).collect() });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str, i: &[&str], o: &[&str]) -> NodeProto {
        NodeProto::new("Relu", name, i, o)
    }

    fn pre() -> HashMap<&'static str, String> {
        HashMap::from([("x", "a graph input".to_string())])
    }

    #[test]
    fn file_order_kept_and_out_of_order_fixed() {
        let nodes = vec![n("a", &["x"], &["t1"]), n("b", &["t1"], &["t2"])];
        assert_eq!(topo_order(&nodes, &pre()).unwrap(), vec![0, 1]);
        let nodes = vec![n("b", &["t1"], &["t2"]), n("a", &["x"], &["t1"])];
        assert_eq!(topo_order(&nodes, &pre()).unwrap(), vec![1, 0]);
    }

    #[test]
    fn cycle_is_named_in_order() {
        let nodes = vec![n("a", &["x", "t3"], &["t1"]), n("b", &["t1"], &["t2"]), n("c", &["t2"], &["t3"])];
        match topo_order(&nodes, &pre()) {
            Err(OnnxError::Cycle { nodes }) => {
                assert_eq!(nodes.len(), 4);
                assert_eq!(nodes.first(), nodes.last());
                let mut core = nodes[..3].to_vec();
                core.sort();
                assert_eq!(core, vec!["a", "b", "c"]);
                // consecutive entries follow data edges: a -> b -> c -> a, rotated
                let i = nodes.iter().position(|s| s == "a").unwrap();
                assert_eq!(nodes[i + 1], "b");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn undefined_and_duplicate_tensors() {
        let nodes = vec![n("a", &["nope"], &["t1"])];
        assert!(matches!(
            topo_order(&nodes, &pre()),
            Err(OnnxError::UndefinedTensor { tensor, .. }) if tensor == "nope"
        ));
        let nodes = vec![n("a", &["x"], &["t1"]), n("b", &["x"], &["t1"])];
        assert!(matches!(
            topo_order(&nodes, &pre()),
            Err(OnnxError::DuplicateDefinition { tensor, .. }) if tensor == "t1"
        ));
        let nodes = vec![n("a", &["x"], &["x"])];
        assert!(matches!(topo_order(&nodes, &pre()), Err(OnnxError::DuplicateDefinition { .. })));
    }
}
