//! The importer's error type: one variant per way an ONNX file can be unusable, each naming what is wrong.

use std::path::PathBuf;

/// Why an ONNX model could not be imported. Every variant names the node (name and op type), tensor,
/// attribute or field concerned; none is an internal error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnnxError {
    /// The file could not be read.
    #[error("cannot read ONNX file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is larger than [`crate::ImportOptions::max_file_bytes`].
    #[error("ONNX file is {bytes} bytes, over the limit of {limit} bytes")]
    FileTooLarge {
        /// The file's size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The bytes are not a valid `ModelProto`.
    #[error("malformed ONNX protobuf: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The model has no graph.
    #[error("ONNX model has no graph")]
    NoGraph,
    /// The model does not import the default ONNX domain at a supported version.
    #[error("ONNX opset {version} for domain '{domain}' is not supported (supported: {min}..={max})")]
    OpsetOutOfRange {
        /// The domain ("" or "ai.onnx" is the default domain).
        domain: String,
        /// The version the model imports (0 when it imports none).
        version: i64,
        /// Lowest supported version.
        min: i64,
        /// Highest supported version.
        max: i64,
    },
    /// A node uses an operator the importer does not support.
    #[error("node '{node}': unsupported operator {op_type} (domain '{domain}')")]
    UnsupportedOp {
        /// The node's name.
        node: String,
        /// The operator.
        op_type: String,
        /// Its domain ("" is the default ONNX domain).
        domain: String,
    },
    /// A node uses an operator in a form (attribute value, optional input or output) the importer does not
    /// support.
    #[error("node '{node}' ({op_type}): unsupported {what}")]
    Unsupported {
        /// The node's name.
        node: String,
        /// The operator.
        op_type: String,
        /// What is unsupported.
        what: String,
    },
    /// The model uses a feature outside tensors-in, tensors-out graphs (sparse initializers, non-tensor
    /// values, subgraphs).
    #[error("unsupported ONNX feature: {0}")]
    UnsupportedFeature(String),
    /// A tensor has a data type the importer does not support.
    #[error("tensor '{tensor}': unsupported data type {dtype} ({code})")]
    UnsupportedDtype {
        /// The tensor.
        tensor: String,
        /// The ONNX name of its data type.
        dtype: &'static str,
        /// The ONNX data type code.
        code: i32,
    },
    /// A tensor's data lives in an external file that cannot be read: no model folder to read it from (the
    /// model came as bytes), no `location`, a path leaving the model's folder, a missing file, a malformed
    /// `offset`/`length`, or a range past the end of the file.
    #[error("tensor '{tensor}': external data '{location}': {problem}")]
    ExternalData {
        /// The tensor.
        tensor: String,
        /// The external file named by the tensor (`location`), as written in the model.
        location: String,
        /// What is wrong.
        problem: String,
    },
    /// A tensor's payload is malformed.
    #[error("tensor '{tensor}': {problem}")]
    MalformedTensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// A tensor's data does not have as many entries as its dims say.
    #[error("tensor '{tensor}': {field} holds {actual} entries (bytes for raw_data), its dims need {expected}")]
    DataLength {
        /// The tensor.
        tensor: String,
        /// The field holding the data.
        field: &'static str,
        /// What the dims need.
        expected: u64,
        /// What the field holds.
        actual: u64,
    },
    /// A dimension is negative.
    #[error("tensor '{tensor}': negative dimension in {dims:?}")]
    NegativeDim {
        /// The tensor.
        tensor: String,
        /// Its dims.
        dims: Vec<i64>,
    },
    /// The product of a tensor's dims overflows.
    #[error("tensor '{tensor}': the element count of dims {dims:?} overflows")]
    SizeOverflow {
        /// The tensor.
        tensor: String,
        /// Its dims.
        dims: Vec<i64>,
    },
    /// A tensor is larger than [`crate::ImportOptions::max_tensor_bytes`].
    #[error("tensor '{tensor}': dims {dims:?} exceed the limit of {limit} bytes")]
    TensorTooLarge {
        /// The tensor.
        tensor: String,
        /// Its dims.
        dims: Vec<i64>,
        /// The limit.
        limit: u64,
    },
    /// A graph input, output or value has no tensor type, or a type other than a tensor.
    #[error("value '{value}': {problem}")]
    BadType {
        /// The value.
        value: String,
        /// What is wrong with its type.
        problem: String,
    },
    /// A graph input has a symbolic dimension and no `--dim` binding for it.
    #[error("input '{input}' dimension {axis} is symbolic ('{dim}'); bind it with --dim {dim}=VALUE")]
    UnboundDim {
        /// The input.
        input: String,
        /// The axis.
        axis: usize,
        /// The symbolic name.
        dim: String,
    },
    /// A graph input has a dimension with neither a value nor a name.
    #[error("input '{input}' dimension {axis} is unknown (no value and no name); the importer needs static shapes")]
    UnknownDim {
        /// The input.
        input: String,
        /// The axis.
        axis: usize,
    },
    /// A `--dim` binding names no symbolic dimension of the model's inputs.
    #[error("--dim {dim}: the model's inputs have no symbolic dimension named '{dim}' (they have: {known})")]
    UnusedDimBinding {
        /// The binding's name.
        dim: String,
        /// The symbolic names the model uses, comma-separated.
        known: String,
    },
    /// A node's required input is absent (missing or the empty name).
    #[error("node '{node}' ({op_type}): required input {index} is missing")]
    MissingInput {
        /// The node's name.
        node: String,
        /// The operator.
        op_type: String,
        /// The input's position.
        index: usize,
    },
    /// A node reads a tensor that no node produces and that is neither a graph input nor an initializer.
    #[error("node '{node}' ({op_type}) reads '{tensor}', which no node, input or initializer defines")]
    UndefinedTensor {
        /// The node's name.
        node: String,
        /// The operator.
        op_type: String,
        /// The undefined tensor.
        tensor: String,
    },
    /// A graph output names a tensor nothing defines.
    #[error("graph output '{0}' is not produced by any node, input or initializer")]
    UndefinedOutput(String),
    /// Two nodes (or a node and an input or initializer) define the same tensor.
    #[error("tensor '{tensor}' is defined twice: by {first} and by {second}")]
    DuplicateDefinition {
        /// The tensor.
        tensor: String,
        /// The first definer.
        first: String,
        /// The second definer.
        second: String,
    },
    /// The nodes form a cycle.
    #[error("the graph has a cycle through nodes {}", .nodes.join(" -> "))]
    Cycle {
        /// The names of the nodes on the cycle, in order.
        nodes: Vec<String>,
    },
    /// An attribute has the wrong type or an invalid value.
    #[error("node '{node}' ({op_type}): attribute '{attr}': {problem}")]
    Attribute {
        /// The node's name.
        node: String,
        /// The operator.
        op_type: String,
        /// The attribute.
        attr: String,
        /// What is wrong.
        problem: String,
    },
    /// An attribute's type code is not one ONNX defines.
    #[error("node '{node}' ({op_type}): attribute '{attr}' has unknown type code {code}")]
    UnknownAttributeType {
        /// The node's name.
        node: String,
        /// The operator.
        op_type: String,
        /// The attribute.
        attr: String,
        /// The code.
        code: i32,
    },
    /// An input the importer needs as a constant (shape, axes, pads, ...) is computed at run time.
    #[error("node '{node}' ({op_type}): input {index} ('{tensor}') must be a constant (an initializer or Constant)")]
    NonConstantInput {
        /// The node's name.
        node: String,
        /// The operator.
        op_type: String,
        /// The input's position.
        index: usize,
        /// The tensor.
        tensor: String,
    },
    /// A node's inputs are invalid for its operator (shapes, dtypes, values).
    #[error("node '{node}' ({op_type}): {problem}")]
    InvalidNode {
        /// The node's name.
        node: String,
        /// The operator.
        op_type: String,
        /// What is wrong.
        problem: String,
    },
    /// graph-ir rejected the graph (shape or dtype inference, validation, limits); its message names the
    /// node or tensor.
    #[error(transparent)]
    Graph(#[from] graph_ir::GraphError),
    /// A shape declared in the file (value_info or graph output) disagrees with the inferred one.
    #[error("tensor '{tensor}': the file declares {declared}, inference gives {inferred}")]
    ShapeMismatch {
        /// The tensor.
        tensor: String,
        /// What the file says.
        declared: String,
        /// What inference says.
        inferred: String,
    },
}
