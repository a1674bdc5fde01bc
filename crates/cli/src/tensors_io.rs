//! Named host tensors in safetensors files (`run --inputs/--output`) and the numpy-compatible dtype mapping.

use anyhow::{bail, Context, Result};
use graph_plan::{DType, HostTensor, Shape, TensorMap};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::path::Path;

fn to_dtype(d: Dtype, name: &str) -> Result<DType> {
    Ok(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        other => bail!("tensor '{name}': dtype {other:?} is not supported"),
    })
}

fn from_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::I8 => Dtype::I8,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

/// Read every tensor of a safetensors file.
pub fn read(path: &Path) -> Result<TensorMap> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read '{}'", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("'{}' is not a valid safetensors file", path.display()))?;
    let mut map = TensorMap::new();
    for (name, view) in st.tensors() {
        let dtype = to_dtype(view.dtype(), &name)?;
        map.insert(name, HostTensor { dtype, shape: Shape::new(view.shape().to_vec()), data: view.data().to_vec() });
    }
    Ok(map)
}

/// Write tensors to a safetensors file.
pub fn write(path: &Path, map: &TensorMap) -> Result<()> {
    let mut views = Vec::with_capacity(map.len());
    for (name, t) in map {
        let v = TensorView::new(from_dtype(t.dtype), t.shape.dims().to_vec(), &t.data)
            .with_context(|| format!("tensor '{name}' has inconsistent bytes"))?;
        views.push((name.clone(), v));
    }
    let bytes = safetensors::serialize(views, None).context("serialising safetensors")?;
    std::fs::write(path, bytes).with_context(|| format!("cannot write '{}'", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut m = TensorMap::new();
        m.insert("a".into(), HostTensor::from_f32([2, 2], &[1.0, -2.0, 3.5, 0.0]));
        m.insert("b".into(), HostTensor { dtype: DType::I64, shape: Shape::new([3]), data: (0..24).collect() });
        m.insert("c".into(), HostTensor { dtype: DType::Bool, shape: Shape::scalar(), data: vec![1] });
        let p = std::env::temp_dir().join(format!("cuplan-st-{}.safetensors", std::process::id()));
        write(&p, &m).unwrap();
        assert_eq!(read(&p).unwrap(), m);
        std::fs::write(&p, b"garbage").unwrap();
        assert!(read(&p).is_err());
        let _ = std::fs::remove_file(&p);
    }
}
