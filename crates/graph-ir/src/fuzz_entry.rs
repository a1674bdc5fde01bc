//! Fuzzing and property entry points for graph-ir: the same checks run under `proptest` in `cargo test` and
//! under `cargo fuzz` (`fuzz/fuzz_targets/*.rs`), so a crash either finds is reproduced by the other.
//!
//! Contract of every check here: `Ok(())` or `Err(reason)` for input that is merely invalid (an error is the
//! right answer to a bad file); a **panic only on a real invariant violation** (a loaded graph that does not
//! validate, a JSON round trip that changes the graph). A panic anywhere else, in the loader or the builder, is
//! itself the bug the fuzzer is after.
//!
//! [`graph_from_bytes`] turns arbitrary bytes into a graph through the public builder: random ops with random
//! (often invalid) attributes over random shapes and dtypes. Most nodes fail to build; each failure must be a
//! [`GraphError`], never a panic, and what does build is a valid graph the later crates' checks plan, verify
//! and simulate.

use crate::error::{GraphError, GraphResult};
use crate::graph::{ComputeGraph, TensorId};
use crate::json;
use crate::op::{Arity, ConvAttrs, CustomOp, GeluApprox, MemSpace, Op, PadMode, PoolAttrs};
use crate::{DType, Shape, TensorSpec};

/// Load `bytes` as a JSON graph; when it loads, check that it validates and survives a save/load round trip.
pub fn json_load(bytes: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let g = json::from_json(text).map_err(|e| e.to_string())?;
    assert_valid(&g);
    json_roundtrip(&g)
}

/// A graph that loaded or built must validate; panics (a bug) when it does not.
pub fn assert_valid(g: &ComputeGraph) {
    if let Err(e) = g.validate() {
        panic!("invariant: a graph that built does not validate: {e}");
    }
    for (_, n) in g.nodes() {
        for &t in n.inputs.iter().chain(&n.outputs) {
            assert!(g.get_tensor(t).is_some(), "invariant: node '{}' names a tensor not in the graph", n.name);
        }
    }
}

/// Save `g` as JSON and load it back: the documents must be equal. `Err` only when the graph holds a value
/// JSON cannot carry (a NaN or infinite float attribute or constant is written as `null`, which loading
/// rejects by design); any other difference panics.
pub fn json_roundtrip(g: &ComputeGraph) -> Result<(), String> {
    let text = g.to_json();
    match json::from_json(&text) {
        Ok(back) => {
            let (a, b) = (g.to_doc(), back.to_doc());
            if a != b {
                let first = a.nodes.iter().zip(&b.nodes).find(|(x, y)| x != y);
                panic!(
                    "invariant: JSON round trip changed graph '{}': first differing node {first:?}; \
                     inputs equal: {}, constants equal: {}, outputs equal: {}",
                    g.name(),
                    a.inputs == b.inputs,
                    a.constants == b.constants,
                    a.outputs == b.outputs
                );
            }
            Ok(())
        }
        Err(GraphError::Json { path, message, .. }) if message.contains("null") => {
            Err(format!("not representable in JSON (non-finite float at {path})"))
        }
        Err(GraphError::ConstantData { tensor, detail }) if detail.contains("null") => {
            Err(format!("not representable in JSON (non-finite constant '{tensor}')"))
        }
        Err(e) => panic!("invariant: a saved graph does not load back: {e}\n{text}"),
    }
}

/// Reads fuzz bytes as a stream of choices; reads past the end give zeros, so every byte string is a valid
/// recipe and short inputs make small graphs.
#[derive(Clone, Debug)]
pub struct ByteSource<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> ByteSource<'a> {
    /// A source over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        ByteSource { data, pos: 0 }
    }

    /// True when every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte (0 past the end).
    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        b
    }

    /// The next little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    /// The next little-endian u64.
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.byte();
        }
        u64::from_le_bytes(b)
    }

    /// A choice in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            usize::from(self.byte()) % n
        }
    }

    /// A coin flip.
    pub fn bool(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// One of `items` (the first when empty input runs out).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        let i = self.below(items.len());
        items.get(i).copied()
    }
}

/// Extents: mostly small, sometimes zero or one of the hostile ones.
const DIMS: [usize; 12] = [1, 2, 3, 4, 1, 2, 8, 0, 5, 16, 1 << 20, usize::MAX];
/// Integer attributes: small and signed, sometimes extreme.
const INTS: [i64; 16] = [0, 1, -1, 2, -2, 3, 4, -3, 1, 0, 5, -4, i64::MIN, i64::MAX, 1 << 40, -(1 << 40)];
/// Float attributes: ordinary values and the non-finite ones the builder must reject where they matter.
const FLOATS: [f32; 10] = [1.0, 0.5, 0.0, -1.0, 1e-5, 2.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0];

fn dim(b: &mut ByteSource) -> usize {
    // Hostile extents stay rare so that most graphs are plannable.
    let n = if b.byte() < 240 { 10 } else { DIMS.len() };
    let i = b.below(n);
    DIMS.get(i).copied().unwrap_or(1)
}

