//! CUDA C code generation: one kernel source per plan kernel.
//!
//! Kernel shapes:
//! - **per-element** kernels ([`emit`]): one thread per output element. Used for fused elementwise programs
//!   (numpy broadcasting, views, BatchNormalization), data movement (Transpose, Slice, Concat, Gather, Expand, Pad,
//!   Split), direct Conv, pools, and a plain MatMul/Gemm fallback. Every value is computed *at a linear index of
//!   its own shape*, so fused producers, broadcasts and views compose without intermediate buffers.
//! - **row** kernels ([`reduce`]): one block per output row, threads stride over the row, warp shuffles and one
//!   shared-memory step combine partial results (ReduceSum/Mean/Max, Softmax, LayerNormalization,
//!   GlobalAveragePool).
//! - **cuBLAS** anchors: a MatMul/Gemm whose operands are plain f32, f16 or bf16 buffers runs as one
//!   (strided-batched) cuBLAS GEMM with f32 compute into its output buffer, followed by a per-element epilogue
//!   kernel for Gemm's C term and fused epilogue ops (see [`BlasStep`] for where a half product may land). An f32
//!   product whose epilogue is a bias and/or a Relu or tanh Gelu is one cuBLASLt call with that epilogue and no
//!   launch ([`LtEpilogue`]); a kernel's calls of one shape are one pointer-array call ([`gemm_launches`]).
//! - **attention** kernels ([`attention`]): a fused `MatMul -> [scale] -> [mask] -> Softmax -> MatMul` chain
//!   (f32, or half with its casts) as a per-element kernel whose output elements each run an online softmax over
//!   tiles of keys: the scores are never stored. Head-split and head-merge transposes index through as usual.
//! - **custom** kernels: the user's source and entry point, arguments in input then output order.
//!
//! Sources depend only on shapes, dtypes and attributes, never on buffer offsets or kernel ids: every buffer is a
//! kernel parameter and the entry point is always [`ENTRY`], so repeated patterns (the layers of a transformer)
//! produce identical text and the compile cache compiles them once. Generation never panics: anything it cannot
//! express is [`CudaError::Unsupported`] naming the kernel and the op.

pub(crate) mod attention;
pub(crate) mod emit;
pub(crate) mod layout;
pub(crate) mod reduce;

pub use layout::Store as PermutedStore;

use graph_plan::{Access, BufferRef, DType, ExecutionPlan, FusionCaps, GroupKind, Kernel, KernelId, Op, ValueId};

use crate::blas::{ColMajorGemm, GemmType, GemmTypes, Matmul};
use crate::device::ParamKind;
use crate::error::{CudaError, CudaResult};

/// The entry point of every generated kernel.
pub const ENTRY: &str = "cuplan_kernel";

/// Threads per block of per-element kernels.
pub const ELEMENT_BLOCK: u32 = 256;
/// Threads per block of row kernels (8 warps).
pub const ROW_BLOCK: u32 = 256;

/// How a generated kernel is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// One thread per element of `threads`, in blocks of `block`.
    Elements {
        /// Threads needed.
        threads: u64,
        /// Block size.
        block: u32,
    },
    /// One block of `block` threads per row.
    Rows {
        /// Number of rows (blocks).
        rows: u64,
        /// Block size.
        block: u32,
    },
    /// Fixed dimensions (custom kernels).
    Fixed {
        /// Grid.
        grid: [u32; 3],
        /// Block.
        block: [u32; 3],
        /// Dynamic shared memory bytes.
        shared_mem_bytes: u32,
    },
    /// No kernel launch (a plain cuBLAS call does all the work).
    None,
}

/// A cuBLAS product that runs before the kernel's own launch.
///
/// Numerics (one rule with exec-sim: compute in f32, round on every store to the value's dtype): the product
/// accumulates in f32 and `alpha` is applied in f32; the result is rounded once, when cuBLAS stores it, to the
/// type of `c`'s buffer (`matmul.types.c`). That buffer is the anchor output's own (its dtype: a half product is
/// rounded exactly where exec-sim rounds the MatMul/Gemm value), or, with a fused epilogue, a final output of the
/// same shape that the epilogue rewrites in place: one of the anchor's dtype, or an f32 one (a half anchor
/// followed by a cast to f32), in which case the product is stored in f32 and the epilogue rounds it to the
/// anchor's dtype before using it. A half Gemm with a C term stores its product in f32 or not at all: exec-sim
/// rounds `alpha * AB + beta * C` once, so a half product rounded before the C term is added would round twice;
/// such an anchor without an f32 output to borrow runs as a generated per-element kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlasStep {
    /// The row-major product (alpha applied, beta 0: C terms are added by the epilogue), with its element types.
    pub matmul: Matmul,
    /// Operand A's buffer.
    pub a: BufferRef,
    /// Operand B's buffer.
    pub b: BufferRef,
    /// Where the product goes.
    pub c: BufferRef,
    /// With a permuted epilogue: the product stored straight into the permuted output, one strided batch over
    /// the heads per batch index ([`layout`]); `matmul` still describes the product.
    pub store: Option<PermutedStore>,
    /// A bias and/or activation cuBLASLt applies before the store ([`LtEpilogue`]): the step is one
    /// `cublasLtMatmul` and `c` is the kernel's output, so no epilogue kernel runs.
    pub lt: Option<LtEpilogue>,
    /// With a selection epilogue (`FusionCaps::select_epilogue`): the buffer of each part, by part index. The
    /// permuted store's part loop (output step 0) then writes each part into its own buffer; `c` is the first.
    pub parts: Option<Parts>,
}

/// The output buffer of each selected part of a selection epilogue (`layout::Selected`): the calls of the
/// other parts are skipped (a class token of 197 rows computes one row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    /// (part index, its output buffer), `count` used.
    pub selected: [(usize, BufferRef); layout::MAX_PARTS],
    /// How many parts are selected.
    pub count: usize,
}

impl Parts {
    /// The buffer of part `p`, when it is selected.
    #[must_use]
    pub fn buffer(&self, p: usize) -> Option<BufferRef> {
        self.selected[..self.count.min(layout::MAX_PARTS)].iter().find(|(i, _)| *i == p).map(|&(_, b)| b)
    }
}

/// The activation of an [`LtEpilogue`] (`CUBLASLT_EPILOGUE_RELU*`, `CUBLASLT_EPILOGUE_GELU*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LtActivation {
    /// None.
    None,
    /// `max(x, 0)`.
    Relu,
    /// GELU's tanh form (ONNX Gelu `approximate="tanh"`), the one cuBLASLt computes; the erf form keeps its
    /// generated epilogue.
    GeluTanh,
}

/// What cuBLASLt adds to an f32 product before it stores it: `act(alpha * A.B + residual + bias)`, the bias one
/// value per column of the row-major product (per row of cuBLAS's column-major result, which is what
/// `CUBLASLT_EPILOGUE_BIAS` broadcasts), from a MatMul followed by `Add(., bias[n])` or a Gemm's `C[n]` with
/// `beta` 1; the residual a tensor of the product's shape added to it (cuBLASLt's C with `beta` 1: a residual
/// connection after a projection); then an optional Relu or tanh Gelu. Only f32 products take it: with half
/// operands exec-sim rounds the product to half before adding the bias, and cuBLASLt would round once, after it.
/// In f32 the sums may be associated differently from the graph's order (within f32 rounding, as cuBLAS's own
/// sum order is).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LtEpilogue {
    /// The `n` f32 bias values, or `None`.
    pub bias: Option<BufferRef>,
    /// An f32 tensor of the product's shape, row-major, added before the activation, or `None`.
    pub residual: Option<BufferRef>,
    /// The activation after the bias.
    pub activation: LtActivation,
}

