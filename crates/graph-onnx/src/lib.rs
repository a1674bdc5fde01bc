//! graph-onnx: ONNX model -> `ComputeGraph`, the front door for models exported from PyTorch and friends.
//!
//! [`import`] decodes an ONNX `ModelProto` with hand-written `prost` messages ([`proto`]; no protoc, no
//! build script), checks it (opset 13..=21 of the default domain, tensor types, symbolic dims bound with
//! [`ImportOptions::dims`], sizes), orders the nodes, maps every supported operator onto graph-ir's [`Op`]
//! (ONNX semantics, so the mapping is mostly attributes and defaults), and folds the small constant
//! subgraphs exporters use for shapes and index tables. graph-ir's builder infers every shape; where the file
//! declares one (`value_info`, graph outputs) the two must agree.
//!
//! Weights: an initializer with data becomes a graph-ir constant when it is small
//! ([`ImportOptions::inline_constant_bytes`]), otherwise a weight whose bytes are returned in
//! [`OnnxModel::weights`]; an initializer with dims but no data (the shared test models strip their large
//! weights) becomes a weight whose values the runner supplies. Initializers whose data lives in files beside the
//! model (ONNX external data: `location`, `offset`, `length`) are read from [`ImportOptions::external_data_dir`]
//! (the model's folder for [`import_file`]); a missing file, a range past its end or a path leaving the folder
//! is an [`OnnxError::ExternalData`] naming the tensor. Initializers read only as op attributes
//! (Reshape targets, axes, pads) never become tensors.
//!
//! Every failure is an [`OnnxError`] naming the node, op type, tensor or attribute; hostile files (truncated,
//! bit-flipped, 10^9-element dims, cycles) give errors, never panics or huge allocations.
//!
//! [`Op`]: graph_ir::Op

// Library code returns typed errors; tests may unwrap (clippy.toml allows it inside #[test] and #[cfg(test)]).
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use graph_ir::{ComputeGraph, DType, Shape, TensorId};

mod attr;
mod error;
mod fold;
pub mod fuzz_entry;
mod import;
mod model;
mod ops;
pub mod proto;
mod tensor;
mod types;

pub use error::OnnxError;
pub use model::{MAX_OPSET, MIN_OPSET};

/// How to import a model.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Values for symbolic input dimensions (`dim_param`), as given by `--dim NAME=VALUE`. Every binding
    /// must name a symbolic dimension of some graph input.
    pub dims: HashMap<String, usize>,
    /// Largest file accepted, in bytes (default 2 GiB, protobuf's own limit).
    pub max_file_bytes: u64,
    /// Largest single tensor (input, weight, intermediate) accepted, in bytes (default 16 GiB).
    pub max_tensor_bytes: u64,
    /// Initializers and folded constants up to this many bytes become graph-ir constants (data inline in
    /// the graph); larger ones become weights with their bytes in [`OnnxModel::weights`] (default 64 KiB).
    pub inline_constant_bytes: usize,
    /// Largest result constant folding may produce, in bytes (default 16 MiB).
    pub max_fold_bytes: usize,
    /// Folded constants (values computed at import, not initializers of the file) stay graph-ir constants
    /// whatever their size, up to the graph's constant limit (default off). Plan sets turn it on: a folded value
    /// such as an expanded attention mask can depend on a symbolic dimension, so it must travel with each
    /// member's plan instead of being one weight shared by every member.
    pub inline_folded: bool,
    /// The folder that ONNX external data (`data_location = EXTERNAL`, a `location` relative to the model) is
    /// read from. [`import_file`] sets it to the model's folder when it is `None`; with `None`, [`import`]
    /// rejects external data with an error naming the tensor.
    pub external_data_dir: Option<PathBuf>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            dims: HashMap::new(),
            max_file_bytes: 2 << 30,
            max_tensor_bytes: 16 << 30,
            inline_constant_bytes: 64 << 10,
            max_fold_bytes: 16 << 20,
            inline_folded: false,
            external_data_dir: None,
        }
    }
}

