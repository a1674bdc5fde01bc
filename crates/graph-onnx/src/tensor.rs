//! Decoding `TensorProto` payloads (initializers and `Constant` values) into little-endian bytes.
//!
//! ONNX stores tensor data either in `raw_data` (little-endian, packed) or in one of the typed repeated fields,
//! whose choice depends on the data type (`int32_data` carries every integer type up to 32 bits, bool, float16
//! and bfloat16, one element per entry). We normalise both to the packed little-endian bytes the rest of
//! cuplan uses. Every size is computed with checked arithmetic and compared with the bytes actually present
//! before anything is allocated, so a hostile `dims` field can only produce an error.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};
use std::sync::Arc;

use crate::error::OnnxError;
use crate::proto::{data_location, data_type, TensorProto};

/// Size in bytes of one element of an ONNX data type we can import, or `None` for types we cannot
/// (strings, complex, sub-byte and 8-bit float types).
pub(crate) fn elem_size(code: i32) -> Option<usize> {
    Some(match code {
        data_type::FLOAT | data_type::INT32 | data_type::UINT32 => 4,
        data_type::DOUBLE | data_type::INT64 | data_type::UINT64 => 8,
        data_type::FLOAT16 | data_type::BFLOAT16 | data_type::INT16 | data_type::UINT16 => 2,
        data_type::INT8 | data_type::UINT8 | data_type::BOOL => 1,
        _ => return None,
    })
}

/// Number of elements of `dims`, or an error naming `tensor` when a dimension is negative or the product
/// overflows. A scalar (no dims) has one element.
pub(crate) fn checked_numel(tensor: &str, dims: &[i64]) -> Result<usize, OnnxError> {
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d)
            .map_err(|_| OnnxError::NegativeDim { tensor: tensor.to_string(), dims: dims.to_vec() })?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| OnnxError::SizeOverflow { tensor: tensor.to_string(), dims: dims.to_vec() })?;
    }
    Ok(n)
}

/// A decoded tensor payload: element type (ONNX code), dims, and packed little-endian bytes. The bytes are
/// shared, so that a weight's data is never copied after decoding (a full BERT carries 440 MB of them).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorValue {
    pub(crate) dtype: i32,
    pub(crate) dims: Vec<usize>,
    pub(crate) bytes: Arc<Vec<u8>>,
}

/// The header of a `TensorProto` after validation: its type, dims and whether it carries data.
#[derive(Debug)]
pub(crate) struct TensorHeader {
    pub(crate) dtype: i32,
    pub(crate) dims: Vec<usize>,
    pub(crate) numel: usize,
}

/// Validates a tensor's type, dims, size limit and storage; does not look at the data yet.
pub(crate) fn header(name: &str, t: &TensorProto, max_tensor_bytes: u64) -> Result<TensorHeader, OnnxError> {
    if t.data_location != data_location::DEFAULT && t.data_location != data_location::EXTERNAL {
        return Err(OnnxError::MalformedTensor {
            tensor: name.to_string(),
            problem: format!("unknown data_location {}", t.data_location),
        });
    }
    if t.segment.is_some() {
        return Err(OnnxError::MalformedTensor {
            tensor: name.to_string(),
            problem: "segmented tensors are not supported".to_string(),
        });
    }
    let size = elem_size(t.data_type).ok_or_else(|| OnnxError::UnsupportedDtype {
        tensor: name.to_string(),
        dtype: data_type::name(t.data_type),
        code: t.data_type,
    })?;
    let numel = checked_numel(name, &t.dims)?;
    let bytes = (numel as u64).checked_mul(size as u64);
    match bytes {
        Some(b) if b <= max_tensor_bytes => {}
        _ => {
            return Err(OnnxError::TensorTooLarge {
                tensor: name.to_string(),
                dims: t.dims.clone(),
                limit: max_tensor_bytes,
            })
        }
    }
    // Each dim fits in usize because the product does.
    let dims = t.dims.iter().map(|&d| d as usize).collect();
    Ok(TensorHeader { dtype: t.data_type, dims, numel })
}

/// Which field holds the data, and how many entries it has.
fn present_data(t: &TensorProto) -> Vec<(&'static str, usize)> {
    let mut v = Vec::new();
    if !t.raw_data.is_empty() {
        v.push(("raw_data", t.raw_data.len()));
    }
    if !t.float_data.is_empty() {
        v.push(("float_data", t.float_data.len()));
    }
    if !t.int32_data.is_empty() {
        v.push(("int32_data", t.int32_data.len()));
    }
    if !t.int64_data.is_empty() {
        v.push(("int64_data", t.int64_data.len()));
    }
    if !t.double_data.is_empty() {
        v.push(("double_data", t.double_data.len()));
    }
    if !t.uint64_data.is_empty() {
        v.push(("uint64_data", t.uint64_data.len()));
    }
    if !t.string_data.is_empty() {
        v.push(("string_data", t.string_data.len()));
    }
    v
}