/// One cuBLAS call of a [`BlasStep`]: a column-major GEMM and its operands in `Blas::gemm`'s order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlasCall {
    /// The call.
    pub gemm: ColMajorGemm,
    /// Column-major A.
    pub a: BufferRef,
    /// Column-major B.
    pub b: BufferRef,
    /// C.
    pub c: BufferRef,
}

impl BlasStep {
    /// The calls that compute the product, in order: the one row-major product with its operands swapped
    /// (`Matmul::to_col_major`), or a permuted store's call per batch index, each on its part of the buffers.
    /// The executor and the host emulator both run exactly these.
    #[must_use]
    pub fn calls(&self) -> Vec<BlasCall> {
        let Some(s) = self.store else {
            return vec![BlasCall { gemm: self.matmul.to_col_major(), a: self.b, b: self.a, c: self.c }];
        };
        let (ab, c) = (s.gemm.types.ab.size(), s.gemm.types.c.size());
        s.offsets_parts()
            .into_iter()
            .filter_map(|(xo, wo, co, p)| {
                let base = match self.parts {
                    Some(parts) => parts.buffer(p)?,
                    None => self.c,
                };
                let x = skip(self.a, xo.saturating_mul(ab));
                let w = skip(self.b, wo.saturating_mul(ab));
                let c = skip(base, co.saturating_mul(c));
                let (a, b) = if s.weight_first { (w, x) } else { (x, w) };
                Some(BlasCall { gemm: s.gemm, a, b, c })
            })
            .collect()
    }

    /// How many cuBLAS calls [`BlasStep::calls`] makes.
    #[must_use]
    pub fn call_count(&self) -> usize {
        match (self.store, self.parts) {
            (Some(_), Some(_)) => self.calls().len(),
            (Some(s), None) => s.calls(),
            (None, _) => 1,
        }
    }
}

/// Most matrix products one pointer-array call ([`GemmLaunch::Pointers`]) takes: far below cuBLAS's `int`
/// batch count, and 48 KiB of pointers at most.
pub const MAX_POINTER_PRODUCTS: usize = 2048;

/// One cuBLAS call the executor enqueues for a kernel, as [`gemm_launches`] plans them.
#[derive(Clone, Debug, PartialEq)]
pub enum GemmLaunch {
    /// A call of [`BlasStep::calls`] as it is: plain or strided-batched.
    Strided(BlasCall),
    /// One `cublasLtMatmul` (batch 1) with its bias and activation applied before the store.
    Lt(BlasCall, LtEpilogue),
    /// Several calls of one shape (the same column-major sizes, leading dimensions, transposes, scale and types)
    /// as one `cublasGemmBatchedEx` over arrays of operand addresses: sibling products (the Q, K and V
    /// projections of one input), and the loops of calls of a permuted store. `gemm` describes one matrix
    /// product (`batch` 1); `operands` holds each product's column-major A, B and C, every strided batch
    /// expanded into its matrices. The arrays are written once, at prepare (the pool does not move).
    Pointers {
        /// One product's shape, `batch` 1.
        gemm: ColMajorGemm,
        /// Column-major A, B and C of each product.
        operands: Vec<[BufferRef; 3]>,
    },
}

impl GemmLaunch {
    /// The matrix products this call computes.
    #[must_use]
    pub fn products(&self) -> usize {
        match self {
            Self::Strided(c) | Self::Lt(c, _) => c.gemm.batch,
            Self::Pointers { operands, .. } => operands.len(),
        }
    }
}

/// The cuBLAS calls that compute `steps`, in order: the calls of every step ([`BlasStep::calls`]), with the calls
/// of one shape merged into one pointer-array call ([`GemmLaunch::Pointers`]), placed where the first of them
/// was. Merging is sound because the products are independent: every C is written by one product only (the code
/// generator checks that no product's C overlaps another's or anything the kernel reads) and beta is 0. A shape
/// with one call keeps its strided call (no arrays); more than [`MAX_POINTER_PRODUCTS`] products stay separate
/// calls. A step with a cuBLASLt epilogue is its own [`GemmLaunch::Lt`] call, first.
#[must_use]
pub fn gemm_launches(steps: &[BlasStep]) -> Vec<GemmLaunch> {
    let mut out = Vec::new();
    for s in steps {
        if let Some(lt) = s.lt {
            out.extend(s.calls().into_iter().map(|c| GemmLaunch::Lt(c, lt)));
        }
    }
    let calls: Vec<BlasCall> = steps.iter().filter(|s| s.lt.is_none()).flat_map(BlasStep::calls).collect();
    // One matrix of a call: the call with batch 1 (strides then mean nothing and are zeroed).
    let shape = |g: &ColMajorGemm| ColMajorGemm { batch: 1, stride_a: 0, stride_b: 0, stride_c: 0, ..*g };
    let mut groups: Vec<(ColMajorGemm, Vec<usize>)> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let key = shape(&c.gemm);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    for (gemm, members) in groups {
        let products: usize = members.iter().map(|&i| calls[i].gemm.batch).sum();
        if members.len() == 1 || products > MAX_POINTER_PRODUCTS {
            out.extend(members.iter().map(|&i| GemmLaunch::Strided(calls[i])));
            continue;
        }
        let (ab, cs) = (gemm.types.ab.size(), gemm.types.c.size());
        let operands = members
            .iter()
            .flat_map(|&i| {
                let c = calls[i];
                (0..c.gemm.batch).map(move |p| {
                    [
                        skip(c.a, p.saturating_mul(c.gemm.stride_a).saturating_mul(ab)),
                        skip(c.b, p.saturating_mul(c.gemm.stride_b).saturating_mul(ab)),
                        skip(c.c, p.saturating_mul(c.gemm.stride_c).saturating_mul(cs)),
                    ]
                })
            })
            .collect();
        out.push(GemmLaunch::Pointers { gemm, operands });
    }
    out
}

/// `r` without its first `bytes` bytes (empty past its end: the call's extent check then refuses it).
fn skip(r: BufferRef, bytes: usize) -> BufferRef {
    let b = u64::try_from(bytes).unwrap_or(u64::MAX).min(r.bytes);
    BufferRef { region: r.region, offset: r.offset + b, bytes: r.bytes - b }
}

/// The generated code of one plan kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSource {
    /// The plan kernel.
    pub kernel: KernelId,
    /// Its display name (the NVRTC program name, e.g. `k3`).
    pub name: String,
    /// The entry point in `source`.
    pub entry: String,
    /// CUDA C source (empty when `launch` is `Launch::None`).
    pub source: String,
    /// Kernel parameters, in order.
    pub params: Vec<ParamKind>,
    /// The buffer behind each parameter.
    pub args: Vec<BufferRef>,
    /// Launch shape.
    pub launch: Launch,
    /// The cuBLAS products to enqueue, in order, before the launch (several for sibling products).
    pub blas: Vec<BlasStep>,
}

impl KernelSource {
    /// A kernel whose cuBLAS products are its whole work: no source and no launch after them.
    fn cublas_only(kernel: &Kernel, blas: Vec<BlasStep>) -> Self {
        KernelSource {
            kernel: kernel.id,
            name: kernel.name.clone(),
            entry: String::new(),
            source: String::new(),
            params: Vec::new(),
            args: Vec::new(),
            launch: Launch::None,
            blas,
        }
    }
}

