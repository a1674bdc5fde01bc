//! The built-in op set. Semantics are those of the same-named ONNX operator (numpy broadcasting, batched MatMul,
//! NCHW Conv, ...), so that the simulator, the CUDA kernels and the ONNX importer share one contract.
//!
//! Inputs that ONNX passes as constant tensors (Reshape's shape, Slice's starts, Pad's pads, Clip's bounds,
//! Reduce axes, Split sizes) are attributes here: shapes are static, and the importer folds them.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::DType;

/// Fusion-relevant class of an op (DESIGN.md section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OpCategory {
    /// Pointwise maths with broadcasting: one output element from the same index of each (broadcast) input.
    Elementwise,
    /// No kernel: the output aliases the input's bytes (Reshape, Flatten, Squeeze, Unsqueeze, Identity).
    View,
    /// Moves or gathers elements without arithmetic (Transpose, Slice, Concat, Gather, Expand, Pad, Split).
    DataMovement,
    /// Reduces along axes (ReduceSum/Mean/Max, Softmax, LayerNormalization, GlobalAveragePool).
    Reduction,
    /// Compute-heavy anchors that accept fused epilogues (MatMul, Gemm, Conv, pools).
    Anchor,
    /// Host <-> device transfer.
    Copy,
    /// A user-supplied CUDA kernel.
    Custom,
}

/// Gelu's formulation (ONNX Gelu-20 `approximate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeluApprox {
    /// `0.5 x (1 + erf(x / sqrt 2))`.
    #[default]
    None,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Tanh,
}

/// Pad's mode (ONNX Pad).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadMode {
    /// Fill with a constant value.
    #[default]
    Constant,
    /// Mirror without repeating the edge.
    Reflect,
    /// Repeat the edge value.
    Edge,
}

/// Where a Memcpy moves its tensor to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemSpace {
    /// Host (pinned) memory.
    Host,
    /// Device memory.
    Device,
}

/// Attributes of Conv (ONNX Conv with explicit pads; `auto_pad` is resolved by the importer).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConvAttrs {
    /// Stride per spatial axis (empty: all 1).
    pub strides: Vec<usize>,
    /// Begin pads for every spatial axis followed by end pads (empty: all 0).
    pub pads: Vec<usize>,
    /// Dilation per spatial axis (empty: all 1).
    pub dilations: Vec<usize>,
    /// Number of groups (0 is read as 1).
    pub group: usize,
}

/// Attributes of MaxPool and AveragePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolAttrs {
    /// Window extent per spatial axis (required).
    pub kernel_shape: Vec<usize>,
    /// Stride per spatial axis (empty: all 1).
    pub strides: Vec<usize>,
    /// Begin pads then end pads (empty: all 0).
    pub pads: Vec<usize>,
    /// Dilation per spatial axis (empty: all 1).
    pub dilations: Vec<usize>,
    /// Round output extents up instead of down.
    pub ceil_mode: bool,
    /// AveragePool only: count padded elements in the divisor.
    pub count_include_pad: bool,
}

/// A user-supplied CUDA kernel with declared outputs and cost hints. The simulator runs it only when a CPU
/// closure is registered for `entry`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomOp {
    /// CUDA C source defining `entry` as an `extern "C" __global__` function.
    pub source: String,
    /// The entry point's name.
    pub entry: String,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    #[serde(default)]
    pub shared_mem_bytes: u32,
    /// The outputs it writes: dtype and shape of each (custom kernels have no shape inference).
    pub outputs: Vec<TensorSpec>,
    /// Floating-point operations per launch (cost hint).
    #[serde(default)]
    pub flops: u64,
    /// Bytes read per launch; `None`: the inputs' sizes.
    #[serde(default)]
    pub bytes_read: Option<u64>,
    /// Bytes written per launch; `None`: the outputs' sizes.
    #[serde(default)]
    pub bytes_written: Option<u64>,
}

/// A dtype and a shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: crate::Shape,
}

