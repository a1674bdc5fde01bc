//! The precision transform: a graph and a [`PrecisionPolicy`] -> a new graph whose floating-point tensors are
//! stored in f16 or bf16 where the policy allows (the input graph is untouched). It runs before fusion; the
//! memory, fusion and stream passes then work unchanged on the rewritten graph. [`transform_owned`] is the same
//! rewrite on a graph the caller gives up: it edits that graph in place (`ComputeGraph::edit`) rather than
//! copying it, which is what keeps a half plan's compile time near the f32 plan's; [`transform`] runs it on a
//! clone.
//!
//! # The numeric rule (DESIGN.md 9, the one statement of it)
//! Every op computes in f32 and rounds its result to its output tensor's dtype when the value is made, whether
//! the value is stored to memory or stays in a fused kernel's registers. So products (MatMul, Gemm, Conv) and
//! reductions (Softmax, LayerNormalization, ReduceSum/Mean, GlobalAveragePool, BatchNormalization) of half
//! tensors *accumulate in f32* and round once, on the store; a fused kernel gives the same bits as the unfused
//! ops. exec-sim implements it in `value.rs` (`round_float`, round-to-nearest-even, overflow to infinity); the
//! CUDA code generator emits the same conversions.
//!
//! # The decision, per node
//! A node is *convertible* when every float tensor it reads or writes is f32 and it is a kernel op (not a
//! view, copy or custom kernel). A convertible node computes in f32 when, in this order:
//! 1. its op type is on the keep-in-f32 list ([`PrecisionRule::KeepOp`]);
//! 2. its name matches a `re:` pattern of the list ([`PrecisionRule::KeepPattern`]);
//! 3. `softmax-input` is on the list and the node is an elementwise op on the chain (through views and
//!    elementwise ops) that computes a Softmax's input ([`PrecisionRule::SoftmaxInput`]): attention logits grow
//!    past f16's 65504 before the Softmax normalises them;
//! 4. it is an anchor (MatMul, Gemm, Conv, pools) reading a graph input kept in f32, or a weight that stays f32
//!    because an f32 kernel reads it too ([`PrecisionRule::AnchorReadsF32`]): an anchor accepts no fused
//!    prologue, so a cast there would be a launch of its own; the anchor reads the tensor as it is, and its
//!    output is cast in its epilogue instead. (This and the weights' dtypes are iterated to a fixpoint.)
//!
//! Every other convertible node computes in the policy's half type ([`PrecisionRule::Default`]). Views and
//! copies follow their input's dtype; custom kernels and non-convertible nodes keep their declared dtypes.
//! Weights and constants take half precision when every kernel reading them (through views) computes in half;
//! constants' bytes are converted here, weights' at prepare (`graph_plan::exec::weight_bytes`).
//! Graph inputs and outputs keep their declared dtype unless [`PrecisionPolicy::io_half`].
//!
//! # Mixed-precision nodes: the dtype boundaries without casts
//! A convertible node whose op [`Op::stores_mixed`] (elementwise ops other than Cast, reductions) is placed as a
//! *mixed-precision node* ([`graph_ir::Node::store`]) when it sits on a dtype boundary: it reads each float
//! operand as it is stored (widened exactly to f32), computes in f32 and stores its float outputs in its *store
//! dtype*, which is, in this order: the one dtype its kernel readers need (an anchor or an as-declared reader
//! reads its own dtype); else the one dtype the graph outputs it reaches (through views) are declared in; else
//! the one dtype its mixed readers compute in; else its own. Numerically it is exactly the casts around the node
//! (the numeric rule above), but there is no cast node: the graph has as many nodes as the input, and the
//! fusion pass sees the same kernels as in f32. So a LayerNormalization kept in f32 between half MatMuls reads
//! the f32 sum before it and stores half for the MatMul after it; an attention block's scale reads the half
//! scores and stores f32, and its Softmax stores the half probabilities.
//!
//! # Where casts remain (so that none is a launch of its own)
//! Where no mixed node sits on the boundary — an anchor, a data-movement op or a view on one side, readers that
//! disagree — a tensor read in another dtype than it is stored in gets a `Cast` node:
//! - narrowing (f32 -> half) a value some kernel produces: one cast right after the producer, shared by every
//!   half reader; the fusion pass takes it into the producer's kernel as an epilogue;
//! - narrowing a graph input or weight (no producer kernel): one cast per reader, which joins the reader's loop
//!   or row kernel as a producer (anchors never read one, by rule 4);
//! - widening (half -> f32) into an anchor: one shared cast after the producer (an epilogue again);
//! - widening into any other op: one cast per reader, fused into the reader's kernel (elementwise producers
//!   join loop and row kernels).
//!
//! A graph output whose producer computes in half (and is not a mixed node storing the output's dtype) gets a
//! final cast to its declared dtype, fused as an epilogue.
//!
//! # Complexity
//! O(N + E) over nodes and edges (the softmax-input walk visits each node at most once), plus one regex match
//! per node and pattern.

use graph_ir::{ComputeGraph, DType, GraphEdit, GraphError, NodeId, Op, OpCategory, TensorId, TensorRole};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use thiserror::Error;

