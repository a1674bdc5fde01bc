//! The conformance suite every executor runs (STYLE.md habit 9): small graphs covering every built-in op, with
//! inputs and hand-computed expected outputs written in this file (small integer-valued data where possible, so
//! that exact comparison is meaningful; transcendental ops state their values to 9+ digits with a tolerance).
//!
//! `run_case` builds a plan with the given options, verifies it, prepares it on the executor, runs it and
//! compares every output: exactly when the tolerance is 0 (NaN matches NaN), else element-wise
//! `|got - want| <= tol * max(1, |want|)`. The simulator runs the suite with the cases' own tolerances; a GPU
//! backend passes a floor for its arithmetic (`run_case_with`).

use graph_ir::op::{ConvAttrs, GeluApprox, PadMode, PoolAttrs};
use graph_ir::{ComputeGraph, DType, GraphError, GraphResult, Op, Shape, TensorId};
use std::fmt;

use crate::exec::{f32_to_f16, ExecError, Executor, HostTensor, PreparedPlan, TensorMap};
use crate::{verify, ExecutionPlan, PlanError, PlanOptions, Violation};

/// One conformance case: a graph, its tensors and the outputs it must produce.
#[derive(Clone, Debug)]
pub struct ConformanceCase {
    /// Unique name (`op/variant`).
    pub name: String,
    /// The graph.
    pub graph: ComputeGraph,
    /// Graph inputs.
    pub inputs: TensorMap,
    /// Weights.
    pub weights: TensorMap,
    /// Hand-computed expected outputs, by output name.
    pub expected: TensorMap,
    /// Relative tolerance (0: exact).
    pub tolerance: f64,
}

/// Why a case failed.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseFailure {
    /// The plan could not be built.
    Build(PlanError),
    /// The plan fails `verify`.
    Verify(Vec<Violation>),
    /// The executor failed.
    Exec(ExecError),
    /// An expected output is missing from the results.
    MissingOutput(String),
    /// An output has the wrong dtype or shape.
    WrongSpec {
        /// The output.
        output: String,
        /// Expected dtype and shape.
        want: String,
        /// Returned dtype and shape.
        got: String,
    },
    /// An element differs beyond the tolerance.
    Value {
        /// The output.
        output: String,
        /// Flat element index.
        index: usize,
        /// Expected value.
        want: f64,
        /// Returned value.
        got: f64,
        /// Tolerance applied.
        tolerance: f64,
    },
}

impl fmt::Display for CaseFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseFailure::Build(e) => write!(f, "build: {e}"),
            CaseFailure::Verify(v) => {
                write!(f, "verify: {}", v.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
            }
            CaseFailure::Exec(e) => write!(f, "executor: {e}"),
            CaseFailure::MissingOutput(o) => write!(f, "output '{o}' missing"),
            CaseFailure::WrongSpec { output, want, got } => write!(f, "output '{output}': want {want}, got {got}"),
            CaseFailure::Value { output, index, want, got, tolerance } => {
                write!(f, "output '{output}' element {index}: want {want}, got {got} (tolerance {tolerance})")
            }
        }
    }
}

/// Run `case` on `exec` with plan options `opts`, using the case's tolerance.
pub fn run_case<E: Executor>(exec: &E, case: &ConformanceCase, opts: &PlanOptions) -> Result<(), CaseFailure> {
    run_case_with(exec, case, opts, 0.0)
}

/// Run `case` with the tolerance raised to at least `min_tolerance` (for backends with other arithmetic).
pub fn run_case_with<E: Executor>(
    exec: &E,
    case: &ConformanceCase,
    opts: &PlanOptions,
    min_tolerance: f64,
) -> Result<(), CaseFailure> {
    let plan = ExecutionPlan::build_with(&case.graph, opts).map_err(CaseFailure::Build)?;
    verify(&plan).map_err(CaseFailure::Verify)?;
    let mut prepared = exec.prepare(&plan, &case.weights).map_err(CaseFailure::Exec)?;
    let got = prepared.run(&case.inputs).map_err(CaseFailure::Exec)?;
    let tol = case.tolerance.max(min_tolerance);
    for (name, want) in &case.expected {
        let g = got.get(name).ok_or_else(|| CaseFailure::MissingOutput(name.clone()))?;
        if g.dtype != want.dtype || g.shape != want.shape {
            return Err(CaseFailure::WrongSpec {
                output: name.clone(),
                want: format!("{} {}", want.dtype, want.shape),
                got: format!("{} {}", g.dtype, g.shape),
            });
        }
        for (index, (&w, &v)) in want.to_f64().iter().zip(&g.to_f64()).enumerate() {
            let ok = (w.is_nan() && v.is_nan()) || w == v || (tol > 0.0 && (v - w).abs() <= tol * w.abs().max(1.0));
            if !ok {
                return Err(CaseFailure::Value { output: name.clone(), index, want: w, got: v, tolerance: tol });
            }
        }
    }
    Ok(())
}

/// Run every case; returns the failures by case name.
pub fn run_all<E: Executor>(
    exec: &E,
    cases: &[ConformanceCase],
    opts: &PlanOptions,
    min_tolerance: f64,
) -> Vec<(String, CaseFailure)> {
    cases
        .iter()
        .filter_map(|c| run_case_with(exec, c, opts, min_tolerance).err().map(|e| (c.name.clone(), e)))
        .collect()
}

// ---------------------------------------------------------------------------------------------- tensors

fn f(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor::from_f32(shape.to_vec(), v)
}