/// A built-in op with its attributes. Input order is ONNX's (e.g. Conv: X, W, optional B;
/// BatchNormalization: X, scale, B, mean, var; Where: condition, X, Y).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Op {
    // ---- elementwise, unary ----
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `1 / x`.
    Reciprocal,
    /// `max(x, 0)`.
    Relu,
    /// `x < 0 ? alpha x : x`.
    LeakyRelu {
        /// Slope for negative inputs.
        #[serde(default = "d_leaky")]
        alpha: f32,
    },
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// Gauss error function.
    Erf,
    /// Gaussian error linear unit.
    Gelu {
        /// Exact (erf) or tanh approximation.
        #[serde(default)]
        approximate: GeluApprox,
    },
    /// `x * sigmoid(x)`.
    Silu,
    /// `x * max(0, min(1, x/6 + 1/2))`.
    HardSwish,
    /// `max(0, min(1, alpha x + beta))`.
    HardSigmoid {
        /// Slope.
        #[serde(default = "d_hsig_alpha")]
        alpha: f32,
        /// Offset.
        #[serde(default = "d_half")]
        beta: f32,
    },
    /// Round towards negative infinity.
    Floor,
    /// Round towards positive infinity.
    Ceil,
    /// Logical not (bool).
    Not,
    /// `min(max(x, min), max)`; a missing bound does not clamp.
    Clip {
        /// Lower bound.
        #[serde(default)]
        min: Option<f32>,
        /// Upper bound.
        #[serde(default)]
        max: Option<f32>,
    },
    /// Convert to another dtype (ONNX Cast: float to int truncates toward zero, to bool is `x != 0`).
    Cast {
        /// Target dtype.
        to: DType,
    },
    // ---- elementwise, binary (numpy broadcasting) ----
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (integer division truncates).
    Div,
    /// `a ^ b`.
    Pow,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
    /// `a == b` (bool output).
    Equal,
    /// `a < b` (bool output).
    Less,
    /// `a <= b` (bool output).
    LessOrEqual,
    /// `a > b` (bool output).
    Greater,
    /// `a >= b` (bool output).
    GreaterOrEqual,
    /// Logical and (bool).
    And,
    /// Logical or (bool).
    Or,
    /// `cond ? x : y` with three-way broadcasting.
    Where,
    // ---- anchors ----
    /// Numpy matmul: batched, broadcasting batch dims, 1-D operands promoted and squeezed.
    MatMul,
    /// `alpha * op(A) op(B) + beta * C`, A and B 2-D, C unidirectionally broadcast to (M, N).
    Gemm {
        /// Scale of the product.
        #[serde(default = "d_one")]
        alpha: f32,
        /// Scale of C.
        #[serde(default = "d_one")]
        beta: f32,
        /// Transpose A.
        #[serde(default)]
        trans_a: bool,
        /// Transpose B.
        #[serde(default)]
        trans_b: bool,
    },
    /// N-D convolution, NC(spatial) layout, weights (M, C/group, k...), optional bias (M).
    Conv(ConvAttrs),
    /// Max pooling.
    MaxPool(PoolAttrs),
    /// Average pooling.
    AveragePool(PoolAttrs),
    // ---- reductions ----
    /// Mean over all spatial axes, keeping them as 1.
    GlobalAveragePool,
    /// Inference batch normalization: `(x - mean) / sqrt(var + epsilon) * scale + B`, per channel (axis 1).
    BatchNormalization {
        /// Added to the variance.
        #[serde(default = "d_eps")]
        epsilon: f32,
    },
    /// Sum over `axes` (`None`: all axes).
    ReduceSum {
        /// Axes to reduce (negative counts from the end); `None` reduces all.
        #[serde(default)]
        axes: Option<Vec<i64>>,
        /// Keep reduced axes as extent 1.
        #[serde(default = "d_true")]
        keepdims: bool,
    },
    /// Mean over `axes`.
    ReduceMean {
        /// Axes to reduce; `None` reduces all.
        #[serde(default)]
        axes: Option<Vec<i64>>,
        /// Keep reduced axes as extent 1.
        #[serde(default = "d_true")]
        keepdims: bool,
    },
    /// Maximum over `axes`.
    ReduceMax {
        /// Axes to reduce; `None` reduces all.
        #[serde(default)]
        axes: Option<Vec<i64>>,
        /// Keep reduced axes as extent 1.
        #[serde(default = "d_true")]
        keepdims: bool,
    },
    /// Softmax along one axis (ONNX opset 13 semantics).
    Softmax {
        /// The axis (negative counts from the end).
        #[serde(default = "d_minus_one")]
        axis: i64,
    },
    /// Normalise over axes `axis..rank`, then scale (and optional bias).
    LayerNormalization {
        /// First normalised axis.
        #[serde(default = "d_minus_one")]
        axis: i64,
        /// Added to the variance.
        #[serde(default = "d_eps")]
        epsilon: f32,
    },
    // ---- views ----
    /// New shape over the same bytes; `0` copies the input extent (unless `allowzero`), `-1` is inferred.
    Reshape {
        /// Target shape.
        shape: Vec<i64>,
        /// Treat 0 as a real zero extent.
        #[serde(default)]
        allowzero: bool,
    },
    /// To 2-D: axes before `axis` form the rows.
    Flatten {
        /// Split point (negative counts from the end).
        #[serde(default = "d_one_i")]
        axis: i64,
    },
    /// Remove extent-1 axes (`None`: all of them).
    Squeeze {
        /// Axes to remove.
        #[serde(default)]
        axes: Option<Vec<i64>>,
    },
    /// Insert extent-1 axes at the given output positions.
    Unsqueeze {
        /// Positions in the output.
        axes: Vec<i64>,
    },
    /// The input, unchanged.
    Identity,
    // ---- data movement ----
    /// Permute axes (`None`: reverse them).
    Transpose {
        /// Output axis i takes input axis `perm[i]`.
        #[serde(default)]
        perm: Option<Vec<usize>>,
    },
    /// ONNX Slice with clamped starts/ends and non-zero steps.
    Slice {
        /// Start per listed axis.
        starts: Vec<i64>,
        /// End (exclusive) per listed axis.
        ends: Vec<i64>,
        /// Axes (`None`: 0..starts.len()).
        #[serde(default)]
        axes: Option<Vec<i64>>,
        /// Steps (`None`: all 1).
        #[serde(default)]
        steps: Option<Vec<i64>>,
    },
    /// Join inputs along `axis`.
    Concat {
        /// The axis.
        axis: i64,
    },
    /// Index `data` along `axis` with an integer tensor (negative indices count from the end).
    Gather {
        /// The axis.
        #[serde(default)]
        axis: i64,
    },
    /// Broadcast the input against `shape` (bidirectional, as ONNX Expand).
    Expand {
        /// Target shape.
        shape: Vec<i64>,
    },
    /// Pad (or crop, with negative pads) each axis: begins for every axis, then ends.
    Pad {
        /// Begin pads then end pads, `2 * rank` values.
        pads: Vec<i64>,
        /// Fill mode.
        #[serde(default)]
        mode: PadMode,
        /// Fill value for `constant`.
        #[serde(default)]
        value: f32,
    },
    /// Split along `axis` into pieces of the given extents, one output each.
    Split {
        /// The axis.
        axis: i64,
        /// Extent of each output along `axis`; they sum to the input extent.
        splits: Vec<usize>,
    },
    // ---- other ----
    /// Copy between host and device memory.
    Memcpy {
        /// Destination memory space.
        to: MemSpace,
    },
    /// A user CUDA kernel.
    Custom(CustomOp),
}