/// The storage precision a plan is built for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything as declared (no transform).
    #[default]
    Fp32,
    /// IEEE binary16 storage, f32 compute.
    Fp16,
    /// bfloat16 storage, f32 compute.
    Bf16,
}

impl Precision {
    /// Every precision, in the order the CLI lists them.
    pub const ALL: [Precision; 3] = [Precision::Fp32, Precision::Fp16, Precision::Bf16];

    /// The name on the command line and in reports (`fp32`, `fp16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }

    /// The storage dtype of converted tensors.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Fp32 => DType::F32,
            Precision::Fp16 => DType::F16,
            Precision::Bf16 => DType::BF16,
        }
    }

    /// Parse `fp32`, `fp16` or `bf16`.
    pub fn parse(s: &str) -> Result<Precision, PrecisionError> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| PrecisionError::UnknownPrecision { given: s.to_string() })
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of the keep-in-f32 list.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepEntry {
    /// Every node of this op type (an ONNX op name, one of [`Op::NAMES`]).
    Op(String),
    /// Nodes whose name matches this regular expression (the whole name; written `re:PATTERN`).
    Pattern(String),
    /// The elementwise chain that computes each Softmax's input (written `softmax-input`).
    SoftmaxInput,
}

impl fmt::Display for KeepEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepEntry::Op(o) => f.write_str(o),
            KeepEntry::Pattern(p) => write!(f, "re:{p}"),
            KeepEntry::SoftmaxInput => f.write_str("softmax-input"),
        }
    }
}

/// The default keep-in-f32 list, each entry with the reason it is there (in the spirit of torch autocast's
/// f32 list and TensorRT's layer precision advice).
pub const DEFAULT_KEEP_F32: [(&str, &str); 7] = [
    (
        "LayerNormalization",
        "x - mean squared over a wide row exceeds f16's 65504 and the variance loses its low bits \
         (TensorRT #2564, #3692 report overflowing LayerNorm in fp16)",
    ),
    ("Softmax", "the normalising sum over a long row loses precision in half; its output feeds the next product"),
    ("softmax-input", "attention logits (QK^T scaled, plus the mask) grow past 65504 before Softmax normalises them"),
    ("Exp", "e^x overflows f16 for x > 11.09"),
    ("Pow", "squares of activations above 256 overflow f16 (the variance of a decomposed LayerNorm)"),
    ("ReduceSum", "a sum grows with the row length: 4096 values of 16 already overflow f16"),
    ("Reciprocal", "1/x overflows f16 for |x| < 1.5e-5"),
];

/// The default list as entries.
pub fn default_keep_f32() -> Vec<KeepEntry> {
    DEFAULT_KEEP_F32.iter().map(|(e, _)| parse_entry(e).unwrap_or(KeepEntry::SoftmaxInput)).collect()
}

fn parse_entry(e: &str) -> Result<KeepEntry, PrecisionError> {
    if let Some(p) = e.strip_prefix("re:") {
        compile_pattern(p)?;
        return Ok(KeepEntry::Pattern(p.to_string()));
    }
    if e == "softmax-input" {
        return Ok(KeepEntry::SoftmaxInput);
    }
    if Op::NAMES.contains(&e) {
        return Ok(KeepEntry::Op(e.to_string()));
    }
    let close: Vec<&str> = Op::NAMES.iter().copied().filter(|n| n.eq_ignore_ascii_case(e)).collect();
    Err(PrecisionError::UnknownOp { entry: e.to_string(), did_you_mean: close.first().map(|s| s.to_string()) })
}