/// What this backend's code generator can fuse, for `PlanOptions::fusion.caps`.
///
/// Honest limits: per-element kernels take any elementwise epilogue on Conv, pools and MatMul/Gemm (an f32
/// product whose epilogue is only a bias and a Relu or tanh Gelu is one cuBLASLt call, [`LtEpilogue`]; cuBLAS anchors
/// need the epilogue to keep the anchor's shape and dtype, or to cast a half product to f32, or to end in a
/// permutation that leaves the product a strided batch of matrices ([`layout`]); sibling products each need a
/// chain of their own to one output; else the per-element fallback runs; see [`BlasStep`]) and any chain of
/// elementwise and data-movement ops (each value is indexed in its own shape); row kernels take several
/// reductions over one domain with elementwise producers and consumers, full-shaped or per-row (`reduce::fused`:
/// the decomposed LayerNormalization and Softmax are one kernel each; integer sums, means and maxima too);
/// attention kernels take the chain exec-sim runs (`attention`: per-element, online softmax). Kernel
/// parameters: 64 buffers stay far below CUDA's 4 KiB parameter limit of older drivers.
#[must_use]
pub fn fusion_caps() -> FusionCaps {
    FusionCaps {
        matmul_epilogue: true,
        gemm_epilogue: true,
        conv_epilogue: true,
        pool_epilogue: true,
        reduction_fusion: true,
        multi_output: true,
        // The per-element emitter indexes every value in its own shape, data movement included.
        injective_fusion: true,
        // cuBLAS stores the product straight into the permuted output when the permutation leaves it a strided
        // batch of matrices (head splits, a transposed key: [`layout`]); the epilogue reads it in place. Other
        // permutations fall back to the per-element product, which indexes through them.
        layout_epilogue: true,
        // Selections in an epilogue route parts of the product to outputs of their own: cuBLAS stores each part
        // into its own output (the permuted store's part loop) and the epilogue reads the part it writes
        // (`selected_product`). A Gather's index must be a plan constant (`generate_all_with`); a selection the
        // store cannot place keeps the per-element product.
        select_epilogue: true,
        // A row kernel writes a selection of its rows (a class token after the final LayerNorm) from the blocks of
        // the selected rows (`reduce::RowSelection`); the index is read at run time.
        select_rows: true,
        // Fused attention as a per-element kernel with an online softmax ([`attention`]); a body it cannot
        // express is `CudaError::Unsupported`, never a kernel.
        attention: true,
        // Producers write into their slice of an eliminated Concat's output: only buffer offsets.
        concat_elimination: true,
        // The per-element emitter computes the first pool at each position of the second's window.
        pool_chain: true,
        // Sibling products (a horizontal GEMM): one cuBLAS product each, stored where its chain's output lives,
        // and one epilogue kernel for all of them (`stored_products`); products of one shape are one
        // pointer-array call (`gemm_launches`). The activation is read once per product, not once in all.
        horizontal_gemm: true,
        // A transposed operand is cuBLAS's `op_T` (with batch strides) on the Transpose's input; a per-element
        // product indexes through it. A transposed operand of a product stored permuted (`layout`) keeps the
        // per-element product.
        operand_layout: true,
        // Kernel parameters are limited to 4 KiB before CUDA 12.1: 64 pointers stay far below.
        max_inputs: 64,
        max_ops: 64,
    }
}

/// Choices of the code generator that do not come from the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodegenOptions {
    /// Run eligible MatMul/Gemm anchors through cuBLAS (plus an epilogue kernel). Off: every product is a
    /// generated per-element kernel, for machines where libcublas cannot be loaded.
    pub cublas: bool,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        Self { cublas: true }
    }
}

/// Generates every kernel of `plan`, in kernel id order, with cuBLAS anchors.
///
/// # Errors
/// The first kernel that cannot be generated, as [`generate`].
pub fn generate_all(plan: &ExecutionPlan) -> CudaResult<Vec<KernelSource>> {
    generate_all_with(plan, &CodegenOptions::default())
}

/// [`generate_all`] with explicit options.
///
/// # Errors
/// As [`generate_with`].
pub fn generate_all_with(plan: &ExecutionPlan, options: &CodegenOptions) -> CudaResult<Vec<KernelSource>> {
    let consts = constants(plan);
    plan.kernels().iter().map(|k| generate_in(k, options, &consts)).collect()
}

/// The plan's scalar integer constants by buffer: the indices of Gather selections, which a selection epilogue
/// must know when it is generated (which part goes to which output).
type Constants = std::collections::HashMap<BufferRef, i64>;

fn constants(plan: &ExecutionPlan) -> Constants {
    plan.bindings()
        .iter()
        .filter(|b| b.role == graph_plan::BindingRole::Constant && b.shape.numel() == Some(1))
        .filter_map(|b| {
            let d = b.data.as_deref()?;
            let v = match b.dtype {
                DType::I64 => i64::from_le_bytes(d.get(..8)?.try_into().ok()?),
                DType::I32 => i64::from(i32::from_le_bytes(d.get(..4)?.try_into().ok()?)),
                _ => return None,
            };
            Some((b.buffer, v))
        })
        .collect()
}

/// Generates the code of one plan kernel, with cuBLAS anchors.
///
/// # Errors
/// [`CudaError::Unsupported`] naming the kernel and what it cannot express.
pub fn generate(kernel: &Kernel) -> CudaResult<KernelSource> {
    generate_with(kernel, &CodegenOptions::default())
}

/// [`generate`] with explicit options.
///
/// # Errors
/// As [`generate`].
pub fn generate_with(kernel: &Kernel, options: &CodegenOptions) -> CudaResult<KernelSource> {
    generate_in(kernel, options, &Constants::new())
}

/// [`generate_with`] knowing the plan's scalar constants (without them a selection epilogue of Gathers keeps its
/// per-element product).
fn generate_in(kernel: &Kernel, options: &CodegenOptions, consts: &Constants) -> CudaResult<KernelSource> {
    let mut src = match kernel.kind {
        GroupKind::Custom => custom(kernel),
        GroupKind::Copy => Err(unsupported(kernel, "a copy group has no kernel (it is a Copy step)")),
        GroupKind::Reduction => reduce::generate(kernel),
        GroupKind::Anchor => match if options.cublas { blas_anchor(kernel, consts)? } else { None } {
            Some(s) => Ok(s),
            None => emit::generate(kernel, None),
        },
        GroupKind::Elementwise | GroupKind::DataMovement => emit::generate(kernel, None),
        GroupKind::Attention => attention::generate(kernel),
    }?;
    src.kernel = kernel.id;
    src.name.clone_from(&kernel.name);
    Ok(src)
}

pub(crate) fn unsupported(kernel: &Kernel, what: impl Into<String>) -> CudaError {
    CudaError::Unsupported { kernel: kernel.name.clone(), what: what.into() }
}

/// The buffer parameters of a kernel: one per distinct buffer, reads first, in param order.
pub(crate) struct Buffers {
    /// Distinct buffers.
    pub list: Vec<BufferRef>,
    /// For each kernel param (same order as `kernel.params`), its index in `list`.
    pub of_param: Vec<usize>,
    /// Whether any param of this buffer is written.
    pub written: Vec<bool>,
    /// The dtype each buffer is declared with.
    pub dtype: Vec<DType>,
}

