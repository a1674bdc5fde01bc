//! Op cost from shapes and dtypes: floating-point operations and bytes read and written, the inputs of the
//! roofline timing model (DESIGN.md section 5). Views cost nothing.

use serde::{Deserialize, Serialize};

use crate::op::{Op, OpCategory};
use crate::{DType, Shape, TensorSpec};

/// What one op costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCost {
    /// Arithmetic operations (a multiply-add counts 2).
    pub flops: u64,
    /// Bytes read from device memory.
    pub bytes_read: u64,
    /// Bytes written to device memory.
    pub bytes_written: u64,
}

impl std::ops::Add for OpCost {
    type Output = OpCost;

    /// Component-wise saturating sum.
    fn add(self, o: OpCost) -> OpCost {
        OpCost {
            flops: self.flops.saturating_add(o.flops),
            bytes_read: self.bytes_read.saturating_add(o.bytes_read),
            bytes_written: self.bytes_written.saturating_add(o.bytes_written),
        }
    }
}

impl OpCost {
    /// Bytes moved (read plus written).
    pub fn bytes(&self) -> u64 {
        self.bytes_read.saturating_add(self.bytes_written)
    }
}

/// The operands of an op as `op_cost` reads them: how many, and each one's dtype and shape, borrowed. Lets a
/// caller that holds tensors in a graph cost a node without copying their shapes into `TensorSpec`s.
pub trait Operands {
    /// Number of operands.
    fn count(&self) -> usize;
    /// Dtype and shape of operand `i` (`i < count()`).
    fn operand(&self, i: usize) -> (DType, &Shape);
}

impl Operands for [TensorSpec] {
    fn count(&self) -> usize {
        self.len()
    }
    fn operand(&self, i: usize) -> (DType, &Shape) {
        (self[i].dtype, &self[i].shape)
    }
}

fn numel(s: &Shape) -> u64 {
    s.numel().unwrap_or(usize::MAX) as u64
}

/// The bytes `op` reads of its operand `i` (`operand_bytes` in all) when it writes `output_bytes`: a Gather's
/// data operand and a Slice's input are read only where the result picks them (an embedding lookup reads a few
/// rows of its table, not the table), so at most the result's bytes; every other operand whole. The one rule
/// for node costs and for fused groups (`graph_passes::estimate`).
pub fn operand_read_bytes(op: &Op, i: usize, operand_bytes: u64, output_bytes: u64) -> u64 {
    match op {
        Op::Gather { .. } | Op::Slice { .. } if i == 0 => operand_bytes.min(output_bytes),
        _ => operand_bytes,
    }
}

fn sum_bytes<T: Operands + ?Sized>(ts: &T) -> u64 {
    (0..ts.count())
        .map(|i| {
            let (d, s) = ts.operand(i);
            s.byte_size(d).unwrap_or(usize::MAX) as u64
        })
        .fold(0u64, u64::saturating_add)
}

fn first_numel<T: Operands + ?Sized>(ts: &T) -> u64 {
    if ts.count() == 0 {
        0
    } else {
        numel(ts.operand(0).1)
    }
}

/// Arithmetic operations per output element of an elementwise op (transcendentals count a few).
pub fn elementwise_flops_per_element(op: &Op) -> u64 {
    use Op::*;
    match op {
        Cast { .. }
        | Neg
        | Abs
        | Relu
        | Not
        | Floor
        | Ceil
        | Add
        | Sub
        | Mul
        | Max
        | Min
        | Equal
        | Less
        | LessOrEqual
        | Greater
        | GreaterOrEqual
        | And
        | Or
        | Where => 1,
        LeakyRelu { .. } | Clip { .. } | Div | Reciprocal => 2,
        HardSigmoid { .. } | HardSwish => 4,
        Exp | Log | Sqrt | Sigmoid | Tanh | Erf | Pow => 8,
        Silu => 10,
        Gelu { .. } => 16,
        BatchNormalization { .. } => 4,
        _ => 1,
    }
}

/// The cost of `op` given its input and output specs.
pub fn op_cost(op: &Op, inputs: &[TensorSpec], outputs: &[TensorSpec]) -> OpCost {
    op_cost_of(op, inputs, outputs)
}