fn compile_pattern(p: &str) -> Result<regex::Regex, PrecisionError> {
    if p.is_empty() {
        return Err(PrecisionError::BadPattern { pattern: p.to_string(), detail: "empty pattern".into() });
    }
    // Anchored: a pattern names whole node names, as a glob would.
    regex::RegexBuilder::new(&format!("^(?:{p})$"))
        .size_limit(1 << 20)
        .build()
        .map_err(|e| PrecisionError::BadPattern { pattern: p.to_string(), detail: one_line(&e.to_string()) })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Parse a `--keep-f32` list: comma-separated op names, `re:PATTERN` node-name patterns, `softmax-input` and
/// `default` (the default list); `none` alone is the empty list. The list replaces the default one.
pub fn parse_keep_f32(list: &str) -> Result<Vec<KeepEntry>, PrecisionError> {
    let list = list.trim();
    if list == "none" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for raw in list.split(',') {
        let e = raw.trim();
        if e.is_empty() {
            return Err(PrecisionError::EmptyEntry { list: list.to_string() });
        }
        if e == "none" {
            return Err(PrecisionError::NoneNotAlone { list: list.to_string() });
        }
        let new = if e == "default" { default_keep_f32() } else { vec![parse_entry(e)?] };
        for n in new {
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    Ok(out)
}

/// Why a precision option is wrong.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum PrecisionError {
    /// Not `fp32`, `fp16` or `bf16`.
    #[error("unknown precision '{given}' (known: fp32, fp16, bf16)")]
    UnknownPrecision {
        /// What was given.
        given: String,
    },
    /// A keep-f32 entry that is no op name, pattern or keyword.
    #[error("--keep-f32: '{entry}' is not an op type{}; entries are op types (LayerNormalization), `re:PATTERN`, \
             `softmax-input`, `default`, or `none` alone", .did_you_mean.as_ref().map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default())]
    UnknownOp {
        /// The entry.
        entry: String,
        /// An op name that differs only in case.
        did_you_mean: Option<String>,
    },
    /// A `re:` pattern that does not compile.
    #[error("--keep-f32: malformed pattern 're:{pattern}': {detail}")]
    BadPattern {
        /// The pattern (without `re:`).
        pattern: String,
        /// The regex compiler's message.
        detail: String,
    },
    /// An empty entry (`a,,b` or a trailing comma).
    #[error("--keep-f32 '{list}': empty entry")]
    EmptyEntry {
        /// The whole list.
        list: String,
    },
    /// `none` together with other entries.
    #[error("--keep-f32 '{list}': 'none' must stand alone")]
    NoneNotAlone {
        /// The whole list.
        list: String,
    },
}

impl From<PrecisionError> for GraphError {
    fn from(e: PrecisionError) -> GraphError {
        GraphError::InvalidOption { option: "precision".into(), detail: e.to_string() }
    }
}

/// What to convert: the half type, what stays in f32, and whether graph inputs/outputs convert too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecisionPolicy {
    /// The storage precision; `Fp32` means no transform.
    pub precision: Precision,
    /// Nodes that stay in f32 (replaces the default list; see [`DEFAULT_KEEP_F32`]).
    pub keep_f32: Vec<KeepEntry>,
    /// Convert graph inputs and outputs too (`--io-precision half`); by default they keep their declared dtype.
    pub io_half: bool,
}

impl Default for PrecisionPolicy {
    fn default() -> Self {
        PrecisionPolicy { precision: Precision::Fp32, keep_f32: default_keep_f32(), io_half: false }
    }
}

impl PrecisionPolicy {
    /// The default policy for `precision`.
    pub fn new(precision: Precision) -> Self {
        PrecisionPolicy { precision, ..Default::default() }
    }

    /// True when the transform changes nothing (f32).
    pub fn is_identity(&self) -> bool {
        self.precision == Precision::Fp32
    }
}

/// Why a node got its precision (what `explain` prints).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "rule")]
pub enum PrecisionRule {
    /// The policy's half type (no exception applied).
    Default,
    /// Kept in f32 by op type.
    KeepOp {
        /// The op type (an `Op::NAMES` entry, borrowed).
        op: Cow<'static, str>,
    },
    /// Kept in f32: the node's name matches a pattern.
    KeepPattern {
        /// The pattern (without `re:`).
        pattern: String,
    },
    /// Kept in f32: computes a Softmax's input.
    SoftmaxInput {
        /// The Softmax node.
        softmax: String,
    },
    /// Kept in f32: an anchor reading a graph input or weight that stays f32 (a cast before it would launch
    /// alone).
    AnchorReadsF32 {
        /// The graph input or weight.
        tensor: String,
    },
    /// A view or copy: stores what its input stores.
    FollowsInput,
    /// Not all-f32 floating-point, or a custom kernel: left as declared.
    AsDeclared,
    /// A cast the transform inserted.
    InsertedCast,
}

impl fmt::Display for PrecisionRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrecisionRule::Default => f.write_str("policy default"),
            PrecisionRule::KeepOp { op } => write!(f, "keep-f32 op {op}"),
            PrecisionRule::KeepPattern { pattern } => write!(f, "keep-f32 pattern re:{pattern}"),
            PrecisionRule::SoftmaxInput { softmax } => write!(f, "softmax-input of {softmax}"),
            PrecisionRule::AnchorReadsF32 { tensor } => write!(f, "anchor reads f32 source {tensor}"),
            PrecisionRule::FollowsInput => f.write_str("view/copy follows its input"),
            PrecisionRule::AsDeclared => f.write_str("as declared (not an all-f32 kernel)"),
            PrecisionRule::InsertedCast => f.write_str("inserted cast"),
        }
    }
}

/// One node of the rewritten graph: its precision and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePrecision {
    /// The node's name (in the rewritten graph; original nodes keep their names).
    pub node: String,
    /// Its op type (an `Op::NAMES` entry, borrowed: the report names every node of the graph).
    pub op: Cow<'static, str>,
    /// The dtype it computes in: f32 for a mixed-precision node ([`graph_ir::Node::store`]), else the dtype of
    /// its first floating-point output (`None`: no float output).
    pub dtype: Option<DType>,
    /// A mixed-precision node's store dtype: it reads its float operands as they are stored, computes in f32
    /// and stores its float outputs in this dtype (TensorRT's layer precision and output type, told apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<DType>,
    /// The rule that chose it.
    pub rule: PrecisionRule,
}

