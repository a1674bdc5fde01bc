//! Hand-written `prost` messages for the parts of `onnx.proto` (IR version 10) that the importer reads.
//!
//! Field tags and wire types follow `onnx/onnx.proto` exactly, so these structs decode real ONNX files and
//! encode files that `onnx` and onnxruntime read back (tests build their models with them). Fields we never
//! read are left out: prost skips unknown fields while decoding. Fields that would make us misread a model if
//! we silently skipped them (subgraphs, sparse tensors, non-tensor types, tensor segments) are declared as
//! opaque bytes so that the importer can see they are present and reject the model by name. Declaring them as
//! bytes rather than as nested messages also keeps every struct non-recursive, so decoding cannot recurse
//! through attacker-controlled nesting.

#![allow(missing_docs)] // Field names and tags mirror onnx.proto; its comments are the documentation.

use std::collections::HashMap;

/// `ModelProto`: the top-level ONNX file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(string, tag = "3")]
    pub producer_version: String,
    #[prost(string, tag = "4")]
    pub domain: String,
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    /// Model-local functions (`FunctionProto`), kept opaque: a node calling one is an unsupported op.
    #[prost(bytes = "vec", repeated, tag = "25")]
    pub functions: Vec<Vec<u8>>,
}

/// `OperatorSetIdProto`: one (domain, version) pair of `ModelProto.opset_import`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// `GraphProto`: nodes in topological order, initializers, and typed inputs, outputs and intermediates.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// `SparseTensorProto` initializers, kept opaque: they are rejected.
    #[prost(bytes = "vec", repeated, tag = "15")]
    pub sparse_initializer: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// `NodeProto`: one operator application.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(string, tag = "7")]
    pub domain: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto.AttributeType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum AttributeType {
    Undefined = 0,
    Float = 1,
    Int = 2,
    String = 3,
    Tensor = 4,
    Graph = 5,
    SparseTensor = 11,
    TypeProto = 13,
    Floats = 6,
    Ints = 7,
    Strings = 8,
    Tensors = 9,
    Graphs = 10,
    SparseTensors = 12,
    TypeProtos = 14,
}

impl AttributeType {
    /// The ONNX spelling, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            AttributeType::Undefined => "UNDEFINED",
            AttributeType::Float => "FLOAT",
            AttributeType::Int => "INT",
            AttributeType::String => "STRING",
            AttributeType::Tensor => "TENSOR",
            AttributeType::Graph => "GRAPH",
            AttributeType::SparseTensor => "SPARSE_TENSOR",
            AttributeType::TypeProto => "TYPE_PROTO",
            AttributeType::Floats => "FLOATS",
            AttributeType::Ints => "INTS",
            AttributeType::Strings => "STRINGS",
            AttributeType::Tensors => "TENSORS",
            AttributeType::Graphs => "GRAPHS",
            AttributeType::SparseTensors => "SPARSE_TENSORS",
            AttributeType::TypeProtos => "TYPE_PROTOS",
        }
    }
}

/// `AttributeProto`: a named attribute of a node. Singular fields are `optional` (proto2 presence) so that a
/// zero value written by an exporter is distinguishable from an absent one.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// Set inside function bodies only; an attribute reference is not a value we can import.
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    #[prost(enumeration = "AttributeType", tag = "20")]
    pub r#type: i32,
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    #[prost(bytes = "vec", optional, tag = "4")]
    pub s: Option<Vec<u8>>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// A subgraph (If/Loop/Scan bodies), kept opaque.
    #[prost(bytes = "vec", optional, tag = "6")]
    pub g: Option<Vec<u8>>,
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
}

/// `TensorProto.DataType` codes.
pub mod data_type {
    pub const UNDEFINED: i32 = 0;
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const UINT16: i32 = 4;
    pub const INT16: i32 = 5;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const STRING: i32 = 8;
    pub const BOOL: i32 = 9;
    pub const FLOAT16: i32 = 10;
    pub const DOUBLE: i32 = 11;
    pub const UINT32: i32 = 12;
    pub const UINT64: i32 = 13;
    pub const COMPLEX64: i32 = 14;
    pub const COMPLEX128: i32 = 15;
    pub const BFLOAT16: i32 = 16;