impl ImportOptions {
    /// Default options with symbolic dims bound.
    pub fn with_dims<I, S>(dims: I) -> Self
    where
        I: IntoIterator<Item = (S, usize)>,
        S: Into<String>,
    {
        ImportOptions { dims: dims.into_iter().map(|(k, v)| (k.into(), v)).collect(), ..Self::default() }
    }
}

/// The bytes of a weight the file carries (an initializer too large to inline as a graph constant).
#[derive(Clone, Debug, PartialEq)]
pub struct WeightData {
    /// The weight's tensor in [`OnnxModel::graph`].
    pub tensor: TensorId,
    /// Its name (the ONNX initializer name).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
    /// Packed little-endian elements, `shape.numel() * dtype.size_bytes()` bytes (shared with the
    /// importer's decode buffer: the data is never copied after protobuf decoding).
    pub bytes: Arc<Vec<u8>>,
}

/// Counts from one import, for summaries and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// Nodes in the ONNX graph.
    pub onnx_nodes: usize,
    /// ONNX nodes evaluated at import time (Constant, Shape, shape arithmetic, index tables).
    pub folded_nodes: usize,
    /// Nodes in the resulting graph (more than `onnx_nodes - folded_nodes` when variadic ops were chained).
    pub graph_nodes: usize,
    /// Initializers and folded values with data that no op reads as a tensor (attributes only, or unused).
    pub unused_initializers: usize,
}

/// An imported model.
#[derive(Clone, Debug)]
pub struct OnnxModel {
    /// The graph, validated.
    pub graph: ComputeGraph,
    /// Weights with data in the file, to hand to the executor; weights of the graph that are absent here
    /// (stripped initializers) need values from elsewhere (or seeded random values).
    pub weights: Vec<WeightData>,
    /// The default-domain opset the model imports.
    pub opset: i64,
    /// The file's IR version.
    pub ir_version: i64,
    /// `producer_name producer_version`.
    pub producer: String,
    /// Counts from the import.
    pub stats: ImportStats,
}

/// Imports an ONNX model from its bytes.
pub fn import(bytes: &[u8], opts: &ImportOptions) -> Result<OnnxModel, OnnxError> {
    let parsed = model::parse(bytes, opts)?;
    import::build(parsed, opts)
}

/// An ONNX model decoded once (protobuf and initializer data), to import again at other values of its symbolic
/// dimensions without decoding again: what a plan set loads its members from.
#[derive(Clone)]
pub struct DecodedModel(model::Decoded);

impl DecodedModel {
    /// Decode `bytes` (the size limits and external-data folder of `opts` apply; its dims do not).
    pub fn decode(bytes: &[u8], opts: &ImportOptions) -> Result<DecodedModel, OnnxError> {
        model::decode(bytes, opts).map(DecodedModel)
    }

    /// Import the decoded model with `opts.dims` bound: the same result as [`import`] of the same bytes.
    pub fn import(&self, opts: &ImportOptions) -> Result<OnnxModel, OnnxError> {
        import::build(model::bind(self.0.clone(), opts)?, opts)
    }
}

/// Imports an ONNX model from a file, checking its size before reading it; external data is read from the
/// model's folder unless [`ImportOptions::external_data_dir`] names another.
pub fn import_file(path: impl AsRef<Path>, opts: &ImportOptions) -> Result<OnnxModel, OnnxError> {
    let path = path.as_ref();
    let io = |source| OnnxError::Io { path: path.to_path_buf(), source };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > opts.max_file_bytes {
        return Err(OnnxError::FileTooLarge { bytes: len, limit: opts.max_file_bytes });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    if opts.external_data_dir.is_some() {
        return import(&bytes, opts);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    import(&bytes, &ImportOptions { external_data_dir: Some(dir), ..opts.clone() })
}