/// What the transform did. The rules are kept per node position, not per name: the transform does not copy
/// every node's name into its report (that was a tenth of its cost); [`PrecisionReport::nodes`] names them from
/// the rewritten graph when `explain` asks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecisionReport {
    /// The policy's precision.
    pub precision: Precision,
    /// The rule of each node of the rewritten graph, in that graph's node order (its topological order).
    pub rules: Vec<PrecisionRule>,
    /// Casts inserted.
    pub casts_inserted: usize,
    /// Weights and constants converted to half.
    pub sources_converted: usize,
}

impl PrecisionReport {
    /// Every node of `rewritten` (the graph the transform returned with this report), in order: its name, op,
    /// float dtype and rule.
    pub fn nodes(&self, rewritten: &ComputeGraph) -> Vec<NodePrecision> {
        rewritten.nodes().zip(&self.rules).map(|((_, n), rule)| entry(rewritten, n, rule)).collect()
    }

    /// The entry of node `name` of `rewritten`.
    pub fn node(&self, rewritten: &ComputeGraph, name: &str) -> Option<NodePrecision> {
        let id = rewritten.node_id(name)?;
        let i = rewritten.node_ids().position(|n| n == id)?;
        Some(entry(rewritten, rewritten.node(id), self.rules.get(i)?))
    }
}

fn entry(g: &ComputeGraph, n: &graph_ir::Node, rule: &PrecisionRule) -> NodePrecision {
    NodePrecision {
        node: n.name.to_string(),
        op: Cow::Borrowed(n.op.name()),
        dtype: compute_dtype(g, n),
        store: n.store,
        rule: rule.clone(),
    }
}

/// The dtype node `n` computes in: f32 for a mixed-precision node, else that of its first float output.
fn compute_dtype(g: &ComputeGraph, n: &graph_ir::Node) -> Option<DType> {
    if n.store.is_some() {
        return Some(DType::F32);
    }
    n.outputs.iter().map(|&o| g.tensor(o).dtype).find(|d| d.is_float())
}

/// Nodes of `graph` per dtype they compute in (a mixed-precision node: f32; else the dtype of its first
/// floating-point output; `none` for nodes without one), sorted by name: the report's `nodes_per_precision`.
pub fn node_counts(graph: &ComputeGraph) -> Vec<(String, usize)> {
    // Counted per dtype (the last slot: no float output), named once at the end.
    let mut counts = [0usize; DType::ALL.len() + 1];
    for (_, n) in graph.nodes() {
        let d = compute_dtype(graph, n);
        let slot = d.and_then(|d| DType::ALL.iter().position(|&x| x == d)).unwrap_or(DType::ALL.len());
        counts[slot] += 1;
    }
    let name = |slot: usize| DType::ALL.get(slot).map_or("none", |d| d.name());
    let mut out: Vec<(String, usize)> =
        counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(slot, &c)| (name(slot).to_string(), c)).collect();
    out.sort();
    out
}

/// The policy with its patterns compiled.
struct Compiled {
    /// Op names (`Op::NAMES` entries; a handful, so a scan beats hashing every node's op name).
    ops: Vec<&'static str>,
    patterns: Vec<(String, regex::Regex)>,
    softmax_input: bool,
}

fn compile(policy: &PrecisionPolicy) -> Result<Compiled, PrecisionError> {
    let mut c = Compiled { ops: Vec::new(), patterns: Vec::new(), softmax_input: false };
    for e in &policy.keep_f32 {
        match e {
            KeepEntry::Op(o) => {
                let Some(&name) = Op::NAMES.iter().find(|&&n| n == o) else {
                    return Err(PrecisionError::UnknownOp { entry: o.clone(), did_you_mean: None });
                };
                if !c.ops.contains(&name) {
                    c.ops.push(name);
                }
            }
            KeepEntry::Pattern(p) => c.patterns.push((p.clone(), compile_pattern(p)?)),
            KeepEntry::SoftmaxInput => c.softmax_input = true,
        }
    }
    Ok(c)
}

/// What a node wants its float inputs (originally f32) to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// Whatever they are (views, copies, Cast nodes).
    Any,
    /// Their declared dtype (custom kernels, non-convertible nodes).
    Declared,
    /// This dtype.
    Is(DType),
}

/// Rewrite `graph` under `policy`; the input is untouched. With `Fp32` the result is a copy of the graph.
/// A caller that owns its graph and no longer needs it should call [`transform_owned`], which saves the copy.
pub fn transform(
    graph: &ComputeGraph,
    policy: &PrecisionPolicy,
) -> Result<(ComputeGraph, PrecisionReport), GraphError> {
    // Compile the policy first: a malformed one is refused before the graph is copied.
    compile(policy)?;
    transform_owned(graph.clone(), policy)
}

