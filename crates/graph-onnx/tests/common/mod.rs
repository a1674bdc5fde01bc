//! Helpers shared by the integration tests: build small ONNX models with the crate's own prost messages.
#![allow(dead_code)]

use graph_ir::{Node, Op, TensorRole};
use graph_onnx::proto::{
    data_type, AttributeProto as A, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto,
};
use graph_onnx::{import, ImportOptions, OnnxError, OnnxModel};
use prost::Message;

pub const F: i32 = data_type::FLOAT;
pub const I64: i32 = data_type::INT64;

/// A float input or output with static dims.
pub fn f32v(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto::f32(name, dims)
}

/// An output of the given element type whose shape the importer infers.
pub fn out(name: &str) -> ValueInfoProto {
    ValueInfoProto::untyped_shape(name, F)
}

/// Encodes a model at `opset`.
pub fn encode(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
) -> Vec<u8> {
    ModelProto::with_graph(opset, GraphProto::build(nodes, inputs, outputs, inits)).encode_to_vec()
}

/// Encodes and imports with default options.
pub fn try_import(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
) -> Result<OnnxModel, OnnxError> {
    import(&encode(opset, nodes, inputs, outputs, inits), &ImportOptions::default())
}

/// Encodes and imports, panicking with the error's message on failure.
pub fn imp(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
) -> OnnxModel {
    match try_import(opset, nodes, inputs, outputs, inits) {
        Ok(m) => m,
        Err(e) => panic!("import failed: {e}"),
    }
}

/// The graph node named `name`.
pub fn node<'a>(m: &'a OnnxModel, name: &str) -> &'a Node {
    let id = m.graph.node_id(name).unwrap_or_else(|| panic!("no node '{name}'"));
    m.graph.node(id)
}

/// The op of the graph node named `name`.
pub fn op(m: &OnnxModel, name: &str) -> Op {
    node(m, name).op.clone()
}

/// Dims of the tensor named `name`.
pub fn dims(m: &OnnxModel, name: &str) -> Vec<usize> {
    let id = m.graph.tensor_id(name).unwrap_or_else(|| panic!("no tensor '{name}'"));
    m.graph.tensor(id).shape.0.to_vec()
}

/// Role of the tensor named `name`.
pub fn role(m: &OnnxModel, name: &str) -> TensorRole {
    let id = m.graph.tensor_id(name).unwrap_or_else(|| panic!("no tensor '{name}'"));
    m.graph.tensor(id).role
}

/// A one-node model: `op_type` over a float input `x` of `dims`, output `y`, plus initializers.
pub fn single(
    opset: i64,
    op_type: &str,
    inputs: &[&str],
    attrs: Vec<graph_onnx::proto::AttributeProto>,
    dims: &[i64],
    inits: Vec<TensorProto>,
) -> Result<OnnxModel, OnnxError> {
    let n = NodeProto::new(op_type, "n", inputs, &["y"]).with_attrs(attrs);
    try_import(opset, vec![n], vec![f32v("x", dims)], vec![out("y")], inits)
}

/// A small but complete CNN: Conv (SAME_UPPER) -> Relu -> MaxPool -> Flatten -> Gemm, with weights.
pub fn tiny_model() -> Vec<u8> {
    let nodes = vec![
        NodeProto::new("Conv", "conv", &["x", "w", "b"], &["c"])
            .with_attrs(vec![A::string("auto_pad", "SAME_UPPER"), A::ints("strides", &[2, 2])]),
        NodeProto::new("Relu", "relu", &["c"], &["r"]),
        NodeProto::new("MaxPool", "pool", &["r"], &["p"]).with_attrs(vec![
            A::ints("kernel_shape", &[2, 2]),
            A::ints("strides", &[2, 2]),
            A::int("ceil_mode", 1),
        ]),
        NodeProto::new("Flatten", "flat", &["p"], &["f"]),
        NodeProto::new("Gemm", "fc", &["f", "fw", "fb"], &["y"]).with_attrs(vec![A::int("transB", 1)]),
    ];
    let inits = vec![
        TensorProto::f32("w", &[4, 3, 3, 3], &[0.5; 108]),
        TensorProto::f32("b", &[4], &[0.0, 0.1, 0.2, 0.3]),
        TensorProto::shape_only("fw", F, &[10, 36]),
        TensorProto::f32("fb", &[10], &[0.0; 10]),
    ];
    encode(15, nodes, vec![f32v("x", &[1, 3, 11, 11])], vec![f32v("y", &[1, 10])], inits)
}