    /// The ONNX spelling of a data type code, for error messages.
    pub fn name(code: i32) -> &'static str {
        match code {
            UNDEFINED => "UNDEFINED",
            FLOAT => "FLOAT",
            UINT8 => "UINT8",
            INT8 => "INT8",
            UINT16 => "UINT16",
            INT16 => "INT16",
            INT32 => "INT32",
            INT64 => "INT64",
            STRING => "STRING",
            BOOL => "BOOL",
            FLOAT16 => "FLOAT16",
            DOUBLE => "DOUBLE",
            UINT32 => "UINT32",
            UINT64 => "UINT64",
            COMPLEX64 => "COMPLEX64",
            COMPLEX128 => "COMPLEX128",
            BFLOAT16 => "BFLOAT16",
            17..=20 => "FLOAT8",
            21 => "UINT4",
            22 => "INT4",
            23 => "FLOAT4E2M1",
            _ => "unknown",
        }
    }
}

/// `TensorProto.DataLocation`: `DEFAULT` (data inline) or `EXTERNAL` (data in another file).
pub mod data_location {
    pub const DEFAULT: i32 = 0;
    pub const EXTERNAL: i32 = 1;
}

/// `TensorProto`: an initializer or a constant attribute value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// `TensorProto.Segment`, kept opaque: segmented tensors are rejected.
    #[prost(bytes = "vec", optional, tag = "3")]
    pub segment: Option<Vec<u8>>,
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// `StringStringEntryProto`: a key/value pair (external data locations).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `ValueInfoProto`: a named, typed value (graph input, output or intermediate).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto`. Only `tensor_type` is importable; the other variants are decoded as opaque bytes so that
/// the importer can name them in its error.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    #[prost(oneof = "type_proto::Value", tags = "1, 4, 5, 7, 8, 9")]
    pub value: Option<type_proto::Value>,
}

/// Nested messages of `TypeProto`.
pub mod type_proto {
    /// The `TypeProto.value` oneof.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "1")]
        TensorType(Tensor),
        #[prost(bytes = "vec", tag = "4")]
        SequenceType(Vec<u8>),
        #[prost(bytes = "vec", tag = "5")]
        MapType(Vec<u8>),
        #[prost(bytes = "vec", tag = "7")]
        OpaqueType(Vec<u8>),
        #[prost(bytes = "vec", tag = "8")]
        SparseTensorType(Vec<u8>),
        #[prost(bytes = "vec", tag = "9")]
        OptionalType(Vec<u8>),
    }

    impl Value {
        /// The variant's name in onnx.proto, for error messages.
        pub fn kind(&self) -> &'static str {
            match self {
                Value::TensorType(_) => "tensor_type",
                Value::SequenceType(_) => "sequence_type",
                Value::MapType(_) => "map_type",
                Value::OpaqueType(_) => "opaque_type",
                Value::SparseTensorType(_) => "sparse_tensor_type",
                Value::OptionalType(_) => "optional_type",
            }
        }
    }

    /// `TypeProto.Tensor`: element type and (possibly partial) shape.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Tensor {
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<super::TensorShapeProto>,
    }
}

/// `TensorShapeProto`: a list of dimensions, each a value, a symbolic name, or unknown.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<tensor_shape_proto::Dimension>,
}

/// Nested messages of `TensorShapeProto`.
pub mod tensor_shape_proto {
    /// One dimension.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        #[prost(oneof = "dimension::Value", tags = "1, 2")]
        pub value: Option<dimension::Value>,
    }

    /// Nested types of `Dimension`.
    pub mod dimension {
        /// The `Dimension.value` oneof.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            #[prost(int64, tag = "1")]
            DimValue(i64),
            #[prost(string, tag = "2")]
            DimParam(String),
        }
    }
}

// ---- Constructors: tests and fixtures build models from these; the importer never needs them. ----

/// One dimension of a [`ValueInfoProto::tensor`] shape: a value or a symbolic name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A static extent.
    Value(i64),
    /// A symbolic extent (`dim_param`).
    Param(String),
}

impl From<i64> for Dim {
    fn from(v: i64) -> Self {
        Dim::Value(v)
    }
}

impl From<&str> for Dim {
    fn from(v: &str) -> Self {
        Dim::Param(v.to_string())
    }
}

impl ValueInfoProto {
    /// A tensor value of element type `elem_type` and the given dims.
    pub fn tensor(name: &str, elem_type: i32, dims: &[Dim]) -> Self {
        let dim = dims
            .iter()
            .map(|d| tensor_shape_proto::Dimension {
                value: Some(match d {
                    Dim::Value(v) => tensor_shape_proto::dimension::Value::DimValue(*v),
                    Dim::Param(p) => tensor_shape_proto::dimension::Value::DimParam(p.clone()),
                }),
            })
            .collect();
        ValueInfoProto {
            name: name.to_string(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type,
                    shape: Some(TensorShapeProto { dim }),
                })),
            }),
        }
    }

    /// A tensor value of element type `elem_type` with no shape information (unknown rank).
    pub fn untyped_shape(name: &str, elem_type: i32) -> Self {
        ValueInfoProto {
            name: name.to_string(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type, shape: None })),
            }),
        }
    }

    /// A static-shaped float tensor value.
    pub fn f32(name: &str, dims: &[i64]) -> Self {
        let dims: Vec<Dim> = dims.iter().map(|&d| Dim::Value(d)).collect();
        Self::tensor(name, data_type::FLOAT, &dims)
    }
}