/// [`transform`] on a graph the caller gives up: the rewrite edits it in place ([`ComputeGraph::edit`]), moving
/// every name and shape instead of copying them into a second graph.
pub fn transform_owned(
    graph: ComputeGraph,
    policy: &PrecisionPolicy,
) -> Result<(ComputeGraph, PrecisionReport), GraphError> {
    let _span = tracing::debug_span!("precision").entered();
    let c = compile(policy)?;
    let half = policy.precision.dtype();
    // Creation order is a topological order (a node can only read tensors that exist): the given order.
    let order: Vec<NodeId> = graph.node_ids().collect();
    let convert_io = policy.io_half && half != DType::F32;
    let Decided { mut decision, sources, facts, stores } = decide(&graph, &c, policy, &order);

    // 2. Sources.
    let mut report = PrecisionReport { precision: policy.precision, ..Default::default() };
    let mut e = graph.edit();
    for t in sources {
        let x = e.tensor(t);
        let data = match x.role {
            TensorRole::Constant => x.data.as_ref().map(|b| convert_f32_bytes(b, half)),
            _ => None,
        };
        report.sources_converted += usize::from(x.role != TensorRole::Input);
        e.retype_source(t, half, data)?;
    }

    // 3. Nodes in order, with casts where a reader wants another dtype.
    let mut shared: HashMap<(TensorId, DType), TensorId> = HashMap::new();
    // Graph outputs renamed for a cast to their declared dtype: their original names, which casts are named after.
    let mut renamed: HashMap<TensorId, Arc<str>> = HashMap::new();
    let mut ins: Vec<TensorId> = Vec::new();
    for &n in &order {
        let (want, rule) = decision.remove(n).unwrap_or((Want::Declared, PrecisionRule::AsDeclared));
        let store = stores.get(n).copied();
        ins.clear();
        for i in 0..e.node(n).inputs.len() {
            let t = e.node(n).inputs[i];
            let have = e.tensor(t).dtype;
            let target = match want {
                // A mixed-precision node reads its float operands as they are stored.
                _ if store.is_some() && have.is_float() => None,
                Want::Any => None,
                Want::Declared => Some(facts[t].dtype),
                Want::Is(d) => (facts[t].dtype == DType::F32).then_some(d),
            };
            let Some(target) = target.filter(|&d| d != have) else {
                ins.push(t);
                continue;
            };
            let narrowing = target != DType::F32;
            let share =
                if narrowing { facts[t].kernel_producer } else { e.node(n).op.category() == OpCategory::Anchor };
            let key = (t, target);
            let cast = match shared.get(&key) {
                Some(&c) if share => c,
                _ => {
                    let base = renamed.get(&t).unwrap_or(&e.tensor(t).name);
                    let cname = if share {
                        fresh(&e, &format!("{base}.to_{target}"))
                    } else {
                        fresh(&e, &format!("{base}.to_{target}.{}", e.node(n).name))
                    };
                    let c = insert_cast(&mut e, &mut report, &cname, t, &cname, target)?;
                    if share {
                        shared.insert(key, c);
                    }
                    c
                }
            };
            ins.push(cast);
        }
        let node = e.node(n);
        let op = match (&node.op, want) {
            (Op::Cast { to: DType::F32 }, Want::Is(d)) if d != DType::F32 => Some(Op::Cast { to: d }),
            _ => None,
        };
        // A view that writes a graph output of another dtype than its half source: cast the source instead and
        // replay the views on the cast, so that the cast joins the source's kernel (a cast after a view that
        // kernel cannot write, e.g. a reshape across a reduction's rows, would launch alone).
        if let ([o], [i], true) = (&node.outputs[..], &ins[..], node.op.is_view()) {
            let declared = facts[*o].dtype;
            let have = e.tensor(*i).dtype;
            let keeps_half = convert_io && declared == DType::F32 && have == half;
            if facts[*o].output && have != declared && !keeps_half && have.is_float() && declared.is_float() {
                let i = *i;
                let widened = cast_view_source(&mut e, &mut report, i, declared)?;
                e.place(n, op, &[widened])?;
                report.rules.push(rule);
                continue;
            }
        }
        match store {
            // A float operand in another dtype than the store: a mixed node; else an ordinary one.
            Some(d) if ins.iter().any(|&t| e.tensor(t).dtype.is_float() && e.tensor(t).dtype != d) => {
                e.place_stored(n, &ins, d)?
            }
            _ => e.place(n, op, &ins)?,
        }
        report.rules.push(rule);
        // A graph output keeps its declared dtype: the node writes a renamed tensor and a cast writes the output.
        for i in 0..e.node(n).outputs.len() {
            let o = e.node(n).outputs[i];
            let got = e.tensor(o).dtype;
            let declared = facts[o].dtype;
            let declared = if convert_io && declared == DType::F32 && got == half { half } else { declared };
            if !facts[o].output || got == declared {
                continue;
            }
            let oname = e.tensor(o).name.clone();
            e.rename_tensor(o, &fresh(&e, &format!("{oname}.{got}")))?;
            let cname = fresh(&e, &format!("{oname}.cast_out"));
            let c = insert_cast(&mut e, &mut report, &cname, o, &oname, declared)?;
            e.replace_output(o, c)?;
            renamed.insert(o, oname);
        }
    }
    Ok((e.finish()?, report))
}