/// Decodes a tensor's data, moving `raw_data` out rather than copying it. `Ok(None)` when the tensor has no
/// data at all (a stripped weight); an error when the data is in the wrong field or its length disagrees
/// with the dims. External data is an error here (no folder to read it from): see [`decode_in`].
#[cfg(test)]
pub(crate) fn decode(
    name: &str,
    t: TensorProto,
    max_tensor_bytes: u64,
) -> Result<(TensorHeader, Option<Vec<u8>>), OnnxError> {
    decode_in(name, t, max_tensor_bytes, None)
}

/// [`decode`], reading external data (`data_location = EXTERNAL`) from files in `dir`, the model's folder.
pub(crate) fn decode_in(
    name: &str,
    mut t: TensorProto,
    max_tensor_bytes: u64,
    dir: Option<&Path>,
) -> Result<(TensorHeader, Option<Vec<u8>>), OnnxError> {
    let t = &mut t;
    let h = header(name, t, max_tensor_bytes)?;
    if t.data_location == data_location::EXTERNAL || !t.external_data.is_empty() {
        if !present_data(t).is_empty() {
            return Err(OnnxError::MalformedTensor {
                tensor: name.to_string(),
                problem: "data both inline and external".to_string(),
            });
        }
        let data = read_external(name, t, &h, dir)?;
        return Ok((h, Some(data)));
    }
    let present = present_data(t);
    let Some(&(field, len)) = present.first() else {
        // An empty tensor's data is trivially present.
        return Ok(if h.numel == 0 { (h, Some(Vec::new())) } else { (h, None) });
    };
    let malformed = |problem: String| OnnxError::MalformedTensor { tensor: name.to_string(), problem };
    if present.len() > 1 {
        return Err(malformed(format!(
            "data in more than one field ({})",
            present.iter().map(|(f, _)| *f).collect::<Vec<_>>().join(", ")
        )));
    }
    // Safe: header() accepted the dtype.
    let size = elem_size(h.dtype).unwrap_or(1);
    if field == "raw_data" {
        let expected = h.numel * size;
        if len != expected {
            return Err(OnnxError::DataLength {
                tensor: name.to_string(),
                field,
                expected: expected as u64,
                actual: len as u64,
            });
        }
        return Ok((h, Some(std::mem::take(&mut t.raw_data))));
    }
    let expected_field = match h.dtype {
        data_type::FLOAT => "float_data",
        data_type::DOUBLE => "double_data",
        data_type::INT64 => "int64_data",
        data_type::UINT32 | data_type::UINT64 => "uint64_data",
        _ => "int32_data",
    };
    if field != expected_field {
        return Err(malformed(format!(
            "{} data stored in {field}, expected {expected_field} or raw_data",
            data_type::name(h.dtype)
        )));
    }
    if len != h.numel {
        return Err(OnnxError::DataLength {
            tensor: name.to_string(),
            field,
            expected: h.numel as u64,
            actual: len as u64,
        });
    }
    let mut out = Vec::with_capacity(h.numel * size);
    match h.dtype {
        data_type::FLOAT => t.float_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        data_type::DOUBLE => t.double_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        data_type::INT64 => t.int64_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        data_type::UINT64 => t.uint64_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        // uint32 values travel in uint64_data; the truncation keeps the low 32 bits, which hold the value.
        data_type::UINT32 => t.uint64_data.iter().for_each(|&v| out.extend_from_slice(&(v as u32).to_le_bytes())),
        // Everything else travels one element per int32 entry: keep the low `size` bytes (for float16 and
        // bfloat16 that is the bit pattern; for bool, int8, uint8 the value).
        _ => t.int32_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()[..size])),
    }
    Ok((h, Some(out)))
}