fn i64s(shape: &[usize], v: &[i64]) -> HostTensor {
    HostTensor { dtype: DType::I64, shape: Shape::from(shape), data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

fn i32s(shape: &[usize], v: &[i32]) -> HostTensor {
    HostTensor { dtype: DType::I32, shape: Shape::from(shape), data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

fn bytes(dtype: DType, shape: &[usize], v: &[u8]) -> HostTensor {
    HostTensor { dtype, shape: Shape::from(shape), data: v.to_vec() }
}

fn bools(shape: &[usize], v: &[bool]) -> HostTensor {
    bytes(DType::Bool, shape, &v.iter().map(|&b| b as u8).collect::<Vec<_>>())
}

fn f16s(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor {
        dtype: DType::F16,
        shape: Shape::from(shape),
        data: v.iter().flat_map(|&x| f32_to_f16(x).to_le_bytes()).collect(),
    }
}

fn bf16s(shape: &[usize], v: &[f32]) -> HostTensor {
    // The values used are exact in bf16 (truncation is exact for them).
    HostTensor {
        dtype: DType::BF16,
        shape: Shape::from(shape),
        data: v.iter().flat_map(|&x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect(),
    }
}

fn seq(n: usize) -> Vec<f32> {
    (1..=n).map(|i| i as f32).collect()
}

// ---------------------------------------------------------------------------------------------- builder

struct B {
    c: ConformanceCase,
}

impl B {
    fn new(name: &str) -> Self {
        let graph = ComputeGraph::new(name.replace('/', "_"));
        B {
            c: ConformanceCase {
                name: name.to_string(),
                graph,
                inputs: TensorMap::new(),
                weights: TensorMap::new(),
                expected: TensorMap::new(),
                tolerance: 0.0,
            },
        }
    }

    fn input(&mut self, name: &str, t: HostTensor) -> GraphResult<TensorId> {
        let id = self.c.graph.add_input(name, t.dtype, t.shape.clone())?;
        self.c.inputs.insert(name.to_string(), t);
        Ok(id)
    }

    fn weight(&mut self, name: &str, t: HostTensor) -> GraphResult<TensorId> {
        let id = self.c.graph.add_weight(name, t.dtype, t.shape.clone())?;
        self.c.weights.insert(name.to_string(), t);
        Ok(id)
    }

    fn constant(&mut self, name: &str, t: HostTensor) -> GraphResult<TensorId> {
        self.c.graph.add_constant(name, t.dtype, t.shape.clone(), t.data)
    }

    fn node(&mut self, name: &str, op: Op, ins: &[TensorId]) -> GraphResult<TensorId> {
        let outs = self.c.graph.add_node(name, op, ins)?;
        outs.first()
            .copied()
            .ok_or_else(|| GraphError::Synth { family: "conformance", detail: format!("{name}: no output") })
    }

    fn out(&mut self, t: TensorId, want: HostTensor) -> GraphResult<()> {
        self.c.graph.mark_output(t)?;
        self.c.expected.insert(self.c.graph.tensor(t).name.to_string(), want);
        Ok(())
    }

    fn tol(mut self, t: f64) -> Self {
        self.c.tolerance = t;
        self
    }

    fn done(self) -> ConformanceCase {
        self.c
    }
}

/// `y = op(x)`.
fn unary(name: &str, op: Op, x: HostTensor, want: HostTensor, tol: f64) -> GraphResult<ConformanceCase> {
    let mut b = B::new(name);
    let xi = b.input("x", x)?;
    let y = b.node("y", op, &[xi])?;
    b.out(y, want)?;
    Ok(b.tol(tol).done())
}

/// `y = op(a, b)`.
fn binary(name: &str, op: Op, a: HostTensor, bt: HostTensor, want: HostTensor) -> GraphResult<ConformanceCase> {
    let mut b = B::new(name);
    let ai = b.input("a", a)?;
    let bi = b.input("b", bt)?;
    let y = b.node("y", op, &[ai, bi])?;
    b.out(y, want)?;
    Ok(b.done())
}

const T: f64 = 1e-6;

fn conv(strides: &[usize], pads: &[usize], dilations: &[usize], group: usize) -> Op {
    Op::Conv(ConvAttrs { strides: strides.to_vec(), pads: pads.to_vec(), dilations: dilations.to_vec(), group })
}

fn pool(k: &[usize], s: &[usize], p: &[usize], d: &[usize], ceil: bool, incl: bool) -> PoolAttrs {
    PoolAttrs {
        kernel_shape: k.to_vec(),
        strides: s.to_vec(),
        pads: p.to_vec(),
        dilations: d.to_vec(),
        ceil_mode: ceil,
        count_include_pad: incl,
    }
}

/// Every case of the suite. One long function on purpose: it is a table, one case per entry, and reading the
/// suite top to bottom is the point.
pub fn cases() -> GraphResult<Vec<ConformanceCase>> {
    let mut v = Vec::new();
    let x4 = || f(&[4], &[-2.0, -0.5, 0.0, 1.5]);
    // ---- unary elementwise
    v.push(unary("neg", Op::Neg, x4(), f(&[4], &[2.0, 0.5, 0.0, -1.5]), 0.0)?);
    v.push(unary("abs", Op::Abs, x4(), f(&[4], &[2.0, 0.5, 0.0, 1.5]), 0.0)?);
    v.push(unary("relu", Op::Relu, x4(), f(&[4], &[0.0, 0.0, 0.0, 1.5]), 0.0)?);
    v.push(unary("neg/i64", Op::Neg, i64s(&[3], &[-3, 0, 7]), i64s(&[3], &[3, 0, -7]), 0.0)?);
    v.push(unary("abs/i32", Op::Abs, i32s(&[2], &[-5, 5]), i32s(&[2], &[5, 5]), 0.0)?);
    v.push(unary("relu/i64", Op::Relu, i64s(&[3], &[-3, 0, 7]), i64s(&[3], &[0, 0, 7]), 0.0)?);
    // 0.5 * -2 = -1, 0.5 * -0.5 = -0.25
    v.push(unary("leaky_relu", Op::LeakyRelu { alpha: 0.5 }, x4(), f(&[4], &[-1.0, -0.25, 0.0, 1.5]), 0.0)?);
    v.push(unary("floor", Op::Floor, f(&[4], &[-1.5, -0.5, 0.5, 2.0]), f(&[4], &[-2.0, -1.0, 0.0, 2.0]), 0.0)?);
    v.push(unary("ceil", Op::Ceil, f(&[4], &[-1.5, -0.5, 0.5, 2.0]), f(&[4], &[-1.0, 0.0, 1.0, 2.0]), 0.0)?);
    v.push(unary("sqrt", Op::Sqrt, f(&[4], &[0.0, 1.0, 4.0, 9.0]), f(&[4], &[0.0, 1.0, 2.0, 3.0]), 0.0)?);
    v.push(unary(
        "reciprocal",
        Op::Reciprocal,
        f(&[4], &[1.0, 2.0, 4.0, -0.5]),
        f(&[4], &[1.0, 0.5, 0.25, -2.0]),
        0.0,
    )?);
    // e^0, e^1, e^-1, e^2
    v.push(unary(
        "exp",
        Op::Exp,
        f(&[4], &[0.0, 1.0, -1.0, 2.0]),
        f(&[4], &[1.0, std::f32::consts::E, 0.367_879_44, 7.389_056]),
        T,
    )?);
    // ln 1, ln 2, ln 10, ln 0.5
    v.push(unary(
        "log",
        Op::Log,
        f(&[4], &[1.0, 2.0, 10.0, 0.5]),
        f(&[4], &[0.0, std::f32::consts::LN_2, std::f32::consts::LN_10, -std::f32::consts::LN_2]),
        T,
    )?);
    // 1/(1+e^0) = 0.5, 1/(1+e^-2), 1/(1+e^2)
    v.push(unary("sigmoid", Op::Sigmoid, f(&[3], &[0.0, 2.0, -2.0]), f(&[3], &[0.5, 0.880_797_1, 0.119_202_92]), T)?);
    v.push(unary("tanh", Op::Tanh, f(&[3], &[0.0, 1.0, -0.5]), f(&[3], &[0.0, 0.761_594_2, -0.462_117_16]), T)?);
    v.push(unary(
        "erf",
        Op::Erf,
        f(&[4], &[0.0, 0.5, -1.0, 2.0]),
        f(&[4], &[0.0, 0.520_499_9, -0.842_700_8, 0.995_322_3]),
        T,
    )?);
    // 0.5 x (1 + erf(x / sqrt 2)): Phi(-1) = 0.158655254, Phi(1) = 0.841344746, Phi(2) = 0.977249868
    v.push(unary(
        "gelu/erf",
        Op::Gelu { approximate: GeluApprox::None },
        f(&[4], &[-1.0, 0.0, 1.0, 2.0]),
        f(&[4], &[-0.158_655_25, 0.0, 0.841_344_7, 1.954_499_7]),
        T,
    )?);
    v.push(unary(
        "gelu/tanh",
        Op::Gelu { approximate: GeluApprox::Tanh },
        f(&[4], &[-1.0, 0.0, 1.0, 2.0]),
        f(&[4], &[-0.158_808, 0.0, 0.841_192, 1.954_597_7]),
        T,
    )?);
    // x * sigmoid(x)
    v.push(unary(
        "silu",
        Op::Silu,
        f(&[4], &[-1.0, 0.0, 1.0, 2.0]),
        f(&[4], &[-0.268_941_43, 0.0, 0.731_058_6, 1.761_594_2]),
        T,
    )?);
    // x * clamp(x/6 + 1/2, 0, 1): -4 -> 0, -1.5 -> -1.5 * 0.25, 1.5 -> 1.5 * 0.75, 3 -> 3
    v.push(unary(
        "hard_swish",
        Op::HardSwish,
        f(&[6], &[-4.0, -1.5, 0.0, 1.5, 3.0, 4.0]),
        f(&[6], &[0.0, -0.375, 0.0, 1.125, 3.0, 4.0]),
        0.0,
    )?);
    v.push(unary(
        "hard_sigmoid",
        Op::HardSigmoid { alpha: 0.5, beta: 0.5 },
        f(&[5], &[-2.0, -0.5, 0.0, 0.5, 2.0]),
        f(&[5], &[0.0, 0.25, 0.5, 0.75, 1.0]),
        0.0,
    )?);
    v.push(unary(
        "clip",
        Op::Clip { min: Some(0.0), max: Some(6.0) },
        f(&[3], &[-1.0, 3.0, 7.0]),
        f(&[3], &[0.0, 3.0, 6.0]),
        0.0,
    )?);
    v.push(unary(
        "clip/min_only",
        Op::Clip { min: Some(-1.0), max: None },
        f(&[2], &[-2.0, 5.0]),
        f(&[2], &[-1.0, 5.0]),
        0.0,
    )?);
    v.push(unary(
        "clip/i64",
        Op::Clip { min: Some(-2.0), max: Some(4.0) },
        i64s(&[3], &[-5, 0, 9]),
        i64s(&[3], &[-2, 0, 4]),
        0.0,
    )?);
    v.push(unary("not", Op::Not, bools(&[2], &[true, false]), bools(&[2], &[false, true]), 0.0)?);
    // ---- casts: float -> int truncates toward zero and saturates; to bool is x != 0; int -> int wraps
    v.push(unary(
        "cast/f32_i32",
        Op::Cast { to: DType::I32 },
        f(&[5], &[-2.7, -0.5, 0.5, 2.7, 3.0e9]),
        i32s(&[5], &[-2, 0, 0, 2, i32::MAX]),
        0.0,
    )?);
    v.push(unary(
        "cast/f32_u8",
        Op::Cast { to: DType::U8 },
        f(&[3], &[-3.0, 7.9, 300.0]),
        bytes(DType::U8, &[3], &[0, 7, 255]),
        0.0,
    )?);
    v.push(unary(
        "cast/f32_bool",
        Op::Cast { to: DType::Bool },
        f(&[4], &[0.0, -0.0, 2.0, f32::NAN]),
        bools(&[4], &[false, false, true, true]),
        0.0,
    )?);
    v.push(unary("cast/i64_f32", Op::Cast { to: DType::F32 }, i64s(&[2], &[-3, 7]), f(&[2], &[-3.0, 7.0]), 0.0)?);
    v.push(unary(
        "cast/bool_f32",
        Op::Cast { to: DType::F32 },
        bools(&[2], &[true, false]),
        f(&[2], &[1.0, 0.0]),
        0.0,
    )?);
    // 300 = 0x12c -> 0x2c = 44; -129 -> 127
    v.push(unary(
        "cast/i64_i8",
        Op::Cast { to: DType::I8 },
        i64s(&[2], &[300, -129]),
        bytes(DType::I8, &[2], &[44, 127]),
        0.0,
    )?);
    // f16(0.1) = 1638/16384 = 0.0999755859375
    v.push(unary(
        "cast/f32_f16",
        Op::Cast { to: DType::F16 },
        f(&[2], &[1.0, 0.1]),
        f16s(&[2], &[1.0, 0.099_975_586]),
        0.0,
    )?);

    // ---- binary, numpy broadcasting
    v.push(binary(
        "add/broadcast_row",
        Op::Add,
        f(&[2, 3], &seq(6)),
        f(&[3], &[10.0, 20.0, 30.0]),
        f(&[2, 3], &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0]),
    )?);
    v.push(binary(
        "sub/broadcast_both",
        Op::Sub,
        f(&[2, 1], &[1.0, 2.0]),
        f(&[1, 3], &[10.0, 20.0, 30.0]),
        f(&[2, 3], &[-9.0, -19.0, -29.0, -8.0, -18.0, -28.0]),
    )?);
    v.push(binary("mul/scalar", Op::Mul, f(&[3], &[1.0, 2.0, 3.0]), f(&[], &[2.0]), f(&[3], &[2.0, 4.0, 6.0]))?);
    v.push(binary(
        "div/f32",
        Op::Div,
        f(&[4], &[1.0, -3.0, 7.0, 0.0]),
        f(&[4], &[2.0, 2.0, -2.0, 4.0]),
        f(&[4], &[0.5, -1.5, -3.5, 0.0]),
    )?);
    v.push(binary(
        "div/i64_truncates",
        Op::Div,
        i64s(&[4], &[7, -7, 7, -7]),
        i64s(&[4], &[2, 2, -2, -2]),
        i64s(&[4], &[3, -3, -3, 3]),
    )?);
    v.push(binary("max", Op::Max, f(&[3], &[1.0, 5.0, 3.0]), f(&[3], &[4.0, 2.0, 3.0]), f(&[3], &[4.0, 5.0, 3.0]))?);
    v.push(binary("min", Op::Min, f(&[3], &[1.0, 5.0, 3.0]), f(&[3], &[4.0, 2.0, 3.0]), f(&[3], &[1.0, 2.0, 3.0]))?);
    v.push(binary(
        "pow/scalar_exponent",
        Op::Pow,
        f(&[3], &[2.0, 3.0, 4.0]),
        f(&[], &[2.0]),
        f(&[3], &[4.0, 9.0, 16.0]),
    )?);
    v.push(binary("pow/i64", Op::Pow, i64s(&[3], &[2, 3, -2]), i64s(&[1], &[3]), i64s(&[3], &[8, 27, -8]))?);
    // int32 wraps (two's complement); u8 wraps modulo 256
    v.push(binary("add/i32_wraps", Op::Add, i32s(&[1], &[i32::MAX]), i32s(&[1], &[1]), i32s(&[1], &[i32::MIN]))?);
    v.push(binary(
        "mul/u8_wraps",
        Op::Mul,
        bytes(DType::U8, &[1], &[200]),
        bytes(DType::U8, &[1], &[2]),
        bytes(DType::U8, &[1], &[144]),
    )?);
    // f16: 1 + 2048 = 2049 is a tie between 2048 and 2050: round to even 2048
    v.push(binary(
        "add/f16_rounds",
        Op::Add,
        f16s(&[2], &[1.0, 0.5]),
        f16s(&[2], &[2048.0, 0.25]),
        f16s(&[2], &[2048.0, 0.75]),
    )?);
    // bf16: 1 + 256 = 257 ties between 256 and 258: even 256
    v.push(binary(
        "add/bf16_rounds",
        Op::Add,
        bf16s(&[2], &[1.0, 3.0]),
        bf16s(&[2], &[256.0, 4.0]),
        bf16s(&[2], &[256.0, 7.0]),
    )?);
    let cmp = |name: &str, op: Op, want: [bool; 3]| {
        binary(name, op, f(&[3], &[1.0, 2.0, 3.0]), f(&[1], &[2.0]), bools(&[3], &want))
    };
    v.push(cmp("equal", Op::Equal, [false, true, false])?);
    v.push(cmp("less", Op::Less, [true, false, false])?);
    v.push(cmp("less_or_equal", Op::LessOrEqual, [true, true, false])?);
    v.push(cmp("greater", Op::Greater, [false, false, true])?);
    v.push(cmp("greater_or_equal", Op::GreaterOrEqual, [false, true, true])?);
    v.push(binary(
        "equal/i64",
        Op::Equal,
        i64s(&[2, 1], &[1, 2]),
        i64s(&[2], &[1, 2]),
        bools(&[2, 2], &[true, false, false, true]),
    )?);
    v.push(binary(
        "and",
        Op::And,
        bools(&[4], &[true, true, false, false]),
        bools(&[4], &[true, false, true, false]),
        bools(&[4], &[true, false, false, false]),
    )?);
    v.push(binary(
        "or/broadcast",
        Op::Or,
        bools(&[2, 1], &[true, false]),
        bools(&[2], &[true, false]),
        bools(&[2, 2], &[true, true, true, false]),
    )?);
    {
        let mut b = B::new("where/broadcast3");
        let c = b.input("c", bools(&[2, 1], &[true, false]))?;
        let x = b.input("x", f(&[3], &[1.0, 2.0, 3.0]))?;
        let y = b.input("y", f(&[], &[-1.0]))?;
        let w = b.node("w", Op::Where, &[c, x, y])?;
        b.out(w, f(&[2, 3], &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0]))?;
        v.push(b.done());
    }
    {
        // A chain the fusion pass merges: ((x + 1) * 2) -> relu -> - 1; plus a comparison feeding Where.
        let mut b = B::new("chain/fused_elementwise");
        let x = b.input("x", f(&[4], &[-2.0, -1.0, 1.0, 2.0]))?;
        let one = b.constant("one", f(&[], &[1.0]))?;
        let two = b.weight("two", f(&[1], &[2.0]))?;
        let a = b.node("a", Op::Add, &[x, one])?;
        let m = b.node("m", Op::Mul, &[a, two])?;
        let r = b.node("r", Op::Relu, &[m])?;
        let s = b.node("s", Op::Sub, &[r, one])?;
        b.out(s, f(&[4], &[-1.0, -1.0, 3.0, 5.0]))?;
        v.push(b.done());
    }

    // ---- MatMul, Gemm
    v.push(binary(
        "matmul/2d",
        Op::MatMul,
        f(&[2, 3], &seq(6)),
        f(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
        f(&[2, 2], &[4.0, 5.0, 10.0, 11.0]),
    )?);
    v.push(binary(
        "matmul/batched_broadcast",
        Op::MatMul,
        f(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 1.0, 0.0]),
        f(&[2, 2], &[1.0, 1.0, 0.0, 1.0]),
        f(&[2, 2, 2], &[1.0, 3.0, 3.0, 7.0, 0.0, 1.0, 1.0, 1.0]),
    )?);
    v.push(binary(
        "matmul/vector_matrix",
        Op::MatMul,
        f(&[3], &[1.0, 2.0, 3.0]),
        f(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
        f(&[2], &[4.0, 5.0]),
    )?);
    v.push(binary(
        "matmul/matrix_vector",
        Op::MatMul,
        f(&[2, 3], &seq(6)),
        f(&[3], &[1.0, 0.0, 1.0]),
        f(&[2], &[4.0, 10.0]),
    )?);
    v.push(binary("matmul/dot", Op::MatMul, f(&[3], &[1.0, 2.0, 3.0]), f(&[3], &[4.0, 5.0, 6.0]), f(&[], &[32.0]))?);
    v.push(binary("matmul/i64", Op::MatMul, i64s(&[1, 2], &[2, 3]), i64s(&[2, 1], &[4, 5]), i64s(&[1, 1], &[23]))?);
    {
        // A B^T = [[1,2,3],[3,4,7]]; * 2 + 0.5 * [2,4,6]
        let mut b = B::new("gemm/alpha_beta_trans_b");
        let a = b.input("a", f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]))?;
        let w = b.weight("w", f(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]))?;
        let c = b.weight("c", f(&[3], &[2.0, 4.0, 6.0]))?;
        let y = b.node("y", Op::Gemm { alpha: 2.0, beta: 0.5, trans_a: false, trans_b: true }, &[a, w, c])?;
        b.out(y, f(&[2, 3], &[3.0, 6.0, 9.0, 7.0, 10.0, 17.0]))?;
        v.push(b.done());
    }
    {
        // A = [[1,2],[3,4]] stored transposed; A B = [[1,3],[3,7]]; + C (2,1)
        let mut b = B::new("gemm/trans_a_column_c");
        let a = b.input("a", f(&[2, 2], &[1.0, 3.0, 2.0, 4.0]))?;
        let w = b.weight("w", f(&[2, 2], &[1.0, 1.0, 0.0, 1.0]))?;
        let c = b.weight("c", f(&[2, 1], &[10.0, 20.0]))?;
        let y = b.node("y", Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: true, trans_b: false }, &[a, w, c])?;
        b.out(y, f(&[2, 2], &[11.0, 13.0, 23.0, 27.0]))?;
        v.push(b.done());
    }
    {
        let mut b = B::new("gemm/no_c");
        let a = b.input("a", f(&[1, 2], &[1.0, 2.0]))?;
        let w = b.weight("w", f(&[2, 2], &[3.0, 4.0, 5.0, 6.0]))?;
        let y = b.node("y", Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: false }, &[a, w])?;
        b.out(y, f(&[1, 2], &[13.0, 16.0]))?;
        v.push(b.done());
    }

    // ---- Conv
    let conv_case =
        |name: &str, op: Op, x: HostTensor, w: HostTensor, bias: Option<HostTensor>, want: HostTensor, relu: bool| {
            let mut b = B::new(name);
            let xi = b.input("x", x)?;
            let wi = b.weight("w", w)?;
            let mut ins = vec![xi, wi];
            if let Some(bt) = bias {
                ins.push(b.weight("b", bt)?);
            }
            let mut y = b.node("conv", op, &ins)?;
            if relu {
                y = b.node("relu", Op::Relu, &[y])?;
            }
            b.out(y, want)?;
            Ok::<_, GraphError>(b.done())
        };
    // x = 1..9 (3x3); w = [[1,0],[0,1]]: x[i][j] + x[i+1][j+1]
    v.push(conv_case(
        "conv/basic_bias",
        conv(&[], &[], &[], 1),
        f(&[1, 1, 3, 3], &seq(9)),
        f(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]),
        Some(f(&[1], &[1.0])),
        f(&[1, 1, 2, 2], &[7.0, 9.0, 13.0, 15.0]),
        false,
    )?);
    // 3x3 ones, pads 1, stride 2 over 1..9: windows centred on (0,0), (0,2), (2,0), (2,2)
    v.push(conv_case(
        "conv/pads_strides",
        conv(&[2, 2], &[1, 1, 1, 1], &[], 1),
        f(&[1, 1, 3, 3], &seq(9)),
        f(&[1, 1, 3, 3], &[1.0; 9]),
        None,
        f(&[1, 1, 2, 2], &[12.0, 16.0, 24.0, 28.0]),
        false,
    )?);
    // 2x2 ones dilated by 2 over 1..16 (4x4): x[i][j] + x[i][j+2] + x[i+2][j] + x[i+2][j+2]
    v.push(conv_case(
        "conv/dilations",
        conv(&[], &[], &[2, 2], 1),
        f(&[1, 1, 4, 4], &seq(16)),
        f(&[1, 1, 2, 2], &[1.0; 4]),
        None,
        f(&[1, 1, 2, 2], &[24.0, 28.0, 40.0, 44.0]),
        false,
    )?);
    // depthwise: channel 0 summed (ones), channel 1 top-left tap only
    v.push(conv_case(
        "conv/groups",
        conv(&[], &[], &[], 2),
        f(&[1, 2, 2, 2], &seq(8)),
        f(&[2, 1, 2, 2], &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]),
        None,
        f(&[1, 2, 1, 1], &[10.0, 5.0]),
        false,
    )?);
    // 1-D, two input channels: x0[i] + x0[i+1] + x1[i] - x1[i+1]
    v.push(conv_case(
        "conv/1d",
        conv(&[], &[], &[], 1),
        f(&[1, 2, 4], &[1.0, 2.0, 3.0, 4.0, 1.0, 1.0, 1.0, 1.0]),
        f(&[1, 2, 2], &[1.0, 1.0, 1.0, -1.0]),
        None,
        f(&[1, 1, 3], &[3.0, 5.0, 7.0]),
        false,
    )?);
    // batch 2, 1x1 kernels (1, -1), bias (0, 10), Relu epilogue (fusable)
    v.push(conv_case(
        "conv/batch_1x1_relu",
        conv(&[], &[], &[], 1),
        f(&[2, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0, 0.0, -1.0, 0.0, 1.0]),
        f(&[2, 1, 1, 1], &[1.0, -1.0]),
        Some(f(&[2], &[0.0, 10.0])),
        f(&[2, 2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 9.0, 8.0, 7.0, 6.0, 0.0, 0.0, 0.0, 1.0, 10.0, 11.0, 10.0, 9.0]),
        true,
    )?);

    // ---- pools
    let pool_case = |name: &str, op: Op, x: HostTensor, want: HostTensor| unary(name, op, x, want, 0.0);
    v.push(pool_case(
        "maxpool/2x2_stride2",
        Op::MaxPool(pool(&[2, 2], &[2, 2], &[], &[], false, false)),
        f(&[1, 1, 4, 4], &seq(16)),
        f(&[1, 1, 2, 2], &[6.0, 8.0, 14.0, 16.0]),
    )?);
    // negative inputs show that padding never wins a max
    v.push(pool_case(
        "maxpool/pads",
        Op::MaxPool(pool(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[], false, false)),
        f(&[1, 1, 4, 4], &seq(16).iter().map(|x| -x).collect::<Vec<_>>()),
        f(&[1, 1, 2, 2], &[-1.0, -2.0, -5.0, -6.0]),
    )?);
    // width 5, kernel 2, stride 2: floor gives 2 windows, ceil 3 (the last one holds only x[4])
    v.push(pool_case(
        "maxpool/ceil_mode",
        Op::MaxPool(pool(&[1, 2], &[1, 2], &[], &[], true, false)),
        f(&[1, 1, 1, 5], &seq(5)),
        f(&[1, 1, 1, 3], &[2.0, 4.0, 5.0]),
    )?);
    v.push(pool_case(
        "maxpool/dilations",
        Op::MaxPool(pool(&[2], &[], &[], &[2], false, false)),
        f(&[1, 1, 5], &[1.0, 5.0, 2.0, 4.0, 3.0]),
        f(&[1, 1, 3], &[2.0, 5.0, 3.0]),
    )?);
    v.push(pool_case(
        "maxpool/i64",
        Op::MaxPool(pool(&[2], &[2], &[], &[], false, false)),
        i64s(&[1, 1, 4], &[3, -1, 7, 9]),
        i64s(&[1, 1, 2], &[3, 9]),
    )?);
    // 2x2 window, stride 1, pads 1 over [[1,2],[3,4]]: 3x3 outputs
    v.push(pool_case(
        "avgpool/exclude_pad",
        Op::AveragePool(pool(&[2, 2], &[1, 1], &[1, 1, 1, 1], &[], false, false)),
        f(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]),
        f(&[1, 1, 3, 3], &[1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 3.0, 3.5, 4.0]),
    )?);
    v.push(pool_case(
        "avgpool/count_include_pad",
        Op::AveragePool(pool(&[2, 2], &[1, 1], &[1, 1, 1, 1], &[], false, true)),
        f(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]),
        f(&[1, 1, 3, 3], &[0.25, 0.75, 0.5, 1.0, 2.5, 1.5, 0.75, 1.75, 1.0]),
    )?);
    // width 6, kernel 3, stride 2, pads 1: ceil gives windows at -1, 1, 3, 5; the last covers 5, 6, 7 of which
    // only 5 is data and 6 is the end pad (7 lies beyond the padded input)
    v.push(pool_case(
        "avgpool/ceil_exclude_pad",
        Op::AveragePool(pool(&[3], &[2], &[1, 1], &[], true, false)),
        f(&[1, 1, 6], &seq(6)),
        f(&[1, 1, 4], &[1.5, 3.0, 5.0, 6.0]),
    )?);
    v.push(pool_case(
        "avgpool/ceil_include_pad",
        Op::AveragePool(pool(&[3], &[2], &[1, 1], &[], true, true)),
        f(&[1, 1, 6], &seq(6)),
        f(&[1, 1, 4], &[1.0, 3.0, 5.0, 3.0]),
    )?);
    v.push(unary(
        "global_average_pool",
        Op::GlobalAveragePool,
        f(&[1, 2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 9.0]),
        f(&[1, 2, 1, 1], &[2.5, 6.75]),
        0.0,
    )?);
    {
        // per channel (x - mean) / sqrt(var) * scale + B: ch0 (x-1)/2*2, ch1 (x-2)/1*1+1
        let mut b = B::new("batch_norm");
        let x = b.input("x", f(&[1, 2, 1, 2], &[1.0, 3.0, 2.0, 4.0]))?;
        let s = b.weight("scale", f(&[2], &[2.0, 1.0]))?;
        let bb = b.weight("bias", f(&[2], &[0.0, 1.0]))?;
        let m = b.weight("mean", f(&[2], &[1.0, 2.0]))?;
        let var = b.weight("var", f(&[2], &[4.0, 1.0]))?;
        let y = b.node("bn", Op::BatchNormalization { epsilon: 0.0 }, &[x, s, bb, m, var])?;
        b.out(y, f(&[1, 2, 1, 2], &[0.0, 2.0, 1.0, 3.0]))?;
        v.push(b.done());
    }

    // ---- reductions
    let x23 = || f(&[2, 3], &seq(6));
    v.push(unary(
        "reduce_sum/axis1_keepdims",
        Op::ReduceSum { axes: Some(vec![1]), keepdims: true },
        x23(),
        f(&[2, 1], &[6.0, 15.0]),
        0.0,
    )?);
    v.push(unary("reduce_sum/all", Op::ReduceSum { axes: None, keepdims: false }, x23(), f(&[], &[21.0]), 0.0)?);
    v.push(unary(
        "reduce_mean/negative_axis",
        Op::ReduceMean { axes: Some(vec![-1]), keepdims: false },
        f(&[2, 2, 2], &seq(8)),
        f(&[2, 2], &[1.5, 3.5, 5.5, 7.5]),
        0.0,
    )?);
    v.push(unary(
        "reduce_max/two_axes",
        Op::ReduceMax { axes: Some(vec![0, 2]), keepdims: true },
        f(&[2, 2, 2], &seq(8)),
        f(&[1, 2, 1], &[6.0, 8.0]),
        0.0,
    )?);
    v.push(unary(
        "reduce_sum/i64",
        Op::ReduceSum { axes: Some(vec![0]), keepdims: false },
        i64s(&[2, 2], &[1, 2, 3, 4]),
        i64s(&[2], &[4, 6]),
        0.0,
    )?);
    // rows [0, 0] -> halves; [0, ln 3] -> 1/4, 3/4
    v.push(unary(
        "softmax/last_axis",
        Op::Softmax { axis: -1 },
        f(&[2, 2], &[0.0, 0.0, 0.0, 1.098_612_3]),
        f(&[2, 2], &[0.5, 0.5, 0.25, 0.75]),
        T,
    )?);
    // columns: [1, 1] -> halves; [2, 5] -> 1/(1+e^3), e^3/(1+e^3)
    v.push(unary(
        "softmax/axis0",
        Op::Softmax { axis: 0 },
        f(&[2, 2], &[1.0, 2.0, 1.0, 5.0]),
        f(&[2, 2], &[0.5, 0.047_425_874, 0.5, 0.952_574_1]),
        T,
    )?);
    {
        // mean 2.5, var 1.25: (x - 2.5) / 1.118034; scale (1,1,1,2), bias (0,0,0,1)
        let mut b = B::new("layer_norm/last_axis");
        let x = b.input("x", f(&[1, 4], &[1.0, 2.0, 3.0, 4.0]))?;
        let s = b.weight("scale", f(&[4], &[1.0, 1.0, 1.0, 2.0]))?;
        let bb = b.weight("bias", f(&[4], &[0.0, 0.0, 0.0, 1.0]))?;
        let y = b.node("ln", Op::LayerNormalization { axis: -1, epsilon: 0.0 }, &[x, s, bb])?;
        b.out(y, f(&[1, 4], &[-1.341_640_8, -0.447_213_6, 0.447_213_6, 3.683_281_6]))?;
        v.push(b.tol(T).done());
    }
    {
        // normalise over axes 1..3 of (1,2,2): mean 3, var 5; scale [1, 2] broadcast over the last axis, no bias
        let mut b = B::new("layer_norm/axis1_broadcast_scale");
        let x = b.input("x", f(&[1, 2, 2], &[0.0, 2.0, 4.0, 6.0]))?;
        let s = b.weight("scale", f(&[2], &[1.0, 2.0]))?;
        let y = b.node("ln", Op::LayerNormalization { axis: 1, epsilon: 0.0 }, &[x, s])?;
        b.out(y, f(&[1, 2, 2], &[-1.341_640_8, -0.894_427_2, 0.447_213_6, 2.683_281_6]))?;
        v.push(b.tol(T).done());
    }

    // ---- views (no kernel: the next kernel reads the input's bytes with the view's shape)
    {
        let mut b = B::new("reshape/then_add");
        let x = b.input("x", f(&[2, 3], &seq(6)))?;
        let r = b.node("r", Op::Reshape { shape: vec![3, -1], allowzero: false }, &[x])?;
        let c = b.weight("c", f(&[2], &[0.0, 10.0]))?;
        let y = b.node("y", Op::Add, &[r, c])?;
        b.out(y, f(&[3, 2], &[1.0, 12.0, 3.0, 14.0, 5.0, 16.0]))?;
        v.push(b.done());
    }
    {
        let mut b = B::new("flatten_squeeze_unsqueeze");
        let x = b.input("x", f(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]))?;
        let a = b.node("flat", Op::Flatten { axis: 1 }, &[x])?;
        let n = b.node("neg", Op::Neg, &[a])?;
        let u = b.node("unsq", Op::Unsqueeze { axes: vec![0, -1] }, &[n])?;
        let s = b.node("sq", Op::Squeeze { axes: Some(vec![0]) }, &[u])?;
        let y = b.node("y", Op::Abs, &[s])?;
        b.out(y, f(&[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]))?;
        v.push(b.done());
    }
    {
        // a graph output that is a view of an input: the plan copies it
        let mut b = B::new("identity/output_of_input");
        let x = b.input("x", f(&[3], &[1.0, -2.0, 3.0]))?;
        let y = b.node("y", Op::Identity, &[x])?;
        b.out(y, f(&[3], &[1.0, -2.0, 3.0]))?;
        v.push(b.done());
    }

    // ---- data movement
    v.push(unary(
        "transpose/perm",
        Op::Transpose { perm: Some(vec![1, 0]) },
        x23(),
        f(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]),
        0.0,
    )?);
    v.push(unary(
        "transpose/reverse",
        Op::Transpose { perm: None },
        f(&[2, 1, 3], &seq(6)),
        f(&[3, 1, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]),
        0.0,
    )?);
    let x34 = || f(&[3, 4], &(0..12).map(|i| i as f32).collect::<Vec<_>>());
    v.push(unary(
        "slice/negative_starts",
        Op::Slice { starts: vec![1, -3], ends: vec![3, -1], axes: Some(vec![0, 1]), steps: None },
        x34(),
        f(&[2, 2], &[5.0, 6.0, 9.0, 10.0]),
        0.0,
    )?);
    v.push(unary(
        "slice/negative_step",
        Op::Slice { starts: vec![-1], ends: vec![i64::MIN], axes: None, steps: Some(vec![-2]) },
        f(&[6], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
        f(&[3], &[5.0, 3.0, 1.0]),
        0.0,
    )?);
    v.push(unary(
        "slice/negative_axis_step3",
        Op::Slice { starts: vec![0], ends: vec![100], axes: Some(vec![-1]), steps: Some(vec![3]) },
        x34(),
        f(&[3, 2], &[0.0, 3.0, 4.0, 7.0, 8.0, 11.0]),
        0.0,
    )?);
    v.push(binary(
        "concat/axis1",
        Op::Concat { axis: 1 },
        f(&[2, 1], &[1.0, 2.0]),
        f(&[2, 2], &[3.0, 4.0, 5.0, 6.0]),
        f(&[2, 3], &[1.0, 3.0, 4.0, 2.0, 5.0, 6.0]),
    )?);
    v.push(binary(
        "concat/i64_negative_axis",
        Op::Concat { axis: -1 },
        i64s(&[1, 1], &[7]),
        i64s(&[1, 2], &[8, 9]),
        i64s(&[1, 3], &[7, 8, 9]),
    )?);
    v.push(binary(
        "gather/axis0_negative_index",
        Op::Gather { axis: 0 },
        f(&[3, 2], &seq(6)),
        i64s(&[2], &[-1, 0]),
        f(&[2, 2], &[5.0, 6.0, 1.0, 2.0]),
    )?);
    v.push(binary(
        "gather/axis1_i32_2d_indices",
        Op::Gather { axis: 1 },
        x23(),
        i32s(&[2, 2], &[0, 2, -1, 1]),
        f(&[2, 2, 2], &[1.0, 3.0, 3.0, 2.0, 4.0, 6.0, 6.0, 5.0]),
    )?);
    v.push(unary(
        "expand",
        Op::Expand { shape: vec![2, 1, 2] },
        f(&[3, 1], &[1.0, 2.0, 3.0]),
        f(&[2, 3, 2], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]),
        0.0,
    )?);
    let x22 = || f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    v.push(unary(
        "pad/constant",
        Op::Pad { pads: vec![0, 1, 1, 0], mode: PadMode::Constant, value: 9.0 },
        x22(),
        f(&[3, 3], &[9.0, 1.0, 2.0, 9.0, 3.0, 4.0, 9.0, 9.0, 9.0]),
        0.0,
    )?);
    v.push(unary(
        "pad/reflect",
        Op::Pad { pads: vec![0, 2, 0, 1], mode: PadMode::Reflect, value: 0.0 },
        f(&[1, 3], &[1.0, 2.0, 3.0]),
        f(&[1, 6], &[3.0, 2.0, 1.0, 2.0, 3.0, 2.0]),
        0.0,
    )?);
    v.push(unary(
        "pad/edge",
        Op::Pad { pads: vec![0, 2, 0, 1], mode: PadMode::Edge, value: 0.0 },
        f(&[1, 3], &[1.0, 2.0, 3.0]),
        f(&[1, 6], &[1.0, 1.0, 1.0, 2.0, 3.0, 3.0]),
        0.0,
    )?);
    // axis 0 loses its last row; axis 1 loses its first column and gains a zero column
    v.push(unary(
        "pad/negative_crops",
        Op::Pad { pads: vec![0, -1, -1, 1], mode: PadMode::Constant, value: 0.0 },
        x23(),
        f(&[1, 3], &[2.0, 3.0, 0.0]),
        0.0,
    )?);
    v.push(unary(
        "pad/i64",
        Op::Pad { pads: vec![1, 0], mode: PadMode::Constant, value: -1.0 },
        i64s(&[2], &[5, 6]),
        i64s(&[3], &[-1, 5, 6]),
        0.0,
    )?);
    {
        let mut b = B::new("split/axis1");
        let x = b.input("x", x23())?;
        let outs = b.c.graph.add_node("split", Op::Split { axis: 1, splits: vec![1, 2] }, &[x])?;
        b.out(outs[0], f(&[2, 1], &[1.0, 4.0]))?;
        b.out(outs[1], f(&[2, 2], &[2.0, 3.0, 5.0, 6.0]))?;
        v.push(b.done());
    }
    {
        // two branches that a multi-stream plan may run concurrently, joined by Concat
        let mut b = B::new("branches/concat_join");
        let x = b.input("x", f(&[1, 2], &[1.0, -2.0]))?;
        let a = b.node("a", Op::Relu, &[x])?;
        let a2 = b.node("a2", Op::Mul, &[a, a])?;
        let c = b.node("c", Op::Abs, &[x])?;
        let c2 = b.node("c2", Op::Neg, &[c])?;
        let y = b.node("y", Op::Concat { axis: 0 }, &[a2, c2])?;
        b.out(y, f(&[2, 2], &[1.0, 0.0, -1.0, -2.0]))?;
        v.push(b.done());
    }
    Ok(v)
}

/// The names of every case (stable order).
pub fn case_names() -> GraphResult<Vec<String>> {
    Ok(cases()?.into_iter().map(|c| c.name).collect())
}