/// The transform's decisions, made on the input graph before the edit changes it.
struct Decided {
    /// What each node wants its float inputs to be, and the rule that chose it.
    decision: SecondaryMap<NodeId, (Want, PrecisionRule)>,
    /// The inputs, weights and constants to store in the half type.
    sources: Vec<TensorId>,
    /// What the rewrite needs to know of each tensor of the input graph.
    facts: SecondaryMap<TensorId, Fact>,
    /// The store dtype chosen for each node that may be mixed ([`store_dtypes`]); it is placed as a
    /// mixed-precision node ([`graph_ir::Node::store`]) when an operand is stored in another float dtype, else as
    /// an ordinary node of that dtype.
    stores: SecondaryMap<NodeId, DType>,
}

/// The decision per node (rules 1-4, with rule 4 and the sources' dtypes iterated to their fixpoint). Kept out
/// of line so that profiles show the decisions apart from the edit.
#[inline(never)]
fn decide(graph: &ComputeGraph, c: &Compiled, policy: &PrecisionPolicy, order: &[NodeId]) -> Decided {
    let half = policy.precision.dtype();
    let convert_io = policy.io_half && half != DType::F32;
    let mut decision: SecondaryMap<NodeId, (Want, PrecisionRule)> = SecondaryMap::with_capacity(order.len());
    for &n in order {
        let node = graph.node(n);
        let d = if node.op.is_view() || matches!(node.op, Op::Memcpy { .. }) {
            (Want::Any, PrecisionRule::FollowsInput)
        } else if !convertible(graph, n) || policy.precision == Precision::Fp32 {
            (Want::Declared, PrecisionRule::AsDeclared)
        } else if c.ops.contains(&node.op.name()) {
            (Want::Is(DType::F32), PrecisionRule::KeepOp { op: Cow::Borrowed(node.op.name()) })
        } else if let Some((p, _)) = c.patterns.iter().find(|(_, r)| r.is_match(&node.name)) {
            (Want::Is(DType::F32), PrecisionRule::KeepPattern { pattern: p.clone() })
        } else {
            (Want::Is(half), PrecisionRule::Default)
        };
        decision.insert(n, d);
    }
    if c.softmax_input {
        mark_softmax_inputs(graph, order, &mut decision);
    }
    // Rule 4 and the weights' dtypes depend on each other (an anchor kept in f32 makes its weights f32, which
    // may keep another anchor reading them in f32): iterate to the fixpoint; each round only turns half into f32.
    {
        // Each source's kernel readers, one flat list for all of them (one allocation, not one per weight).
        let mut flat: Vec<NodeId> = Vec::new();
        let mut span: SecondaryMap<TensorId, (usize, usize)> = SecondaryMap::with_capacity(graph.num_tensors());
        for &w in graph.weights().iter().chain(graph.inputs()) {
            let start = flat.len();
            kernel_readers(graph, w, &mut flat);
            span.insert(w, (start, flat.len()));
        }
        let readers_of = |t: TensorId| span.get(t).map_or(&[][..], |&(a, b)| &flat[a..b]);
        let weight_half = |decision: &SecondaryMap<NodeId, (Want, PrecisionRule)>, t: TensorId| {
            let readers = readers_of(t);
            half != DType::F32
                && graph.tensor(t).dtype == DType::F32
                && !readers.is_empty()
                && readers.iter().all(|&r| decision[r].0 == Want::Is(half))
        };
        // With `--io-precision half`, an f32 graph input is stored half unless an anchor that computes in f32
        // reads it: that anchor would need a widening cast with no producing kernel to fuse into, a launch only
        // to cast. Such an input keeps its declared dtype (rule 4 then keeps its other anchors in f32 too).
        let input_half = |decision: &SecondaryMap<NodeId, (Want, PrecisionRule)>, t: TensorId| {
            let readers = readers_of(t);
            convert_io
                && graph.tensor(t).dtype == DType::F32
                && readers
                    .iter()
                    .all(|&r| graph.node(r).op.category() != OpCategory::Anchor || decision[r].0 == Want::Is(half))
        };
        loop {
            let mut changed = false;
            for &n in order {
                let node = graph.node(n);
                if decision[n].0 != Want::Is(half) || half == DType::F32 || node.op.category() != OpCategory::Anchor {
                    continue;
                }
                let f32_source = node.inputs.iter().map(|&t| source_through_views(graph, t)).find(|&s| {
                    let t = graph.tensor(s);
                    t.dtype == DType::F32
                        && match t.role {
                            TensorRole::Input => !input_half(&decision, s),
                            TensorRole::Weight | TensorRole::Constant => !weight_half(&decision, s),
                            _ => false,
                        }
                });
                if let Some(s) = f32_source {
                    let tensor = graph.tensor(s).name.clone();
                    decision[n] = (Want::Is(DType::F32), PrecisionRule::AnchorReadsF32 { tensor: tensor.to_string() });
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        // The sources to retype (inputs by the io setting, weights and constants by their readers), and what the
        // rewrite needs to know of the input graph once the edit has started changing it.
        let inputs = graph.inputs().iter().filter(|&&t| input_half(&decision, t));
        let weights = graph.weights().iter().filter(|&&t| weight_half(&decision, t));
        let sources: Vec<TensorId> = inputs.chain(weights).copied().collect();
        let mut facts: SecondaryMap<TensorId, Fact> = SecondaryMap::with_capacity(graph.num_tensors());
        for (t, x) in graph.tensors() {
            facts.insert(t, Fact { dtype: x.dtype, output: x.role == TensorRole::Output, kernel_producer: false });
        }
        // Whose bytes a kernel wrote, in one pass in order: a view's outputs hold its first input's bytes.
        for &n in order {
            let node = graph.node(n);
            let kernel = match node.inputs.first() {
                Some(&i) if node.op.is_view() => facts[i].kernel_producer,
                _ => true,
            };
            for &o in &node.outputs {
                facts[o].kernel_producer = kernel;
            }
        }
        let stores = if half == DType::F32 {
            SecondaryMap::new()
        } else {
            store_dtypes(graph, order, &decision, &facts, convert_io, half)
        };
        Decided { decision, sources, facts, stores }
    }
}

/// The store dtype of every node that can read and store mixed dtypes ([`Op::stores_mixed`]) and computes in
/// f32 or half by the decisions: the one dtype its kernel readers need (anchors, data movement and as-declared
/// nodes read their own dtype); else the one final dtype of the graph outputs it reaches through views; else the
/// one dtype its mixed readers compute in; else its own. Its operands are read as stored, so no cast goes in
/// front of it, and none after it where its readers agree.
fn store_dtypes(
    graph: &ComputeGraph,
    order: &[NodeId],
    decision: &SecondaryMap<NodeId, (Want, PrecisionRule)>,
    facts: &SecondaryMap<TensorId, Fact>,
    convert_io: bool,
    half: DType,
) -> SecondaryMap<NodeId, DType> {
    let mut stores = SecondaryMap::with_capacity(order.len());
    let mut readers: Vec<NodeId> = Vec::new();
    for &n in order {
        let node = graph.node(n);
        let Want::Is(own) = decision[n].0 else { continue };
        if !node.op.stores_mixed() || !node.inputs.iter().any(|&t| graph.tensor(t).dtype.is_float()) {
            continue;
        }
        // `need`: the one dtype required so far (`Err` once two differ); `pref`: the same for mixed readers.
        let mut need: Option<Result<DType, ()>> = None;
        let mut pref: Option<Result<DType, ()>> = None;
        // What graph outputs need: second to kernel readers (an output cast fuses as an epilogue; a cast in
        // front of a data-movement reader may not).
        let mut out_need: Option<Result<DType, ()>> = None;
        let add = |slot: &mut Option<Result<DType, ()>>, d: DType| {
            *slot = match *slot {
                None => Some(Ok(d)),
                Some(Ok(x)) if x == d => Some(Ok(x)),
                _ => Some(Err(())),
            };
        };
        for &o in &node.outputs {
            if !graph.tensor(o).dtype.is_float() {
                continue;
            }
            readers.clear();
            outputs_through_views(graph, o, &mut readers, &mut |t| {
                let declared = facts[t].dtype;
                add(&mut out_need, if convert_io && declared == DType::F32 { half } else { declared });
            });
            for &r in &readers {
                let rn = graph.node(r);
                match decision.get(r).map(|d| d.0) {
                    Some(Want::Is(d)) if rn.op.stores_mixed() => add(&mut pref, d),
                    Some(Want::Is(d)) => add(&mut need, d),
                    _ => add(&mut need, DType::F32),
                }
            }
        }
        let d = match (need, out_need, pref) {
            (Some(Ok(d)), _, _) => d,
            (None, Some(Ok(d)), _) => d,
            (None, None, Some(Ok(d))) => d,
            _ => own,
        };
        stores.insert(n, d);
    }
    stores
}

/// The non-view readers of `t` and of the views of it, appended to `out`; `output` is called for `t` and each
/// such view that is a graph output.
fn outputs_through_views(graph: &ComputeGraph, t: TensorId, out: &mut Vec<NodeId>, output: &mut dyn FnMut(TensorId)) {
    let mut stack = vec![t];
    while let Some(t) = stack.pop() {
        if graph.tensor(t).role == TensorRole::Output {
            output(t);
        }
        for &c in graph.consumers(t) {
            let node = graph.node(c);
            if node.op.is_view() {
                stack.extend(node.outputs.iter().copied());
            } else {
                out.push(c);
            }
        }
    }
}

/// What the rewrite needs to know of a tensor of the input graph.
#[derive(Clone, Copy)]
struct Fact {
    /// Its declared dtype.
    dtype: DType,
    /// It is a graph output.
    output: bool,
    /// A kernel (not a view) wrote its bytes.
    kernel_producer: bool,
}

/// `base`, or `base.1`, `base.2`, ...: the first name no tensor or node of the edited graph has.
fn fresh(e: &GraphEdit, base: &str) -> String {
    let mut name = base.to_string();
    let mut i = 1;
    while e.name_taken(&name) {
        name = format!("{base}.{i}");
        i += 1;
    }
    name
}

/// Adds node `name`, a cast of `src` to `to` writing tensor `output`, and records it in the report.
fn insert_cast(
    e: &mut GraphEdit,
    report: &mut PrecisionReport,
    name: &str,
    src: TensorId,
    output: &str,
    to: DType,
) -> Result<TensorId, GraphError> {
    let c = e.add_node(name, Op::Cast { to }, &[src], &[output])?[0];
    report.casts_inserted += 1;
    report.rules.push(PrecisionRule::InsertedCast);
    Ok(c)
}

/// `t` (a tensor of the edited graph) as `to`: a cast of the kernel result its views start from, with those views
/// replayed on the cast under fresh names, so that the cast reads the kernel's own output.
fn cast_view_source(
    e: &mut GraphEdit,
    report: &mut PrecisionReport,
    t: TensorId,
    to: DType,
) -> Result<TensorId, GraphError> {
    let mut views = Vec::new();
    let mut src = t;
    while let Some(p) = e.producer(src) {
        let node = e.node(p);
        match node.inputs.first() {
            Some(&i) if node.op.is_view() => {
                views.push((node.name.clone(), node.op.clone()));
                src = i;
            }
            _ => break,
        }
    }
    let cname = fresh(e, &format!("{}.to_{to}", e.tensor(src).name));
    let mut cur = insert_cast(e, report, &cname, src, &cname, to)?;
    for (name, op) in views.into_iter().rev() {
        let vname = fresh(e, &format!("{name}.{to}"));
        cur = e.add_node(&vname, op, &[cur], &[&vname])?[0];
        report.rules.push(PrecisionRule::FollowsInput);
    }
    Ok(cur)
}

/// A kernel op whose float tensors are all f32 (and that has at least one).
fn convertible(graph: &ComputeGraph, n: NodeId) -> bool {
    let node = graph.node(n);
    if matches!(node.op, Op::Custom(_) | Op::Memcpy { .. }) || node.op.is_view() {
        return false;
    }
    let mut any = false;
    for &t in node.inputs.iter().chain(&node.outputs) {
        let d = graph.tensor(t).dtype;
        if d.is_float() {
            if d != DType::F32 {
                return false;
            }
            any = true;
        }
    }
    any
}

/// The tensor `t` aliases through views (itself when no view produces it).
fn source_through_views(graph: &ComputeGraph, mut t: TensorId) -> TensorId {
    while let Some(p) = graph.producer(t) {
        let node = graph.node(p);
        match node.inputs.first() {
            Some(&i) if node.op.is_view() => t = i,
            _ => break,
        }
    }
    t
}

/// The non-view nodes reading `t`, directly or through views, appended to `out` (each once).
fn kernel_readers(graph: &ComputeGraph, t: TensorId, out: &mut Vec<NodeId>) {
    let start = out.len();
    // The stack and the seen set allocate only when a view reads `t` (the usual weight has one direct reader).
    let mut stack: Vec<TensorId> = Vec::new();
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut next = Some(t);
    while let Some(t) = next.take().or_else(|| stack.pop()) {
        for &c in graph.consumers(t) {
            let node = graph.node(c);
            if node.op.is_view() {
                if seen.insert(c) {
                    stack.extend(node.outputs.iter().copied());
                }
            } else {
                out.push(c);
            }
        }
    }
    // Each reader once (a node may read `t` twice, or through two views), in O(k log k) for k readers.
    crate::stream::sort_dedup_tail(out, start);
}

/// Rule 3: every convertible elementwise node on the chain that computes a Softmax's input stays in f32.
fn mark_softmax_inputs(
    graph: &ComputeGraph,
    order: &[NodeId],
    decision: &mut SecondaryMap<NodeId, (Want, PrecisionRule)>,
) {
    let mut seen: HashSet<NodeId> = HashSet::new();
    for &s in order {
        let node = graph.node(s);
        if !matches!(node.op, Op::Softmax { .. }) {
            continue;
        }
        let mut stack: Vec<TensorId> = node.inputs.first().copied().into_iter().collect();
        while let Some(t) = stack.pop() {
            let Some(p) = graph.producer(t) else { continue };
            let pn = graph.node(p);
            if pn.op.is_view() {
                stack.extend(pn.inputs.first().copied());
                continue;
            }
            if pn.op.category() != OpCategory::Elementwise
                || matches!(pn.op, Op::Cast { .. })
                || !matches!(decision[p].1, PrecisionRule::Default)
                || !seen.insert(p)
            {
                continue;
            }
            decision[p] = (Want::Is(DType::F32), PrecisionRule::SoftmaxInput { softmax: node.name.to_string() });
            stack.extend(pn.inputs.iter().copied().filter(|&i| graph.tensor(i).dtype.is_float()));
        }
    }
}

/// Little-endian f32 bytes -> little-endian half bytes (round to nearest even, as the numeric rule says).
pub fn convert_f32_bytes(bytes: &[u8], to: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for c in bytes.chunks_exact(4) {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        match to {
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            _ => out.extend_from_slice(c),
        }
    }
    out
}

#[cfg(test)]
mod tests;