/// The cost of `op` given its operands, however the caller holds them (`op_cost` for owned specs).
pub fn op_cost_of<I: Operands + ?Sized, O: Operands + ?Sized>(op: &Op, inputs: &I, outputs: &O) -> OpCost {
    let written = sum_bytes(outputs);
    let read = (0..inputs.count())
        .map(|i| {
            let (d, s) = inputs.operand(i);
            operand_read_bytes(op, i, s.byte_size(d).unwrap_or(usize::MAX) as u64, written)
        })
        .fold(0u64, u64::saturating_add);
    let out0 = first_numel(outputs);
    let flops = match op.category() {
        OpCategory::View => return OpCost::default(),
        OpCategory::Elementwise => out0.saturating_mul(elementwise_flops_per_element(op)),
        OpCategory::DataMovement | OpCategory::Copy => 0,
        OpCategory::Custom => {
            if let Op::Custom(c) = op {
                return OpCost {
                    flops: c.flops,
                    bytes_read: c.bytes_read.unwrap_or(read),
                    bytes_written: c.bytes_written.unwrap_or(written),
                };
            }
            0
        }
        OpCategory::Reduction => {
            let n = first_numel(inputs);
            match op {
                Op::Softmax { .. } => n.saturating_mul(12),
                Op::LayerNormalization { .. } => n.saturating_mul(8),
                _ => n,
            }
        }
        OpCategory::Anchor => anchor_flops(op, inputs, outputs),
    };
    // A broadcast operand is read once per kernel, not once per element: count its own size.
    OpCost { flops, bytes_read: read, bytes_written: written }
}

fn anchor_flops<I: Operands + ?Sized, O: Operands + ?Sized>(op: &Op, inputs: &I, outputs: &O) -> u64 {
    if outputs.count() == 0 {
        return 0;
    }
    let on = first_numel(outputs);
    let dims = |i: usize| if i < inputs.count() { inputs.operand(i).1.dims() } else { &[] };
    match op {
        Op::MatMul => {
            let k = dims(0).last().copied().unwrap_or(1) as u64;
            on.saturating_mul(k).saturating_mul(2)
        }
        Op::Gemm { trans_a, .. } => {
            let a = dims(0);
            let k = a.get(usize::from(!*trans_a)).copied().unwrap_or(1) as u64;
            let bias = if inputs.count() > 2 { on } else { 0 };
            on.saturating_mul(k).saturating_mul(2).saturating_add(bias)
        }
        Op::Conv(_) => {
            // Per output element: C/group x kernel window multiply-adds.
            let per: u64 = dims(1).iter().skip(1).map(|&d| d as u64).fold(1u64, u64::saturating_mul);
            let bias = if inputs.count() > 2 { on } else { 0 };
            on.saturating_mul(per).saturating_mul(2).saturating_add(bias)
        }
        Op::MaxPool(a) | Op::AveragePool(a) => {
            let per: u64 = a.kernel_shape.iter().map(|&d| d as u64).fold(1u64, u64::saturating_mul);
            on.saturating_mul(per)
        }
        _ => on,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::ConvAttrs;
    use crate::{DType, Shape};

    fn t(v: &[usize]) -> TensorSpec {
        TensorSpec { dtype: DType::F32, shape: Shape::from(v) }
    }

    #[test]
    fn matmul_and_conv() {
        let c = op_cost(&Op::MatMul, &[t(&[2, 3]), t(&[3, 4])], &[t(&[2, 4])]);
        assert_eq!(c, OpCost { flops: 2 * 2 * 3 * 4, bytes_read: (6 + 12) * 4, bytes_written: 8 * 4 });
        let c = op_cost(
            &Op::Conv(ConvAttrs::default()),
            &[t(&[1, 2, 5, 5]), t(&[4, 2, 3, 3]), t(&[4])],
            &[t(&[1, 4, 3, 3])],
        );
        assert_eq!(c.flops, 36 * 2 * 9 * 2 + 36);
    }

    #[test]
    fn views_are_free_and_elementwise_counts_elements() {
        let v = op_cost(&Op::Identity, &[t(&[8])], &[t(&[8])]);
        assert_eq!(v, OpCost::default());
        let e = op_cost(&Op::Add, &[t(&[8]), t(&[1])], &[t(&[8])]);
        assert_eq!(e, OpCost { flops: 8, bytes_read: 36, bytes_written: 32 });
    }
}