impl Op {
    /// The op's category, which drives fusion.
    pub fn category(&self) -> OpCategory {
        use Op::*;
        match self {
            Neg
            | Abs
            | Exp
            | Log
            | Sqrt
            | Reciprocal
            | Relu
            | LeakyRelu { .. }
            | Sigmoid
            | Tanh
            | Erf
            | Gelu { .. }
            | Silu
            | HardSwish
            | HardSigmoid { .. }
            | Floor
            | Ceil
            | Not
            | Clip { .. }
            | Cast { .. }
            | Add
            | Sub
            | Mul
            | Div
            | Pow
            | Max
            | Min
            | Equal
            | Less
            | LessOrEqual
            | Greater
            | GreaterOrEqual
            | And
            | Or
            | Where
            | BatchNormalization { .. } => OpCategory::Elementwise,
            MatMul | Gemm { .. } | Conv(_) | MaxPool(_) | AveragePool(_) => OpCategory::Anchor,
            GlobalAveragePool
            | ReduceSum { .. }
            | ReduceMean { .. }
            | ReduceMax { .. }
            | Softmax { .. }
            | LayerNormalization { .. } => OpCategory::Reduction,
            Reshape { .. } | Flatten { .. } | Squeeze { .. } | Unsqueeze { .. } | Identity => OpCategory::View,
            Transpose { .. }
            | Slice { .. }
            | Concat { .. }
            | Gather { .. }
            | Expand { .. }
            | Pad { .. }
            | Split { .. } => OpCategory::DataMovement,
            Memcpy { .. } => OpCategory::Copy,
            Custom(_) => OpCategory::Custom,
        }
    }

