//! graph-onnx: ONNX model -> `ComputeGraph`.

use std::collections::HashMap;

mod attr;
mod error;
mod model;
pub mod proto;
mod tensor;

pub use error::OnnxError;
pub use model::{MAX_OPSET, MIN_OPSET};

/// How to import a model.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Values for symbolic input dimensions (`dim_param`), as given by `--dim NAME=VALUE`.
    pub dims: HashMap<String, usize>,
    /// Largest file accepted, in bytes (default 2 GiB, protobuf's own limit).
    pub max_file_bytes: u64,
    /// Largest single tensor (input, weight, intermediate) accepted, in bytes (default 16 GiB).
    pub max_tensor_bytes: u64,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            dims: HashMap::new(),
            max_file_bytes: 2 << 30,
            max_tensor_bytes: 16 << 30,
        }
    }
}