/// Reads an external tensor's bytes: `location` (a relative path inside `dir`, the model's folder),
/// `offset` (default 0) and `length` (default: what the dims need) from its `external_data` entries. The
/// range is checked against the file's size before anything is allocated, and exactly `length` bytes are
/// read (positioned reads rather than a memory map: the bytes end in an owned buffer either way, and a map
/// would need `unsafe`, which the workspace denies). Every problem is an [`OnnxError::ExternalData`] naming
/// the tensor.
fn read_external(name: &str, t: &TensorProto, h: &TensorHeader, dir: Option<&Path>) -> Result<Vec<u8>, OnnxError> {
    let entry = |key: &str| t.external_data.iter().find(|e| e.key == key).map(|e| e.value.as_str());
    let location = entry("location").unwrap_or("").to_string();
    let fail =
        |problem: String| OnnxError::ExternalData { tensor: name.to_string(), location: location.clone(), problem };
    if location.is_empty() {
        return Err(fail("the tensor has no 'location' entry".to_string()));
    }
    let Some(dir) = dir else {
        return Err(fail("the model was not loaded from a file, so there is no folder to read it from".to_string()));
    };
    // Only plain relative paths below the model's folder: no root, no prefix, no `..`.
    let rel = Path::new(&location);
    if !rel.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(fail("the path leaves the model's folder".to_string()));
    }
    let path = dir.join(rel);
    // A symbolic link inside the folder may still point outside it.
    let (Ok(real_dir), Ok(real)) = (dir.canonicalize(), path.canonicalize()) else {
        return Err(fail(format!("cannot open '{}': no such file", path.display())));
    };
    if !real.starts_with(&real_dir) {
        return Err(fail("the path leaves the model's folder".to_string()));
    }
    let number = |key: &str| -> Result<Option<u64>, OnnxError> {
        entry(key)
            .map(|v| v.trim().parse::<u64>().map_err(|_| fail(format!("'{key}' {v:?} is not a non-negative integer"))))
            .transpose()
    };
    let offset = number("offset")?.unwrap_or(0);
    let size = elem_size(h.dtype).unwrap_or(1) as u64;
    let expected = h.numel as u64 * size;
    let length = number("length")?.unwrap_or(expected);
    if length != expected {
        return Err(OnnxError::DataLength {
            tensor: name.to_string(),
            field: "external data",
            expected,
            actual: length,
        });
    }
    let mut file = std::fs::File::open(&real).map_err(|e| fail(format!("cannot open '{}': {e}", path.display())))?;
    let file_len = file.metadata().map_err(|e| fail(format!("cannot read '{}': {e}", path.display())))?.len();
    let end = offset.checked_add(length).ok_or_else(|| fail(format!("offset {offset} + length {length} overflows")))?;
    if end > file_len {
        return Err(fail(format!("bytes {offset}..{end} lie past the end of '{}' ({file_len} bytes)", path.display())));
    }
    let mut out = vec![0u8; usize::try_from(length).map_err(|_| fail(format!("length {length} does not fit memory")))?];
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_exact(&mut out))
        .map_err(|e| fail(format!("cannot read '{}': {e}", path.display())))?;
    Ok(out)
}

/// Converts an IEEE half-precision bit pattern to f32.
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits >> 15) as u32) << 31;
    let exp = ((bits >> 10) & 0x1f) as u32;
    let frac = (bits & 0x3ff) as u32;
    let f = if exp == 0 {
        // Zero or subnormal: value = frac * 2^-24.
        let v = frac as f32 * f32::from_bits(0x3380_0000); // 2^-24
        return if sign != 0 { -v } else { v };
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (frac << 13)
    } else {
        sign | ((exp + 112) << 23) | (frac << 13)
    };
    f32::from_bits(f)
}

impl TensorValue {
    pub(crate) fn new(dtype: i32, dims: Vec<usize>, bytes: Vec<u8>) -> Self {
        TensorValue { dtype, dims, bytes: Arc::new(bytes) }
    }