    /// Every op's name ([`Op::name`]), for options that name ops by type (e.g. `--keep-f32`).
    pub const NAMES: [&'static str; 61] = [
        "Neg",
        "Abs",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Relu",
        "LeakyRelu",
        "Sigmoid",
        "Tanh",
        "Erf",
        "Gelu",
        "Silu",
        "HardSwish",
        "HardSigmoid",
        "Floor",
        "Ceil",
        "Not",
        "Clip",
        "Cast",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Max",
        "Min",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "And",
        "Or",
        "Where",
        "MatMul",
        "Gemm",
        "Conv",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "BatchNormalization",
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "Softmax",
        "LayerNormalization",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Identity",
        "Transpose",
        "Slice",
        "Concat",
        "Gather",
        "Expand",
        "Pad",
        "Split",
        "Memcpy",
        "Custom",
    ];

    /// The op's name as in ONNX (`"Conv"`, `"Add"`, ...).
    pub fn name(&self) -> &'static str {
        use Op::*;
        match self {
            Neg => "Neg",
            Abs => "Abs",
            Exp => "Exp",
            Log => "Log",
            Sqrt => "Sqrt",
            Reciprocal => "Reciprocal",
            Relu => "Relu",
            LeakyRelu { .. } => "LeakyRelu",
            Sigmoid => "Sigmoid",
            Tanh => "Tanh",
            Erf => "Erf",
            Gelu { .. } => "Gelu",
            Silu => "Silu",
            HardSwish => "HardSwish",
            HardSigmoid { .. } => "HardSigmoid",
            Floor => "Floor",
            Ceil => "Ceil",
            Not => "Not",
            Clip { .. } => "Clip",
            Cast { .. } => "Cast",
            Add => "Add",
            Sub => "Sub",
            Mul => "Mul",
            Div => "Div",
            Pow => "Pow",
            Max => "Max",
            Min => "Min",
            Equal => "Equal",
            Less => "Less",
            LessOrEqual => "LessOrEqual",
            Greater => "Greater",
            GreaterOrEqual => "GreaterOrEqual",
            And => "And",
            Or => "Or",
            Where => "Where",
            MatMul => "MatMul",
            Gemm { .. } => "Gemm",
            Conv(_) => "Conv",
            MaxPool(_) => "MaxPool",
            AveragePool(_) => "AveragePool",
            GlobalAveragePool => "GlobalAveragePool",
            BatchNormalization { .. } => "BatchNormalization",
            ReduceSum { .. } => "ReduceSum",
            ReduceMean { .. } => "ReduceMean",
            ReduceMax { .. } => "ReduceMax",
            Softmax { .. } => "Softmax",
            LayerNormalization { .. } => "LayerNormalization",
            Reshape { .. } => "Reshape",
            Flatten { .. } => "Flatten",
            Squeeze { .. } => "Squeeze",
            Unsqueeze { .. } => "Unsqueeze",
            Identity => "Identity",
            Transpose { .. } => "Transpose",
            Slice { .. } => "Slice",
            Concat { .. } => "Concat",
            Gather { .. } => "Gather",
            Expand { .. } => "Expand",
            Pad { .. } => "Pad",
            Split { .. } => "Split",
            Memcpy { .. } => "Memcpy",
            Custom(_) => "Custom",
        }
    }

    /// True for ops that produce no kernel: the output aliases the input's bytes.
    pub fn is_view(&self) -> bool {
        self.category() == OpCategory::View
    }

    /// Whether a node of this op may store another float dtype than its operands and read operands of differing
    /// float dtypes ([`crate::Node::store`]): elementwise ops (Cast aside: its dtype is its attribute) and
    /// reductions, which every backend computes in f32 anyway. Anchors (cuBLAS takes one operand type), data
    /// movement and views (they move elements or bytes as they are) cannot.
    pub fn stores_mixed(&self) -> bool {
        matches!(self.category(), OpCategory::Elementwise | OpCategory::Reduction) && !matches!(self, Op::Cast { .. })
    }

    /// True for unary elementwise ops (one input).
    pub fn is_unary(&self) -> bool {
        self.category() == OpCategory::Elementwise && self.arity() == Arity::Exact(1)
    }

    /// How many inputs the op takes.
    pub fn arity(&self) -> Arity {
        use Op::*;
        match self {
            Add
            | Sub
            | Mul
            | Div
            | Pow
            | Max
            | Min
            | Equal
            | Less
            | LessOrEqual
            | Greater
            | GreaterOrEqual
            | And
            | Or
            | MatMul
            | Gather { .. } => Arity::Exact(2),
            Where => Arity::Exact(3),
            Gemm { .. } => Arity::Range(2, 3),
            Conv(_) => Arity::Range(2, 3),
            LayerNormalization { .. } => Arity::Range(2, 3),
            BatchNormalization { .. } => Arity::Exact(5),
            Concat { .. } => Arity::AtLeast(1),
            Custom(_) => Arity::AtLeast(0),
            _ => Arity::Exact(1),
        }
    }

    /// How many outputs the op produces.
    pub fn num_outputs(&self) -> usize {
        match self {
            Op::Split { splits, .. } => splits.len(),
            Op::Custom(c) => c.outputs.len(),
            _ => 1,
        }
    }
}

/// The number of inputs an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly n.
    Exact(usize),
    /// Between lo and hi inclusive.
    Range(usize, usize),
    /// n or more.
    AtLeast(usize),
}

impl Arity {
    /// True when `n` inputs are acceptable.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::Range(lo, hi) => (lo..=hi).contains(&n),
            Arity::AtLeast(k) => n >= k,
        }
    }
}

impl fmt::Display for Arity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arity::Exact(k) => write!(f, "{k}"),
            Arity::Range(lo, hi) => write!(f, "{lo} to {hi}"),
            Arity::AtLeast(k) => write!(f, "at least {k}"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn d_one() -> f32 {
    1.0
}
fn d_half() -> f32 {
    0.5
}
fn d_hsig_alpha() -> f32 {
    0.2
}
fn d_leaky() -> f32 {
    0.01
}
fn d_eps() -> f32 {
    1e-5
}
fn d_true() -> bool {
    true
}
fn d_minus_one() -> i64 {
    -1
}
fn d_one_i() -> i64 {
    1
}
