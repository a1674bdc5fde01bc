//! graph-onnx: ONNX model -> `ComputeGraph`.

pub mod proto;