impl TensorProto {
    /// A float tensor with data in `raw_data` (little-endian).
    pub fn f32(name: &str, dims: &[i64], values: &[f32]) -> Self {
        TensorProto {
            name: name.to_string(),
            dims: dims.to_vec(),
            data_type: data_type::FLOAT,
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ..Default::default()
        }
    }

    /// An int64 tensor with data in `raw_data` (little-endian).
    pub fn i64(name: &str, dims: &[i64], values: &[i64]) -> Self {
        TensorProto {
            name: name.to_string(),
            dims: dims.to_vec(),
            data_type: data_type::INT64,
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ..Default::default()
        }
    }

    /// A tensor with dims and type but no data, as the shared models store their large weights.
    pub fn shape_only(name: &str, data_type: i32, dims: &[i64]) -> Self {
        TensorProto { name: name.to_string(), dims: dims.to_vec(), data_type, ..Default::default() }
    }
}

impl AttributeProto {
    fn named(name: &str, ty: AttributeType) -> Self {
        AttributeProto { name: name.to_string(), r#type: ty as i32, ..Default::default() }
    }

    /// An INT attribute.
    pub fn int(name: &str, v: i64) -> Self {
        AttributeProto { i: Some(v), ..Self::named(name, AttributeType::Int) }
    }

    /// A FLOAT attribute.
    pub fn float(name: &str, v: f32) -> Self {
        AttributeProto { f: Some(v), ..Self::named(name, AttributeType::Float) }
    }

    /// A STRING attribute.
    pub fn string(name: &str, v: &str) -> Self {
        AttributeProto { s: Some(v.as_bytes().to_vec()), ..Self::named(name, AttributeType::String) }
    }

    /// An INTS attribute.
    pub fn ints(name: &str, v: &[i64]) -> Self {
        AttributeProto { ints: v.to_vec(), ..Self::named(name, AttributeType::Ints) }
    }

    /// A FLOATS attribute.
    pub fn floats(name: &str, v: &[f32]) -> Self {
        AttributeProto { floats: v.to_vec(), ..Self::named(name, AttributeType::Floats) }
    }

    /// A TENSOR attribute.
    pub fn tensor(name: &str, t: TensorProto) -> Self {
        AttributeProto { t: Some(t), ..Self::named(name, AttributeType::Tensor) }
    }
}

impl NodeProto {
    /// A default-domain node.
    pub fn new(op_type: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> Self {
        NodeProto {
            op_type: op_type.to_string(),
            name: name.to_string(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// The same node with `attrs` appended.
    pub fn with_attrs(mut self, attrs: Vec<AttributeProto>) -> Self {
        self.attribute.extend(attrs);
        self
    }
}

impl GraphProto {
    /// A graph from its parts (name "test").
    pub fn build(
        node: Vec<NodeProto>,
        input: Vec<ValueInfoProto>,
        output: Vec<ValueInfoProto>,
        initializer: Vec<TensorProto>,
    ) -> Self {
        GraphProto { node, name: "test".to_string(), initializer, input, output, ..Default::default() }
    }
}

impl ModelProto {
    /// A model of IR version 8 importing the default domain at `opset`.
    pub fn with_graph(opset: i64, graph: GraphProto) -> Self {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto { domain: String::new(), version: opset }],
            producer_name: "graph-onnx-tests".to_string(),
            graph: Some(graph),
            ..Default::default()
        }
    }
}

/// Counts of each `(domain, op_type)` and the attribute names seen with it: the op inventory of a model.
pub fn op_inventory(graph: &GraphProto) -> HashMap<(String, String), (usize, Vec<String>)> {
    let mut out: HashMap<(String, String), (usize, Vec<String>)> = HashMap::new();
    for node in &graph.node {
        let entry = out.entry((node.domain.clone(), node.op_type.clone())).or_default();
        entry.0 += 1;
        for a in &node.attribute {
            if !entry.1.contains(&a.name) {
                entry.1.push(a.name.clone());
            }
        }
    }
    out
}