impl Buffers {
    pub(crate) fn of(kernel: &Kernel) -> CudaResult<Self> {
        let mut b = Buffers { list: Vec::new(), of_param: Vec::new(), written: Vec::new(), dtype: Vec::new() };
        for p in &kernel.params {
            let dtype = value_checked(kernel, p.value)?.dtype;
            let i = match b.list.iter().position(|x| *x == p.buffer) {
                Some(i) => {
                    if b.dtype[i] != dtype {
                        return Err(unsupported(
                            kernel,
                            format!("buffer {} bound as {} and {dtype}", p.buffer, b.dtype[i]),
                        ));
                    }
                    i
                }
                None => {
                    b.list.push(p.buffer);
                    b.written.push(false);
                    b.dtype.push(dtype);
                    b.list.len() - 1
                }
            };
            if p.access == Access::Write {
                b.written[i] = true;
            }
            b.of_param.push(i);
        }
        Ok(b)
    }

    /// Whether buffer `i` shares bytes with another parameter (then it must not be `__restrict__`).
    fn aliased(&self, i: usize) -> bool {
        self.list.iter().enumerate().any(|(j, other)| j != i && other.overlaps(&self.list[i]))
    }

    /// The C parameter list.
    pub(crate) fn signature(&self) -> String {
        let mut parts = Vec::new();
        for (i, d) in self.dtype.iter().enumerate() {
            let ty = emit::storage_type(*d);
            let restrict = if self.aliased(i) { "" } else { " __restrict__" };
            let konst = if self.written[i] { "" } else { "const " };
            parts.push(format!("{konst}{ty}*{restrict} b{i}"));
        }
        parts.join(", ")
    }

    pub(crate) fn params(&self) -> Vec<ParamKind> {
        vec![ParamKind::Ptr; self.list.len()]
    }
}

pub(crate) fn value_checked(kernel: &Kernel, v: ValueId) -> CudaResult<&graph_plan::Value> {
    kernel.values.get(v.index()).ok_or_else(|| unsupported(kernel, format!("value {v} is out of range")))
}

fn custom(kernel: &Kernel) -> CudaResult<KernelSource> {
    let [instr] = kernel.body.as_slice() else {
        return Err(unsupported(kernel, "a custom kernel must run exactly one node"));
    };
    let Op::Custom(c) = &instr.op else {
        return Err(unsupported(kernel, format!("custom group runs {}", instr.op.name())));
    };
    crate::error::check_identifier("entry point", &c.entry)?;
    // Arguments: the node's inputs, then its outputs, each the buffer bound to that value.
    let mut args = Vec::new();
    for (&v, access) in
        instr.inputs.iter().map(|v| (v, Access::Read)).chain(instr.outputs.iter().map(|v| (v, Access::Write)))
    {
        let p = kernel
            .param_of(v, access)
            .ok_or_else(|| unsupported(kernel, format!("custom kernel operand {v} has no buffer")))?;
        args.push(p.buffer);
    }
    Ok(KernelSource {
        kernel: kernel.id,
        name: kernel.name.clone(),
        entry: c.entry.clone(),
        source: c.source.clone(),
        params: vec![ParamKind::Ptr; args.len()],
        args,
        launch: Launch::Fixed { grid: c.grid, block: c.block, shared_mem_bytes: c.shared_mem_bytes },
        blas: Vec::new(),
    })
}

/// A MatMul/Gemm anchor as a cuBLAS call plus an epilogue kernel, when its operands allow it.
fn blas_anchor(kernel: &Kernel, consts: &Constants) -> CudaResult<Option<KernelSource>> {
    // The product, after its operand layouts (`FusionCaps::operand_layout`: Transposes of its operands).
    let Some(at) = kernel.body.iter().position(|i| matches!(i.op, Op::MatMul | Op::Gemm { .. } | Op::Conv(_))) else {
        return Ok(None);
    };
    let (prologue, first) = (&kernel.body[..at], &kernel.body[at]);
    // Sibling products (a horizontal GEMM): one cuBLAS product each, stored where its own chain's output lives,
    // and one epilogue kernel for all of them; else the per-element kernel computes each.
    let anchors: Vec<&graph_plan::Instr> =
        kernel.body.iter().filter(|i| matches!(i.op, Op::MatMul | Op::Gemm { .. } | Op::Conv(_))).collect();
    if anchors.len() > 1 {
        return stored_products(kernel, &anchors);
    }
    let (alpha, has_c, trans_a, trans_b) = match &first.op {
        Op::MatMul => (1.0, false, false, false),
        Op::Gemm { alpha, trans_a, trans_b, .. } => (*alpha, first.inputs.len() == 3, *trans_a, *trans_b),
        // A pointwise Conv is a product (`conv_as_matmul`); its bias is the epilogue's C term.
        Op::Conv(_) if prologue.is_empty() => (1.0, first.inputs.len() == 3, false, false),
        _ => return Ok(None),
    };
    let (Some(&v0), Some(&v1), Some(&vy)) = (first.inputs.first(), first.inputs.get(1), first.outputs.first()) else {
        return Ok(None);
    };
    // A Conv's product is weight x input: the weight is the left operand.
    let (va, vb) = if matches!(first.op, Op::Conv(_)) { (v1, v0) } else { (v0, v1) };
    // An operand read through its layout is the Transpose's input, used transposed.
    let (Some((va, ta)), Some((vb, tb))) = (through_layout(kernel, prologue, va), through_layout(kernel, prologue, vb))
    else {
        return Ok(None);
    };
    let (trans_a, trans_b) = (trans_a ^ ta, trans_b ^ tb);
    let (a, b, y) = (value_checked(kernel, va)?, value_checked(kernel, vb)?, value_checked(kernel, vy)?);
    // f32, f16 or bf16 operands of one type, and the anchor computing in it (ops do not mix float dtypes; the
    // precision transform inserts casts instead).
    let Some(ab) = GemmType::of(a.dtype) else {
        return Ok(None);
    };
    if b.dtype != a.dtype || y.dtype != a.dtype {
        return Ok(None);
    }
    let (Some(pa), Some(pb)) = (kernel.param_of(va, Access::Read), kernel.param_of(vb, Access::Read)) else {
        return Ok(None);
    };
    let spec = match &first.op {
        Op::Conv(attrs) => conv_as_matmul(attrs, a.shape.dims(), b.shape.dims(), y.shape.dims()),
        _ => matmul_spec(a.shape.dims(), b.shape.dims(), y.shape.dims(), trans_a, trans_b, alpha),
    };
    let Some(mut mm) = spec else {
        return Ok(None);
    };
    if let Some(src) = lt_anchor(kernel, at, [pa.buffer, pb.buffer], vy, mm, has_c)? {
        return Ok(Some(src));
    }
    // A permuted epilogue: cuBLAS stores the product straight into the permuted output, where the epilogue reads
    // it at the index it writes.
    // A selection epilogue: each part stored by cuBLAS into its own output.
    if prologue.is_empty() && kernel.body.iter().any(|i| matches!(i.op, Op::Split { .. } | Op::Gather { .. })) {
        if let Some(src) = selected_product(kernel, first, consts)? {
            return Ok(Some(src));
        }
    }
    if prologue.is_empty() && layout::chain_output(kernel, vy).is_some_and(|c| c.factors.is_some()) {
        if let Some(src) = stored_products(kernel, &[first])? {
            return Ok(Some(src));
        }
    }
    // Where the product lands: the anchor output's own buffer, or (fused epilogue) the buffer of a final output
    // of the same shape, which the epilogue then rewrites in place element by element: one of the anchor's dtype,
    // else an f32 one (a half anchor cast to f32), which takes the product unrounded (see `BlasStep`).
    let borrowed = |dtype: DType| {
        kernel
            .params
            .iter()
            .filter(|p| p.access == Access::Write)
            .find(|p| kernel.values.get(p.value.index()).is_some_and(|v| v.shape == y.shape && v.dtype == dtype))
            .map(|p| (p.buffer, dtype))
    };
    let target = kernel
        .param_of(vy, Access::Write)
        .map(|p| (p.buffer, y.dtype))
        .or_else(|| borrowed(y.dtype))
        .or_else(|| borrowed(DType::F32));
    let Some((c_buf, c_dtype)) = target else {
        return Ok(None);
    };
    let Some(c_type) = GemmType::of(c_dtype) else {
        return Ok(None);
    };
    // A half product rounded on the store and then added to a C term would round twice (exec-sim rounds
    // `alpha * AB + beta * C` once): such a Gemm stores its product in f32 or runs as a generated kernel.
    if has_c && c_type != GemmType::F32 {
        return Ok(None);
    }
    mm.types = GemmTypes { ab, c: c_type };
    // The product must not overwrite anything the kernel still reads (its operands, a residual read in place).
    if kernel.params.iter().any(|p| p.access == Access::Read && p.buffer.overlaps(&c_buf)) {
        return Ok(None);
    }
    // When the epilogue rewrites the product's buffer (a C term, or the product borrowing a final output's
    // buffer), every thread must read the product only at the index it writes: all outputs have its shape and
    // no data movement (a permuted epilogue, `FusionCaps::layout_epilogue`) reads it at another index.
    let epilogue = &kernel.body[at + 1..];
    let moves = epilogue.iter().any(|i| i.op.category() == graph_plan::ir::OpCategory::DataMovement);
    if (has_c || kernel.param_of(vy, Access::Write).is_none())
        && (moves
            || kernel
                .params
                .iter()
                .filter(|p| p.access == Access::Write)
                .any(|p| kernel.values.get(p.value.index()).is_none_or(|v| v.shape != y.shape)))
    {
        return Ok(None);
    }
    let blas = vec![BlasStep { matmul: mm, a: pa.buffer, b: pb.buffer, c: c_buf, store: None, lt: None, parts: None }];
    let needs_epilogue = has_c || !epilogue.is_empty() || kernel.param_of(vy, Access::Write).is_none();
    if !needs_epilogue {
        return Ok(Some(KernelSource::cublas_only(kernel, blas)));
    }
    let mut src = emit::generate(kernel, Some((vy, c_buf, c_dtype)))?;
    src.blas = blas;
    Ok(Some(src))
}

