//! graph-onnx: placeholder