    /// Number of elements.
    pub(crate) fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// The values as i64, for integer and bool tensors; `None` for floating-point ones.
    pub(crate) fn to_i64s(&self) -> Option<Vec<i64>> {
        let b = &self.bytes;
        let v = match self.dtype {
            data_type::INT64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            data_type::UINT64 => b
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as i64)
                .collect(),
            data_type::INT32 => {
                b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()
            }
            data_type::UINT32 => {
                b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()
            }
            data_type::INT16 => b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i64).collect(),
            data_type::UINT16 => b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as i64).collect(),
            data_type::INT8 => b.iter().map(|&x| x as i8 as i64).collect(),
            data_type::UINT8 | data_type::BOOL => b.iter().map(|&x| x as i64).collect(),
            _ => return None,
        };
        Some(v)
    }

    /// The values as f64, for every importable type.
    pub(crate) fn to_f64s(&self) -> Vec<f64> {
        let b = &self.bytes;
        match self.dtype {
            data_type::FLOAT => {
                b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
            }
            data_type::DOUBLE => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            data_type::FLOAT16 => {
                b.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64).collect()
            }
            data_type::BFLOAT16 => b
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64)
                .collect(),
            _ => self.to_i64s().unwrap_or_default().into_iter().map(|v| v as f64).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::StringStringEntryProto;

    const BIG: u64 = 1 << 40;

    #[test]
    fn raw_and_typed_fields_decode_to_the_same_bytes() {
        let raw = TensorProto::f32("w", &[2, 2], &[1.0, -2.0, 3.5, 0.0]);
        let typed = TensorProto {
            name: "w".into(),
            dims: vec![2, 2],
            data_type: data_type::FLOAT,
            float_data: vec![1.0, -2.0, 3.5, 0.0],
            ..Default::default()
        };
        let (h, a) = decode("w", raw.clone(), BIG).unwrap();
        let (_, b) = decode("w", typed.clone(), BIG).unwrap();
        assert_eq!(h.dims, vec![2, 2]);
        assert_eq!(a, b);
        assert_eq!(a.unwrap().len(), 16);
    }

    #[test]
    fn small_types_travel_in_int32_data() {
        let t = TensorProto {
            dims: vec![3],
            data_type: data_type::INT8,
            int32_data: vec![-1, 5, 127],
            ..Default::default()
        };
        let (_, b) = decode("t", t.clone(), BIG).unwrap();
        assert_eq!(b.unwrap(), vec![0xff, 5, 127]);
        let h = TensorProto {
            dims: vec![1],
            data_type: data_type::FLOAT16,
            int32_data: vec![0x3c00],
            ..Default::default()
        };
        let (_, b) = decode("h", h.clone(), BIG).unwrap();
        let v = TensorValue::new(data_type::FLOAT16, vec![1], b.unwrap());
        assert_eq!(v.to_f64s(), vec![1.0]);
    }

    #[test]
    fn f16_conversion_edges() {
        assert_eq!(f16_to_f32(0x0000), 0.0);
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn stripped_weight_has_no_data_and_empty_tensor_has_empty_data() {
        let t = TensorProto::shape_only("w", data_type::FLOAT, &[64, 3, 7, 7]);
        let (h, d) = decode("w", t.clone(), BIG).unwrap();
        assert_eq!(h.numel, 64 * 3 * 49);
        assert!(d.is_none());
        let e = TensorProto::shape_only("e", data_type::INT64, &[0]);
        assert_eq!(decode("e", e.clone(), BIG).unwrap().1, Some(vec![]));
    }

    #[test]
    fn length_mismatch_names_field_and_counts() {
        let mut t = TensorProto::f32("w", &[4], &[1.0, 2.0, 3.0, 4.0]);
        t.raw_data.pop();
        match decode("w", t.clone(), BIG) {
            Err(OnnxError::DataLength { field, expected, actual, .. }) => {
                assert_eq!((field, expected, actual), ("raw_data", 16, 15));
            }
            other => panic!("{other:?}"),
        }
        let t =
            TensorProto { dims: vec![3], data_type: data_type::INT64, int64_data: vec![1, 2], ..Default::default() };
        assert!(matches!(decode("t", t.clone(), BIG), Err(OnnxError::DataLength { expected: 3, actual: 2, .. })));
    }

    #[test]
    fn huge_dims_are_errors_not_allocations() {
        let t = TensorProto::shape_only("w", data_type::FLOAT, &[1_000_000_000; 3]);
        assert!(matches!(decode("w", t.clone(), BIG), Err(OnnxError::SizeOverflow { .. })));
        let t = TensorProto::f32("w", &[1_000_000_000, 1_000_000_000], &[1.0]);
        assert!(matches!(decode("w", t.clone(), BIG), Err(OnnxError::TensorTooLarge { .. })));
        let t = TensorProto::f32("w", &[1_000_000_000], &[1.0]);
        assert!(matches!(
            decode("w", t.clone(), BIG),
            Err(OnnxError::DataLength { expected: 4_000_000_000, actual: 4, .. })
        ));
        let t = TensorProto::shape_only("w", data_type::FLOAT, &[-1]);
        assert!(matches!(decode("w", t.clone(), BIG), Err(OnnxError::NegativeDim { .. })));
    }

    #[test]
    fn external_and_unsupported_types_are_named() {
        let mut t = TensorProto::shape_only("w", data_type::FLOAT, &[4]);
        t.data_location = data_location::EXTERNAL;
        t.external_data.push(StringStringEntryProto { key: "location".into(), value: "weights.bin".into() });
        match decode("w", t.clone(), BIG) {
            Err(OnnxError::ExternalData { tensor, location, .. }) => {
                assert_eq!((tensor.as_str(), location.as_str()), ("w", "weights.bin"))
            }
            other => panic!("{other:?}"),
        }
        let t = TensorProto::shape_only("s", data_type::STRING, &[1]);
        assert!(matches!(decode("s", t.clone(), BIG), Err(OnnxError::UnsupportedDtype { dtype: "STRING", .. })));
    }

    #[test]
    fn wrong_field_for_dtype_is_rejected() {
        let t = TensorProto { dims: vec![1], data_type: data_type::INT64, float_data: vec![1.0], ..Default::default() };
        assert!(matches!(decode("t", t.clone(), BIG), Err(OnnxError::MalformedTensor { .. })));
    }
}