/// An f32 MatMul/Gemm whose whole epilogue cuBLASLt applies ([`LtEpilogue`]): the kernel's body is the product,
/// then at most a bias (`Add` of a `[n]` / `[1, .., n]` input, or the Gemm's C of that shape with `beta` 1), then
/// at most a Relu or tanh Gelu, each reading the one before, the last the kernel's only output, of the product's
/// shape. A batch of products over one shared weight is one product of `batch * m` rows. One `cublasLtMatmul`
/// then writes the output and nothing is launched. `None` for anything else (the caller goes on).
fn lt_anchor(
    kernel: &Kernel,
    at: usize,
    [a, b]: [BufferRef; 2],
    vy: ValueId,
    mut mm: Matmul,
    has_c: bool,
) -> CudaResult<Option<KernelSource>> {
    let first = &kernel.body[at];
    let y = value_checked(kernel, vy)?;
    let f32_value = |v: ValueId| kernel.values.get(v.index()).is_some_and(|x| x.dtype == DType::F32);
    if !matches!(first.op, Op::MatMul | Op::Gemm { .. }) || !first.inputs.iter().all(|&v| f32_value(v)) {
        return Ok(None);
    }
    let n = mm.n;
    // A `[n]` / `[1, .., 1, n]` f32 input read whole from its buffer.
    let bias_of = |v: ValueId| -> Option<BufferRef> {
        let x = kernel.values.get(v.index())?;
        let dims = x.shape.dims();
        let last = *dims.last()?;
        let p = kernel.param_of(v, Access::Read)?;
        (x.dtype == DType::F32 && last == n && dims.iter().product::<usize>() == n && p.buffer.bytes >= 4 * n as u64)
            .then_some(p.buffer)
    };
    // An f32 input of the product's own shape, read whole from its buffer (a residual).
    let numel = y.shape.dims().iter().product::<usize>();
    let residual_of = |v: ValueId| -> Option<BufferRef> {
        let x = kernel.values.get(v.index())?;
        let p = kernel.param_of(v, Access::Read)?;
        (x.dtype == DType::F32 && x.shape == y.shape && p.buffer.bytes >= 4 * numel as u64).then_some(p.buffer)
    };
    let (mut bias, mut residual) = (None, None);
    if has_c {
        let beta = match first.op {
            Op::Gemm { beta, .. } => beta,
            _ => 0.0,
        };
        match first.inputs.get(2).copied().and_then(bias_of) {
            Some(b) if beta == 1.0 => bias = Some(b),
            _ => return Ok(None),
        }
    }
    let mut activation = LtActivation::None;
    let mut cur = vy;
    for instr in &kernel.body[at + 1..] {
        if !instr.inputs.contains(&cur) || instr.outputs.len() != 1 || kernel.param_of(cur, Access::Write).is_some() {
            return Ok(None);
        }
        match (&instr.op, instr.inputs.as_slice()) {
            (Op::Add, &[l, r]) if activation == LtActivation::None => {
                let other = if l == cur { r } else { l };
                if other == cur {
                    return Ok(None);
                }
                match (bias_of(other), residual_of(other)) {
                    (Some(b), _) if bias.is_none() => bias = Some(b),
                    (_, Some(c)) if residual.is_none() => residual = Some(c),
                    _ => return Ok(None),
                }
            }
            (Op::Relu, &[_]) if activation == LtActivation::None => activation = LtActivation::Relu,
            (Op::Gelu { approximate: graph_plan::op::GeluApprox::Tanh }, &[_]) if activation == LtActivation::None => {
                activation = LtActivation::GeluTanh;
            }
            _ => return Ok(None),
        }
        cur = instr.outputs[0];
    }
    if bias.is_none() && residual.is_none() && activation == LtActivation::None {
        return Ok(None);
    }
    let out = value_checked(kernel, cur)?;
    let written: Vec<&graph_plan::Param> = kernel.params.iter().filter(|p| p.access == Access::Write).collect();
    let (Some(po), [_]) = (kernel.param_of(cur, Access::Write), written.as_slice()) else {
        return Ok(None);
    };
    if out.dtype != DType::F32 || out.shape != y.shape {
        return Ok(None);
    }
    // The output must not overlap anything the call reads.
    if kernel.params.iter().any(|p| p.access == Access::Read && p.buffer.overlaps(&po.buffer)) {
        return Ok(None);
    }
    // A batch over one weight with contiguous activations and outputs is one product of all the rows.
    if mm.batch > 1 && mm.stride_b == 0 && !mm.trans_a && mm.stride_a == mm.m * mm.k && mm.stride_c == mm.m * mm.n {
        mm = Matmul {
            m: mm.m * mm.batch,
            batch: 1,
            stride_a: mm.m * mm.batch * mm.k,
            stride_c: mm.m * mm.batch * n,
            ..mm
        };
    }
    if mm.batch != 1 {
        return Ok(None);
    }
    mm.types = GemmTypes::F32;
    let step = BlasStep {
        matmul: mm,
        a,
        b,
        c: po.buffer,
        store: None,
        lt: Some(LtEpilogue { bias, residual, activation }),
        parts: None,
    };
    let fits = |r: BufferRef| usize::try_from(r.bytes).unwrap_or(usize::MAX);
    if step.calls().iter().any(|c| c.gemm.check(fits(c.a), fits(c.b), fits(c.c)).is_err()) {
        return Ok(None);
    }
    Ok(Some(KernelSource::cublas_only(kernel, vec![step])))
}