fn shape(b: &mut ByteSource) -> Shape {
    let rank = b.below(5);
    Shape((0..rank).map(|_| dim(b)).collect())
}

fn dtype(b: &mut ByteSource) -> DType {
    // Mostly F32 so that numeric ops line up; the other dtypes exercise the dtype checks.
    if b.byte() < 192 {
        DType::F32
    } else {
        b.pick(&DType::ALL).unwrap_or(DType::F32)
    }
}

fn int(b: &mut ByteSource) -> i64 {
    b.pick(&INTS).unwrap_or(0)
}

fn ints(b: &mut ByteSource, max: usize) -> Vec<i64> {
    let n = b.below(max + 1);
    (0..n).map(|_| int(b)).collect()
}

fn uints(b: &mut ByteSource, max: usize) -> Vec<usize> {
    let n = b.below(max + 1);
    (0..n)
        .map(|_| {
            let v = int(b).unsigned_abs() as usize;
            let cap = if b.byte() < 250 { 4 } else { usize::MAX };
            v.min(cap)
        })
        .collect()
}

fn float(b: &mut ByteSource) -> f32 {
    b.pick(&FLOATS).unwrap_or(1.0)
}

fn finite(b: &mut ByteSource) -> f32 {
    let f = float(b);
    if f.is_finite() {
        f
    } else {
        1.0
    }
}

fn axes(b: &mut ByteSource) -> Option<Vec<i64>> {
    if b.bool() {
        None
    } else {
        Some(ints(b, 3))
    }
}

/// One op with random attributes. Float attributes that JSON cannot carry are only made non-finite where the
/// builder is expected to reject them (Clip bounds, epsilons), so that every graph that builds also saves.
pub fn op_from_bytes(b: &mut ByteSource) -> Op {
    use Op::*;
    let conv = |b: &mut ByteSource| ConvAttrs {
        strides: uints(b, 3),
        pads: uints(b, 4),
        dilations: uints(b, 3),
        group: b.below(3),
    };
    let pool = |b: &mut ByteSource| PoolAttrs {
        kernel_shape: uints(b, 3),
        strides: uints(b, 3),
        pads: uints(b, 4),
        dilations: uints(b, 2),
        ceil_mode: b.bool(),
        count_include_pad: b.bool(),
    };
    match b.below(64) {
        0 => Neg,
        1 => Abs,
        2 => Exp,
        3 => Log,
        4 => Sqrt,
        5 => Reciprocal,
        6 => Relu,
        7 => LeakyRelu { alpha: finite(b) },
        8 => Sigmoid,
        9 => Tanh,
        10 => Erf,
        11 => Gelu { approximate: if b.bool() { GeluApprox::Tanh } else { GeluApprox::None } },
        12 => Silu,
        13 => HardSwish,
        14 => HardSigmoid { alpha: finite(b), beta: finite(b) },
        15 => Floor,
        16 => Ceil,
        17 => Not,
        18 => {
            let min = if b.bool() { Some(float(b)) } else { None };
            let max = if b.bool() { Some(float(b)) } else { None };
            Clip { min, max }
        }
        19 => Cast { to: dtype(b) },
        20 => Add,
        21 => Sub,
        22 => Mul,
        23 => Div,
        24 => Pow,
        25 => Max,
        26 => Min,
        27 => Equal,
        28 => Less,
        29 => LessOrEqual,
        30 => Greater,
        31 => GreaterOrEqual,
        32 => And,
        33 => Or,
        34 => Where,
        35 | 36 => MatMul,
        37 => Gemm { alpha: finite(b), beta: finite(b), trans_a: b.bool(), trans_b: b.bool() },
        38 => Conv(conv(b)),
        39 => MaxPool(pool(b)),
        40 => AveragePool(pool(b)),
        41 => GlobalAveragePool,
        42 => BatchNormalization { epsilon: float(b) },
        43 => ReduceSum { axes: axes(b), keepdims: b.bool() },
        44 => ReduceMean { axes: axes(b), keepdims: b.bool() },
        45 => ReduceMax { axes: axes(b), keepdims: b.bool() },
        46 => Softmax { axis: int(b) },
        47 => LayerNormalization { axis: int(b), epsilon: float(b) },
        48 => Reshape { shape: ints(b, 4), allowzero: b.bool() },
        49 => Flatten { axis: int(b) },
        50 => Squeeze { axes: axes(b) },
        51 => Unsqueeze { axes: ints(b, 3) },
        52 => Identity,
        53 => Transpose {
            perm: if b.bool() {
                None
            } else {
                Some(ints(b, 4).into_iter().map(|i| i.unsigned_abs() as usize).collect())
            },
        },
        54 => Slice {
            starts: ints(b, 3),
            ends: ints(b, 3),
            axes: if b.bool() { None } else { Some(ints(b, 3)) },
            steps: if b.bool() { None } else { Some(ints(b, 3)) },
        },
        55 => Concat { axis: int(b) },
        56 => Gather { axis: int(b) },
        57 => Expand { shape: ints(b, 4) },
        58 => Pad {
            pads: ints(b, 8),
            mode: b.pick(&[PadMode::Constant, PadMode::Reflect, PadMode::Edge]).unwrap_or_default(),
            value: finite(b),
        },
        59 => Split { axis: int(b), splits: uints(b, 3) },
        60 => Memcpy { to: if b.bool() { MemSpace::Host } else { MemSpace::Device } },
        61 => Custom(CustomOp {
            source: "extern \"C\" __global__ void k() {}".into(),
            entry: "k".into(),
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem_bytes: 0,
            outputs: (0..b.below(3)).map(|_| TensorSpec { dtype: dtype(b), shape: shape(b) }).collect(),
            flops: b.u64(),
            bytes_read: if b.bool() { Some(b.u64()) } else { None },
            bytes_written: None,
        }),
        62 => Add,
        _ => Relu,
    }
}

