//! Typed access to a node's attributes, with ONNX defaults supplied by the caller and errors naming the
//! node, operator and attribute.

use crate::error::OnnxError;
use crate::proto::{AttributeProto, AttributeType, NodeProto, TensorProto};

/// A node's attributes, checked for type on access.
pub(crate) struct Attrs<'a> {
    node: &'a NodeProto,
}

impl<'a> Attrs<'a> {
    /// Checks every attribute's type code once (so that an unknown code is reported even for attributes
    /// the op mapping never reads) and wraps the node.
    pub(crate) fn new(node: &'a NodeProto) -> Result<Self, OnnxError> {
        let a = Attrs { node };
        for attr in &node.attribute {
            a.kind(attr)?;
            if !attr.ref_attr_name.is_empty() {
                return Err(a.err(
                    &attr.name,
                    format!("refers to function attribute '{}'; only literal values are supported", attr.ref_attr_name),
                ));
            }
        }
        Ok(a)
    }

    pub(crate) fn err(&self, attr: &str, problem: impl Into<String>) -> OnnxError {
        OnnxError::Attribute {
            node: self.node.name.clone(),
            op_type: self.node.op_type.clone(),
            attr: attr.to_string(),
            problem: problem.into(),
        }
    }

    /// The attribute's effective type: its declared type, or for files that leave `type` unset the one
    /// implied by the single field that is present.
    fn kind(&self, a: &AttributeProto) -> Result<AttributeType, OnnxError> {
        if a.r#type != 0 {
            return AttributeType::try_from(a.r#type).map_err(|_| OnnxError::UnknownAttributeType {
                node: self.node.name.clone(),
                op_type: self.node.op_type.clone(),
                attr: a.name.clone(),
                code: a.r#type,
            });
        }
        let mut found = Vec::new();
        if a.f.is_some() {
            found.push(AttributeType::Float);
        }
        if a.i.is_some() {
            found.push(AttributeType::Int);
        }
        if a.s.is_some() {
            found.push(AttributeType::String);
        }
        if a.t.is_some() {
            found.push(AttributeType::Tensor);
        }
        if a.g.is_some() {
            found.push(AttributeType::Graph);
        }
        if !a.floats.is_empty() {
            found.push(AttributeType::Floats);
        }
        if !a.ints.is_empty() {
            found.push(AttributeType::Ints);
        }
        if !a.strings.is_empty() {
            found.push(AttributeType::Strings);
        }
        if !a.tensors.is_empty() {
            found.push(AttributeType::Tensors);
        }
        match found.as_slice() {
            [one] => Ok(*one),
            _ => Err(self.err(&a.name, "has no type and no single value field to infer it from")),
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.node.attribute.iter().find(|a| a.name == name)
    }

    /// The attribute if present, after checking that its type is `want`.
    fn typed(&self, name: &str, want: AttributeType) -> Result<Option<&'a AttributeProto>, OnnxError> {
        let Some(a) = self.get(name) else {
            return Ok(None);
        };
        let kind = self.kind(a)?;
        if kind != want {
            return Err(self.err(name, format!("has type {}, expected {}", kind.name(), want.name())));
        }
        Ok(Some(a))
    }

    pub(crate) fn int_opt(&self, name: &str) -> Result<Option<i64>, OnnxError> {
        match self.typed(name, AttributeType::Int)? {
            None => Ok(None),
            Some(a) => a.i.map(Some).ok_or_else(|| self.err(name, "is declared INT but has no value")),
        }
    }

    pub(crate) fn int(&self, name: &str, default: i64) -> Result<i64, OnnxError> {
        Ok(self.int_opt(name)?.unwrap_or(default))
    }

    /// An INT attribute that must be 0 or 1.
    pub(crate) fn flag(&self, name: &str, default: bool) -> Result<bool, OnnxError> {
        match self.int_opt(name)? {
            None => Ok(default),
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            Some(v) => Err(self.err(name, format!("must be 0 or 1, got {v}"))),
        }
    }

    pub(crate) fn float_opt(&self, name: &str) -> Result<Option<f32>, OnnxError> {
        match self.typed(name, AttributeType::Float)? {
            None => Ok(None),
            Some(a) => a.f.map(Some).ok_or_else(|| self.err(name, "is declared FLOAT but has no value")),
        }
    }

    pub(crate) fn float(&self, name: &str, default: f32) -> Result<f32, OnnxError> {
        Ok(self.float_opt(name)?.unwrap_or(default))
    }

    pub(crate) fn string_opt(&self, name: &str) -> Result<Option<String>, OnnxError> {
        match self.typed(name, AttributeType::String)? {
            None => Ok(None),
            Some(a) => {
                let bytes = a.s.as_ref().ok_or_else(|| self.err(name, "is declared STRING but has no value"))?;
                String::from_utf8(bytes.clone()).map(Some).map_err(|_| self.err(name, "is not valid UTF-8"))
            }
        }
    }

    pub(crate) fn string(&self, name: &str, default: &str) -> Result<String, OnnxError> {
        Ok(self.string_opt(name)?.unwrap_or_else(|| default.to_string()))
    }

    /// An INTS attribute; an INTS attribute with no entries is an empty list.
    pub(crate) fn ints_opt(&self, name: &str) -> Result<Option<Vec<i64>>, OnnxError> {
        Ok(self.typed(name, AttributeType::Ints)?.map(|a| a.ints.clone()))
    }

    pub(crate) fn floats_opt(&self, name: &str) -> Result<Option<Vec<f32>>, OnnxError> {
        Ok(self.typed(name, AttributeType::Floats)?.map(|a| a.floats.clone()))
    }

    pub(crate) fn tensor_opt(&self, name: &str) -> Result<Option<&'a TensorProto>, OnnxError> {
        match self.typed(name, AttributeType::Tensor)? {
            None => Ok(None),
            Some(a) => a.t.as_ref().map(Some).ok_or_else(|| self.err(name, "is declared TENSOR but has no value")),
        }
    }

    /// The names of all attributes present, in file order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &'a str> {
        self.node.attribute.iter().map(|a| a.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(attrs: Vec<AttributeProto>) -> NodeProto {
        NodeProto::new("Softmax", "sm", &["x"], &["y"]).with_attrs(attrs)
    }

    #[test]
    fn defaults_and_values() {
        let n = node(vec![
            AttributeProto::int("axis", -1),
            AttributeProto::float("eps", 0.5),
            AttributeProto::ints("perm", &[0, 2, 1]),
            AttributeProto::string("mode", "constant"),
        ]);
        let a = Attrs::new(&n).unwrap();
        assert_eq!(a.int("axis", 1).unwrap(), -1);
        assert_eq!(a.int("other", 7).unwrap(), 7);
        assert_eq!(a.float("eps", 1.0).unwrap(), 0.5);
        assert_eq!(a.ints_opt("perm").unwrap(), Some(vec![0, 2, 1]));
        assert_eq!(a.string("mode", "x").unwrap(), "constant");
        assert_eq!(a.names().count(), 4);
    }

    #[test]
    fn wrong_type_names_node_and_attribute() {
        let n = node(vec![AttributeProto::floats("axis", &[1.0])]);
        let a = Attrs::new(&n).unwrap();
        let e = a.int("axis", 1).unwrap_err().to_string();
        assert_eq!(e, "node 'sm' (Softmax): attribute 'axis': has type FLOATS, expected INT");
    }

    #[test]
    fn unknown_type_code_is_reported_up_front() {
        let mut bad = AttributeProto::int("axis", 1);
        bad.r#type = 99;
        let n = node(vec![bad]);
        assert!(matches!(Attrs::new(&n), Err(OnnxError::UnknownAttributeType { code: 99, .. })));
    }

    #[test]
    fn untyped_attribute_is_inferred_from_its_field() {
        let mut a = AttributeProto::int("axis", 0);
        a.r#type = 0;
        let n = node(vec![a]);
        assert_eq!(Attrs::new(&n).unwrap().int("axis", 1).unwrap(), 0);
        let n = node(vec![AttributeProto { name: "x".into(), ..Default::default() }]);
        assert!(matches!(Attrs::new(&n), Err(OnnxError::Attribute { .. })));
    }

    #[test]
    fn declared_type_without_value_is_an_error() {
        let n =
            node(vec![AttributeProto { name: "axis".into(), r#type: AttributeType::Int as i32, ..Default::default() }]);
        assert!(Attrs::new(&n).unwrap().int("axis", 1).is_err());
    }

    #[test]
    fn flag_rejects_non_boolean() {
        let n = node(vec![AttributeProto::int("keepdims", 2)]);
        assert!(Attrs::new(&n).unwrap().flag("keepdims", true).is_err());
    }
}