/// The value a product reads for its operand `v`, and whether it reads it transposed: `v` itself, or, when an
/// operand layout in `prologue` (a Transpose of the last two axes, `FusionCaps::operand_layout`) computes `v`,
/// that Transpose's input. `None` for anything else the prologue computes.
fn through_layout(kernel: &Kernel, prologue: &[graph_plan::Instr], v: ValueId) -> Option<(ValueId, bool)> {
    let Some(t) = prologue.iter().find(|i| i.outputs.contains(&v)) else {
        return Some((v, false));
    };
    let swaps = match &t.op {
        Op::Transpose { perm: None } => kernel.values.get(v.index()).is_some_and(|x| x.shape.dims().len() == 2),
        Op::Transpose { perm: Some(p) } => {
            let r = p.len();
            r >= 2 && p[..r - 2].iter().enumerate().all(|(i, &a)| a == i) && p[r - 2] == r - 1 && p[r - 1] == r - 2
        }
        _ => false,
    };
    match t.inputs.as_slice() {
        &[u] if swaps => Some((u, true)),
        _ => None,
    }
}

/// A MatMul or Gemm (neither operand transposed, the weight a matrix) whose epilogue selects parts of its result
/// (`FusionCaps::select_epilogue`, `layout::Selected`): cuBLAS stores each part straight into its own output
/// (the permuted store's part loop, [`Parts`]), and one epilogue kernel rewrites every output in place, reading
/// the part it writes; no launch when nothing but layout follows. `None` when the operands, the epilogue or the
/// placement do not allow it.
fn selected_product(
    kernel: &Kernel,
    first: &graph_plan::Instr,
    consts: &Constants,
) -> CudaResult<Option<KernelSource>> {
    let Some(PlainProduct { alpha, has_c, vy, a, b, y, ab, pa, pb }) = plain_product(kernel, first)? else {
        return Ok(None);
    };
    let index_of = |v: ValueId| kernel.param_of(v, Access::Read).and_then(|p| consts.get(&p.buffer).copied());
    let Some(sel) = layout::selected_outputs(kernel, vy, &index_of) else {
        return Ok(None);
    };
    // Every written value ends one part; the parts share a dtype: the anchor's, or f32 (see `BlasStep`).
    let ends: Vec<ValueId> = sel.ends.iter().flatten().copied().collect();
    let written: Vec<ValueId> = kernel.params.iter().filter(|p| p.access == Access::Write).map(|p| p.value).collect();
    if ends.is_empty() || written.len() != ends.len() || !written.iter().all(|v| ends.contains(v)) {
        return Ok(None);
    }
    let od = value_checked(kernel, ends[0])?.dtype;
    if ends.iter().any(|&e| kernel.values.get(e.index()).is_none_or(|x| x.dtype != od))
        || (od != y.dtype && od != DType::F32)
    {
        return Ok(None);
    }
    let Some(c_type) = GemmType::of(od) else {
        return Ok(None);
    };
    if has_c && c_type != GemmType::F32 {
        return Ok(None);
    }
    let (ad, bd, yd) = (a.shape.dims(), b.shape.dims(), y.shape.dims());
    let Some(mm) = matmul_spec(ad, bd, yd, false, false, alpha) else {
        return Ok(None);
    };
    if bd.len() != 2 || ad.len() != yd.len() || yd.len() < 2 || ad[..ad.len() - 2] != yd[..yd.len() - 2] {
        return Ok(None);
    }
    let types = GemmTypes { ab, c: c_type };
    let Some(mut store) = layout::Store::of(&yd[..yd.len() - 2], mm.m, mm.n, mm.k, &sel.factors, types) else {
        return Ok(None);
    };
    store.gemm.alpha = mm.alpha;
    let mut picked: Vec<(usize, BufferRef)> = Vec::new();
    for (p, end) in sel.ends.iter().enumerate() {
        if let Some(e) = end {
            let b = kernel
                .param_of(*e, Access::Write)
                .ok_or_else(|| unsupported(kernel, format!("part {e} has no buffer")))?;
            picked.push((p, b.buffer));
        }
    }
    let Some(&(_, c)) = picked.first() else {
        return Ok(None);
    };
    if picked.len() > layout::MAX_PARTS {
        return Ok(None);
    }
    let mut selected = [(0, c); layout::MAX_PARTS];
    selected[..picked.len()].copy_from_slice(&picked);
    let step = BlasStep {
        matmul: Matmul { types, ..mm },
        a: pa,
        b: pb,
        c,
        store: Some(store),
        lt: None,
        parts: Some(Parts { selected, count: picked.len() }),
    };
    // Every part's calls in bounds; no part overlaps another or anything the kernel reads.
    let fits = |r: BufferRef| usize::try_from(r.bytes).unwrap_or(usize::MAX);
    let calls = step.calls();
    if calls.is_empty() || calls.iter().any(|c| c.gemm.check(fits(c.a), fits(c.b), fits(c.c)).is_err()) {
        return Ok(None);
    }
    let outs: Vec<BufferRef> = picked.iter().map(|&(_, b)| b).collect();
    for (i, o) in outs.iter().enumerate() {
        if kernel.params.iter().any(|p| p.access == Access::Read && p.buffer.overlaps(o))
            || outs[..i].iter().any(|q| q.overlaps(o))
        {
            return Ok(None);
        }
    }
    let blas = vec![step];
    if sel.layout_only && !has_c && od == y.dtype {
        return Ok(Some(KernelSource::cublas_only(kernel, blas)));
    }
    let read = (vy, c, od, Some(sel.factors), Some((sel.part, picked)));
    let mut src = emit::generate_stored(kernel, vec![read])?;
    src.blas = blas;
    Ok(Some(src))
}

/// One product of [`stored_products`]: its cuBLAS step, how the epilogue finds it, and whether anything but its
/// layout lies between it and its output.
struct StoredProduct {
    step: BlasStep,
    read: emit::Stored,
    end: ValueId,
    bare: bool,
}

/// A MatMul or Gemm with neither operand transposed, both operands read from buffers of one float type that the
/// product computes in: what [`stored_product`] and [`selected_product`] store through cuBLAS.
struct PlainProduct<'k> {
    alpha: f32,
    /// A Gemm with a C term.
    has_c: bool,
    vy: ValueId,
    a: &'k graph_plan::Value,
    b: &'k graph_plan::Value,
    y: &'k graph_plan::Value,
    ab: GemmType,
    pa: BufferRef,
    pb: BufferRef,
}

/// `instr` as a [`PlainProduct`], or `None`.
fn plain_product<'k>(kernel: &'k Kernel, instr: &graph_plan::Instr) -> CudaResult<Option<PlainProduct<'k>>> {
    let (alpha, has_c) = match &instr.op {
        Op::MatMul => (1.0, false),
        Op::Gemm { alpha, trans_a: false, trans_b: false, .. } => (*alpha, instr.inputs.len() == 3),
        _ => return Ok(None),
    };
    let (Some(&va), Some(&vb), Some(&vy)) = (instr.inputs.first(), instr.inputs.get(1), instr.outputs.first()) else {
        return Ok(None);
    };
    let (a, b, y) = (value_checked(kernel, va)?, value_checked(kernel, vb)?, value_checked(kernel, vy)?);
    let Some(ab) = GemmType::of(a.dtype) else {
        return Ok(None);
    };
    let (Some(pa), Some(pb)) = (kernel.param_of(va, Access::Read), kernel.param_of(vb, Access::Read)) else {
        return Ok(None);
    };
    if b.dtype != a.dtype || y.dtype != a.dtype {
        return Ok(None);
    }
    Ok(Some(PlainProduct { alpha, has_c, vy, a, b, y, ab, pa: pa.buffer, pb: pb.buffer }))
}

