//! ONNX element types <-> graph-ir dtypes.

use graph_ir::DType;

use crate::proto::data_type;

/// The graph-ir dtype of an ONNX element type, `None` for types graph-ir lacks (double, 16/32/64-bit
/// unsigned, int16, strings, complex, 8-bit and 4-bit floats).
pub(crate) fn dtype_of(code: i32) -> Option<DType> {
    Some(match code {
        data_type::FLOAT => DType::F32,
        data_type::FLOAT16 => DType::F16,
        data_type::BFLOAT16 => DType::BF16,
        data_type::INT64 => DType::I64,
        data_type::INT32 => DType::I32,
        data_type::INT8 => DType::I8,
        data_type::UINT8 => DType::U8,
        data_type::BOOL => DType::Bool,
        _ => return None,
    })
}

/// The ONNX element type of a graph-ir dtype.
pub(crate) fn code_of(d: DType) -> i32 {
    match d {
        DType::F32 => data_type::FLOAT,
        DType::F16 => data_type::FLOAT16,
        DType::BF16 => data_type::BFLOAT16,
        DType::I64 => data_type::INT64,
        DType::I32 => data_type::INT32,
        DType::I8 => data_type::INT8,
        DType::U8 => data_type::UINT8,
        DType::Bool => data_type::BOOL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_dtype() {
        for d in DType::ALL {
            assert_eq!(dtype_of(code_of(d)), Some(d));
            assert_eq!(crate::tensor::elem_size(code_of(d)), Some(d.size_bytes()));
        }
        assert_eq!(dtype_of(data_type::DOUBLE), None);
    }
}