/// Counts from one [`graph_from_bytes`] call, for the fuzzer's statistics and the property tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenStats {
    /// Nodes the builder accepted.
    pub built: usize,
    /// Nodes the builder rejected with an error.
    pub rejected: usize,
}

/// Build a graph from fuzz bytes through the public builder (see the module doc). Builder errors on single
/// nodes are expected and skipped; the result is `Err` only when nothing usable was built.
pub fn graph_from_bytes(bytes: &[u8]) -> GraphResult<ComputeGraph> {
    graph_from_bytes_with_stats(bytes).0
}

/// [`graph_from_bytes`] with counts of built and rejected nodes.
pub fn graph_from_bytes_with_stats(bytes: &[u8]) -> (GraphResult<ComputeGraph>, GenStats) {
    let mut b = ByteSource::new(bytes);
    let mut stats = GenStats::default();
    let mut g = ComputeGraph::new("fuzz");
    let mut tensors: Vec<TensorId> = Vec::new();
    let mut produced: Vec<TensorId> = Vec::new();
    let inputs = 1 + b.below(3);
    for i in 0..inputs {
        let (dt, sh) = (dtype(&mut b), shape(&mut b));
        let r = if i > 0 && b.byte() < 64 {
            g.add_weight(&format!("w{i}"), dt, sh)
        } else {
            g.add_input(&format!("x{i}"), dt, sh)
        };
        match r {
            Ok(t) => tensors.push(t),
            Err(_) => stats.rejected += 1,
        }
    }
    if b.byte() < 64 {
        // A small integer constant: Gather indices, or a dtype mismatch elsewhere.
        let n = b.below(4);
        let vals: Vec<i64> = (0..n).map(|_| (b.byte() % 4) as i64 - 1).collect();
        let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        if let Ok(t) = g.add_constant("idx", DType::I64, [n], data) {
            tensors.push(t);
        }
    }
    let nodes = b.below(48);
    for i in 0..nodes {
        if b.is_empty() || tensors.is_empty() {
            break;
        }
        let op = op_from_bytes(&mut b);
        let n = match op.arity() {
            Arity::Exact(k) => k,
            Arity::Range(lo, hi) => lo + b.below(hi.saturating_sub(lo) + 1),
            Arity::AtLeast(lo) => lo + b.below(3),
        };
        let ins: Vec<TensorId> = (0..n)
            .map(|_| {
                // Mostly recent tensors, so that chains form; sometimes any earlier one.
                let k = tensors.len();
                let back = if b.byte() < 200 { b.below(k.min(4)) } else { b.below(k) };
                tensors[k - 1 - back]
            })
            .collect();
        match g.add_node(&format!("n{i}"), op, &ins) {
            Ok(outs) => {
                stats.built += 1;
                tensors.extend(&outs);
                produced.extend(&outs);
            }
            Err(_) => stats.rejected += 1,
        }
    }
    // Outputs: every produced tensor nobody reads, plus a few chosen ones.
    for &t in &produced {
        if g.consumers(t).is_empty() || b.byte() < 16 {
            let _ = g.mark_output(t);
        }
    }
    let r = g.validate().map(|()| g);
    (r, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_bytes_make_no_graph() {
        assert!(matches!(graph_from_bytes(&[]), Err(GraphError::EmptyGraph { .. })));
    }

    #[test]
    fn byte_source_reads_zero_past_the_end() {
        let mut b = ByteSource::new(&[7, 1]);
        assert_eq!(b.byte(), 7);
        assert_eq!(b.u16(), 1);
        assert!(b.is_empty());
        assert_eq!(b.below(5), 0);
        assert_eq!(b.pick(&[3, 4]), Some(3));
        assert_eq!(b.pick::<u8>(&[]), None);
    }

    #[test]
    fn json_load_rejects_non_utf8_and_checks_examples() {
        assert!(json_load(&[0xff, 0xfe]).unwrap_err().contains("UTF-8"));
        assert!(json_load(b"").is_err());
        let g = crate::synth::mlp(2, 8, 2).unwrap();
        json_load(g.to_json().as_bytes()).unwrap();
    }
}
