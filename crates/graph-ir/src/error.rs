//! `GraphError`: every way a graph, its file or a builder call can be wrong, each naming what is wrong.

use thiserror::Error;

/// Result alias for graph operations.
pub type GraphResult<T> = Result<T, GraphError>;

/// A user error in a graph: every variant names the node, tensor or field at fault.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GraphError {
    /// The graph has no nodes.
    #[error("graph '{graph}' is empty: it has no nodes")]
    EmptyGraph {
        /// The graph's name.
        graph: String,
    },
    /// The graph marks no outputs.
    #[error("graph '{graph}' has no outputs")]
    NoOutputs {
        /// The graph's name.
        graph: String,
    },
    /// A name is empty or otherwise unusable.
    #[error("invalid {what} name {name:?}: names must be non-empty")]
    InvalidName {
        /// "tensor" or "node".
        what: &'static str,
        /// The offending name.
        name: String,
    },
    /// Two tensors share a name.
    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// Two nodes share a name.
    #[error("duplicate node name '{name}'")]
    DuplicateNode {
        /// The name.
        name: String,
    },
    /// A node reads a tensor that no node produces and that is not an input, weight or constant.
    #[error("node '{node}' reads tensor '{tensor}', which is neither produced by a node nor a graph input, weight or constant")]
    UnknownTensor {
        /// The reading node.
        node: String,
        /// The missing tensor.
        tensor: String,
    },
    /// Two nodes write the same tensor.
    #[error("tensor '{tensor}' is produced twice: by node '{first}' and by node '{second}'")]
    DoubleProducer {
        /// The tensor.
        tensor: String,
        /// The first producer.
        first: String,
        /// The second producer.
        second: String,
    },
    /// A node writes a tensor that is a graph input, weight or constant.
    #[error("node '{node}' writes tensor '{tensor}', which is a graph {role}")]
    WritesSource {
        /// The node.
        node: String,
        /// The tensor.
        tensor: String,
        /// Its role.
        role: &'static str,
    },
    /// The nodes form a cycle; lists the nodes on one cycle, in order.
    #[error("the graph has a cycle through nodes {}", fmt_cycle(.nodes))]
    Cycle {
        /// Node names along one cycle (the first repeats implicitly at the end).
        nodes: Vec<String>,
    },
    /// A graph output names a tensor that no node produces.
    #[error("graph output '{tensor}' is never produced by a node")]
    OutputNotProduced {
        /// The tensor.
        tensor: String,
    },
    /// A tensor is marked as a graph output twice.
    #[error("tensor '{tensor}' is marked as a graph output twice")]
    DuplicateOutput {
        /// The tensor.
        tensor: String,
    },
    /// A [`crate::GraphEdit`] was used out of order (a node placed twice or before its inputs' producers, a node
    /// never placed, a source retyped without the data it needs).
    #[error("graph edit: {detail}")]
    Edit {
        /// What was wrong.
        detail: String,
    },
    /// A tensor id does not belong to this graph.
    #[error("tensor id {id} does not belong to graph '{graph}'")]
    ForeignTensor {
        /// The id's debug text.
        id: String,
        /// The graph's name.
        graph: String,
    },
    /// A node has the wrong number of inputs for its op.
    #[error("node '{node}' ({op}) takes {expected} inputs, got {got}")]
    Arity {
        /// The node.
        node: String,
        /// The op name.
        op: &'static str,
        /// What the op accepts.
        expected: String,
        /// What the node has.
        got: usize,
    },
    /// A node lists a different number of outputs than its op produces.
    #[error("node '{node}' ({op}) produces {expected} outputs, but {got} output names were given")]
    OutputCount {
        /// The node.
        node: String,
        /// The op name.
        op: &'static str,
        /// What the op produces.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// Input shapes are incompatible with the op.
    #[error("node '{node}' ({op}): shape mismatch: {detail}")]
    ShapeMismatch {
        /// The node.
        node: String,
        /// The op name.
        op: &'static str,
        /// What is wrong, with the shapes.
        detail: String,
    },
    /// Input dtypes are incompatible with the op.
    #[error("node '{node}' ({op}): dtype mismatch: {detail}")]
    DTypeMismatch {
        /// The node.
        node: String,
        /// The op name.
        op: &'static str,
        /// What is wrong, with the dtypes.
        detail: String,
    },
    /// An attribute value is invalid.
    #[error("node '{node}' ({op}): invalid attribute '{attr}': {detail}")]
    InvalidAttribute {
        /// The node.
        node: String,
        /// The op name.
        op: &'static str,
        /// The attribute.
        attr: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A declared shape or dtype disagrees with the inferred one.
    #[error("tensor '{tensor}': declared {declared} but inferred {inferred}")]
    DeclaredMismatch {
        /// The tensor.
        tensor: String,
        /// What the file declared.
        declared: String,
        /// What inference gave.
        inferred: String,
    },
    /// A tensor's size in bytes overflows.
    #[error("tensor '{tensor}' with shape {shape} and dtype {dtype} is too large: its size overflows")]
    SizeOverflow {
        /// The tensor.
        tensor: String,
        /// The shape.
        shape: String,
        /// The dtype.
        dtype: String,
    },
    /// A declared extent is negative or unrepresentable.
    #[error("tensor '{tensor}': extent {value} on axis {axis} is invalid: extents must be >= 0")]
    InvalidDim {
        /// The tensor.
        tensor: String,
        /// The axis.
        axis: usize,
        /// The value found.
        value: i64,
    },
    /// A tensor's rank exceeds the limit.
    #[error("tensor '{tensor}' has rank {rank}, above the limit of {limit}")]
    RankTooLarge {
        /// The tensor.
        tensor: String,
        /// Its rank.
        rank: usize,
        /// The limit.
        limit: usize,
    },
    /// A configured limit was exceeded (nodes, tensors, constant bytes, file size).
    #[error("{what} is {value}, above the limit of {limit}")]
    LimitExceeded {
        /// What was counted.
        what: String,
        /// The value found.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// Constant data does not match its declared dtype and shape.
    #[error("constant '{tensor}': {detail}")]
    ConstantData {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// The JSON could not be parsed into a graph document.
    #[error("JSON error at {path} (line {line}, column {column}): {message}")]
    Json {
        /// The JSON path of the offending value (`nodes[3].op`), `.` for the root.
        path: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The document's `format` is not `cuplan-graph`.
    #[error("not a cuplan graph: field 'format' is {found:?}, expected \"cuplan-graph\"")]
    WrongFormat {
        /// The value found.
        found: String,
    },
    /// The document's `version` is not supported.
    #[error("unsupported cuplan-graph version {found}; this build reads version {supported}")]
    UnsupportedVersion {
        /// The version found.
        found: u64,
        /// The supported version.
        supported: u64,
    },
    /// A declaration uses a symbolic extent that no binding gives a value.
    #[error("tensor '{tensor}': extent {axis} is the symbol '{symbol}', which has no value; bind it with --dim {symbol}=VALUE")]
    UnboundSymbol {
        /// The tensor.
        tensor: String,
        /// The axis.
        axis: usize,
        /// The symbol.
        symbol: String,
    },
    /// A binding names no symbolic extent of the document.
    #[error("--dim {symbol}: the graph declares no symbolic extent named '{symbol}' (it has: {known})")]
    UnusedSymbolBinding {
        /// The binding's name.
        symbol: String,
        /// The symbols the document uses, comma-separated, or "none".
        known: String,
    },
    /// A planning or run option is invalid.
    #[error("invalid option '{option}': {detail}")]
    InvalidOption {
        /// The option's name.
        option: String,
        /// What is wrong.
        detail: String,
    },
    /// Bad parameters for a synthetic graph family.
    #[error("synth {family}: {detail}")]
    Synth {
        /// The family.
        family: &'static str,
        /// What is wrong.
        detail: String,
    },
}

fn fmt_cycle(nodes: &[String]) -> String {
    let mut s = String::new();
    for n in nodes {
        s.push('\'');
        s.push_str(n);
        s.push_str("' -> ");
    }
    if let Some(first) = nodes.first() {
        s.push('\'');
        s.push_str(first);
        s.push('\'');
    }
    s
}