/// A MatMul or Gemm (neither operand transposed) stored by cuBLAS where its chain's output lives
/// ([`layout::chain_output`]): permuted ([`layout::Store`]) or in order. `None` when the operands, the chain or
/// the placement do not allow it.
fn stored_product(kernel: &Kernel, instr: &graph_plan::Instr) -> CudaResult<Option<StoredProduct>> {
    let Some(PlainProduct { alpha, has_c, vy, a, b, y, ab, pa, pb }) = plain_product(kernel, instr)? else {
        return Ok(None);
    };
    let (ad, bd, yd) = (a.shape.dims(), b.shape.dims(), y.shape.dims());
    let (Some(mm), Some(chain)) = (matmul_spec(ad, bd, yd, false, false, alpha), layout::chain_output(kernel, vy))
    else {
        return Ok(None);
    };
    let o = value_checked(kernel, chain.end)?;
    let Some(po) = kernel.param_of(chain.end, Access::Write) else {
        return Ok(None);
    };
    // The product lands in the output's buffer: in the anchor's dtype, or in f32 (a half anchor cast to f32 at
    // the end; the epilogue rounds it to the anchor's dtype first, see `BlasStep`). A half Gemm with a C term
    // stores in f32 (one rounding, after the C term).
    if o.dtype != y.dtype && o.dtype != DType::F32 {
        return Ok(None);
    }
    let Some(c_type) = GemmType::of(o.dtype) else {
        return Ok(None);
    };
    if has_c && c_type != GemmType::F32 {
        return Ok(None);
    }
    let types = GemmTypes { ab, c: c_type };
    let store = match &chain.factors {
        None => None,
        Some(factors) => {
            // The weight a plain matrix, the activation's batch dims the product's.
            if bd.len() != 2 || ad.len() != yd.len() || yd.len() < 2 || ad[..ad.len() - 2] != yd[..yd.len() - 2] {
                return Ok(None);
            }
            let Some(mut store) = layout::Store::of(&yd[..yd.len() - 2], mm.m, mm.n, mm.k, factors, types) else {
                return Ok(None);
            };
            store.gemm.alpha = mm.alpha;
            Some(store)
        }
    };
    let step = BlasStep { matmul: Matmul { types, ..mm }, a: pa, b: pb, c: po.buffer, store, lt: None, parts: None };
    let fits = |r: BufferRef| usize::try_from(r.bytes).unwrap_or(usize::MAX);
    if step.calls().iter().any(|c| c.gemm.check(fits(c.a), fits(c.b), fits(c.c)).is_err()) {
        return Ok(None);
    }
    let bare = chain.layout_only && !has_c && o.dtype == y.dtype;
    Ok(Some(StoredProduct { step, read: (vy, po.buffer, o.dtype, chain.factors, None), end: chain.end, bare }))
}

/// The kernel as cuBLAS products, each stored where its own chain's output lives (a permuted store, sibling
/// products), and one epilogue kernel that rewrites every output in place, reading each product at the element
/// it writes; no launch when nothing but layout follows any product. `None` (the caller goes on, or the
/// per-element kernel computes the products) unless every anchor stores, every written value ends one chain,
/// and no product's buffer overlaps another's or anything the kernel reads.
fn stored_products(kernel: &Kernel, anchors: &[&graph_plan::Instr]) -> CudaResult<Option<KernelSource>> {
    let mut products: Vec<StoredProduct> = Vec::with_capacity(anchors.len());
    for instr in anchors {
        match stored_product(kernel, instr)? {
            Some(p) => products.push(p),
            None => return Ok(None),
        }
    }
    let written: Vec<ValueId> = kernel.params.iter().filter(|p| p.access == Access::Write).map(|p| p.value).collect();
    let mut ends: Vec<ValueId> = products.iter().map(|p| p.end).collect();
    ends.sort_unstable();
    ends.dedup();
    if ends.len() != products.len() || written.len() != ends.len() || !written.iter().all(|v| ends.contains(v)) {
        return Ok(None);
    }
    for (i, p) in products.iter().enumerate() {
        let c = p.step.c;
        if kernel.params.iter().any(|q| q.access == Access::Read && q.buffer.overlaps(&c))
            || products[..i].iter().any(|q| q.step.c.overlaps(&c))
        {
            return Ok(None);
        }
    }
    let blas: Vec<BlasStep> = products.iter().map(|p| p.step).collect();
    if products.iter().all(|p| p.bare) {
        return Ok(Some(KernelSource::cublas_only(kernel, blas)));
    }
    let mut src = emit::generate_stored(kernel, products.into_iter().map(|p| p.read).collect())?;
    src.blas = blas;
    Ok(Some(src))
}

/// The product a pointwise Conv is, when it is one: a 1x1 window, unit strides, no padding, one group. Then
/// `Y[n] (Cout x HW) = W (Cout x Cin) . X[n] (Cin x HW)` for each image `n`, a strided batch over the images with
/// the weight shared (stride 0), in the tensors' own NCHW layout. `w`, `x`, `y`: the weight, input and output
/// dims.
pub(crate) fn conv_as_matmul(
    attrs: &graph_plan::op::ConvAttrs,
    w: &[usize],
    x: &[usize],
    y: &[usize],
) -> Option<Matmul> {
    let sp = x.len().checked_sub(2).filter(|&s| s > 0)?;
    let ones = |v: &[usize]| v.iter().all(|&d| d == 1);
    let pointwise = w.len() == x.len()
        && ones(&w[2..])
        && attrs.group <= 1
        && ones(&attrs.strides)
        && attrs.pads.iter().all(|&p| p == 0)
        && y.len() == x.len()
        && y[2..] == x[2..];
    if !pointwise || attrs.strides.len() > sp || w[1] != x[1] || y[1] != w[0] || y[0] != x[0] {
        return None;
    }
    let hw: usize = x[2..].iter().product();
    matmul_spec(&[w[0], w[1]], &[x[0], x[1], hw], &[y[0], y[1], hw], false, false, 1.0)
}

/// The row-major product for ONNX MatMul/Gemm operand shapes, when cuBLAS's strided batch can express it: equal
/// batch dims, or one side without batch dims (broadcast with stride 0).
pub(crate) fn matmul_spec(
    a: &[usize],
    b: &[usize],
    y: &[usize],
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
) -> Option<Matmul> {
    if a.len() < 2 || b.len() < 2 || y.len() < 2 {
        return None; // 1-D operands: the per-element kernel handles the promotion rules.
    }
    let (ra, ca) = (a[a.len() - 2], a[a.len() - 1]);
    let (rb, cb) = (b[b.len() - 2], b[b.len() - 1]);
    let (m, k) = if trans_a { (ca, ra) } else { (ra, ca) };
    let (k2, n) = if trans_b { (cb, rb) } else { (rb, cb) };
    if k != k2 || y[y.len() - 2] != m || y[y.len() - 1] != n || m == 0 || n == 0 || k == 0 {
        return None;
    }
    let (ba, bb, by) = (&a[..a.len() - 2], &b[..b.len() - 2], &y[..y.len() - 2]);
    let batch: usize = by.iter().product();
    let stride = |dims: &[usize], mat: usize| -> Option<usize> {
        if dims.iter().product::<usize>() == 1 {
            Some(0)
        } else if dims == by {
            Some(mat)
        } else {
            None
        }
    };
    let mut mm = Matmul::batched(batch, m, n, k);
    mm.trans_a = trans_a;
    mm.trans_b = trans_b;
    mm.alpha = alpha;
    mm.stride_a = stride(ba, m * k)?;
    mm.stride_b = stride(bb, k * n)?;
    mm.stride_c = m * n;
    if batch == 1 {
        mm.stride_a = m * k;
        mm.stride_b = k * n;
    }
    Some(mm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_specs() {
        let mm = matmul_spec(&[2, 3, 4], &[4, 5], &[2, 3, 5], false, false, 1.0).unwrap();
        assert_eq!((mm.batch, mm.m, mm.n, mm.k, mm.stride_a, mm.stride_b, mm.stride_c), (2, 3, 5, 4, 12, 0, 15));
        let mm = matmul_spec(&[4, 3], &[5, 4], &[3, 5], true, true, 0.5).unwrap();
        assert_eq!((mm.m, mm.n, mm.k, mm.trans_a, mm.trans_b, mm.alpha), (3, 5, 4, true, true, 0.5));
        // Partially broadcast batch dims are left to the per-element kernel.
        assert!(matmul_spec(&[2, 1, 3, 4], &[1, 2, 4, 5], &[2, 2, 3, 5], false, false, 1.0).is_none());
        assert!(matmul_spec(&[4], &[4, 5], &[5], false, false, 1.0).is_none());
    }

    fn buf(offset: u64, bytes: u64) -> BufferRef {
        BufferRef { region: graph_plan::Region::Pool, offset, bytes }
    }

    /// Sibling products of one shape become one pointer-array call with each product's own operands, a
    /// strided batch expanded into its matrices at its strides; a product of another shape keeps its call.
    #[test]
    fn calls_of_one_shape_share_a_pointer_array_call() {
        let x = buf(0, 4 * 4 * 8);
        let step = |w: u64, c: u64, n: usize| BlasStep {
            matmul: Matmul::new(4, n, 8),
            a: x,
            b: buf(w, 4 * 8 * n as u64),
            c: buf(c, 4 * 4 * n as u64),
            store: None,
            lt: None,
            parts: None,
        };
        let (q, k, v, o) = (step(1000, 5000, 6), step(2000, 6000, 6), step(3000, 7000, 6), step(4000, 8000, 3));
        let launches = gemm_launches(&[q, k, o, v]);
        let [GemmLaunch::Pointers { gemm, operands }, GemmLaunch::Strided(other)] = launches.as_slice() else {
            panic!("{launches:?}");
        };
        // One product's shape: strides are meaningless at batch 1 and zeroed.
        assert_eq!(*gemm, ColMajorGemm { stride_a: 0, stride_b: 0, stride_c: 0, ..q.matmul.to_col_major() });
        // Column-major A is the weight, B the activation (operands swap).
        let want: Vec<[BufferRef; 3]> = [q, k, v].iter().map(|s| [s.b, s.a, s.c]).collect();
        assert_eq!(*operands, want);
        assert_eq!(*other, o.calls()[0]);
        assert_eq!(launches.iter().map(GemmLaunch::products).sum::<usize>(), 4);
        // One product alone is its own call, no arrays.
        assert_eq!(gemm_launches(&[q]), vec![GemmLaunch::Strided(q.calls()[0])]);
        assert!(gemm_launches(&[]).is_empty());
    }

    /// A permuted store's loops of strided calls become one call over every matrix, each at its batch stride
    /// and loop offset, in bytes of its own element type.
    #[test]
    fn loops_of_strided_calls_expand_into_one_pointer_array_call() {
        let types = GemmTypes { ab: GemmType::F16, c: GemmType::F32 };
        // Batch 2, 2 heads of 4 (x [2,4,3], out [2,2,4,4]): a strided batch of 2 images, a loop of 2 heads.
        let store = layout::Store::of(&[2], 4, 8, 3, &[(2, 32), (4, 4), (2, 16), (4, 1)], types).unwrap();
        let (x, w, c) = (buf(0, 2 * 24), buf(4096, 2 * 24), buf(8192, 4 * 64));
        let step = BlasStep {
            matmul: Matmul { types, ..Matmul::batched(2, 4, 8, 3) },
            a: x,
            b: w,
            c,
            store: Some(store),
            lt: None,
            parts: None,
        };
        assert_eq!((step.call_count(), store.gemm.batch), (2, 2));
        let launches = gemm_launches(&[step]);
        let [GemmLaunch::Pointers { gemm, operands }] = launches.as_slice() else { panic!("{launches:?}") };
        assert_eq!((gemm.batch, gemm.stride_a, gemm.stride_b, gemm.stride_c), (1, 0, 0, 0));
        let off = |r: BufferRef, base: BufferRef| r.offset - base.offset;
        let got: Vec<(u64, u64, u64)> =
            operands.iter().map(|[a, b, cc]| (off(*a, w), off(*b, x), off(*cc, c))).collect();
        // Weight first: A steps by the head loop (4 columns, 2 bytes each); B by the images' stride (12
        // elements); C by the images (32 f32) and the heads (16 f32).
        assert_eq!(got, vec![(0, 0, 0), (0, 24, 128), (8, 0, 64), (8, 24, 192)]);
        // Every operand still reaches the end of its buffer, so the prepare-time checks see the real bound.
        assert!(operands.iter().all(|o| o[2].offset + o[2].bytes == c.offset + c.bytes));
    }

    #[test]
    fn pointwise_convs_are_products() {
        use graph_plan::op::ConvAttrs;
        let unit = ConvAttrs { strides: vec![1, 1], pads: vec![0; 4], dilations: vec![], group: 1 };
        let mm = conv_as_matmul(&unit, &[8, 4, 1, 1], &[2, 4, 3, 5], &[2, 8, 3, 5]).unwrap();
        assert_eq!((mm.batch, mm.m, mm.n, mm.k), (2, 8, 15, 4));
        assert_eq!((mm.stride_a, mm.stride_b, mm.stride_c), (0, 60, 120), "the weight is shared by the images");
        let one = conv_as_matmul(&ConvAttrs::default(), &[8, 4, 1], &[1, 4, 7], &[1, 8, 7]).unwrap();
        assert_eq!((one.batch, one.m, one.n, one.k), (1, 8, 7, 4));
        // A window, a stride, padding or groups make it a convolution proper.
        assert!(conv_as_matmul(&unit, &[8, 4, 3, 3], &[1, 4, 5, 5], &[1, 8, 3, 3]).is_none());
        let strided = ConvAttrs { strides: vec![2, 2], ..unit.clone() };
        assert!(conv_as_matmul(&strided, &[8, 4, 1, 1], &[1, 4, 6, 6], &[1, 8, 3, 3]).is_none());
        let padded = ConvAttrs { pads: vec![1, 1, 1, 1], ..unit.clone() };
        assert!(conv_as_matmul(&padded, &[8, 4, 1, 1], &[1, 4, 5, 5], &[1, 8, 7, 7]).is_none());
        let grouped = ConvAttrs { group: 2, ..unit };
        assert!(conv_as_matmul(&grouped, &[8, 2, 1, 1], &[1, 4, 5, 5], &[1, 8, 5, 5]).is_none());
    }
}
