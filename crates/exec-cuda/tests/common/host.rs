//! A host emulator for generated kernels, so that their numbers can be checked on machines without a GPU.
//!
//! Each kernel source is compiled as C++20 with a small shim (CUDA built-ins as thread-locals, `__shared__` as
//! function statics, `__syncthreads` and warp shuffles through barriers) and run block by block: per-element
//! kernels on one host thread, row kernels with one host thread per CUDA thread. A plan runs step by step in
//! submission order (one stream's order is a valid order); cuBLAS steps run as the host model of the cuBLAS call
//! (`ColMajorGemm::host_reference`, f32 or f16/bf16 with f32 compute).
//!
//! Compiling the shim's headers dominates, so a [`HostProgram`] holds many kernels (every distinct source of many
//! plans) in one executable, and [`HostEmu`] runs any plan whose kernels it holds through graph-plan's `Executor`
//! trait, which is how the conformance suite runs here.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use exec_cuda::codegen::{self, KernelSource, Launch};
use exec_cuda::CudaError;
use graph_plan::{
    BindingRole, BufferRef, ExecError, ExecutionPlan, Executor, HostTensor, PlanStep, PreparedPlan, Region, TensorMap,
    Unavailable,
};

const SHIM: &str = r#"
#define CUPLAN_HOST 1
#include <math.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <vector>
#include <thread>
#include <barrier>
#include <memory>
#include <algorithm>
#include <utility>
using std::min; using std::max;
struct Dim { unsigned x = 0, y = 1, z = 1; };
static thread_local Dim threadIdx, blockIdx;
static Dim blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float h2f(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline unsigned short f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h; }
static std::barrier<>* cuplan_block_bar = nullptr;
static std::vector<std::unique_ptr<std::barrier<>>> cuplan_warp_bar;
static unsigned long long cuplan_slots[1024];
static inline void __syncthreads() { cuplan_block_bar->arrive_and_wait(); }
// Every lane of the warp publishes its value, then reads the one of thread `src` (its own when `src` is itself).
template <typename T>
static inline T cuplan_exchange(T v, unsigned src) {
    static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffle of a wide type");
    unsigned t = threadIdx.x, w = t >> 5;
    memcpy(&cuplan_slots[t], &v, sizeof(T));
    cuplan_warp_bar[w]->arrive_and_wait();
    T r;
    memcpy(&r, &cuplan_slots[src], sizeof(T));
    cuplan_warp_bar[w]->arrive_and_wait();
    return r;
}
template <typename T>
static inline T __shfl_down_sync(unsigned, T v, int o) {
    unsigned t = threadIdx.x, src = t + (unsigned)o;
    return cuplan_exchange(v, (t & 31) + (unsigned)o < 32 && src < blockDim.x ? src : t);
}
template <typename T>
static inline T __shfl_sync(unsigned, T v, int src) {
    return cuplan_exchange(v, (threadIdx.x & ~31u) + ((unsigned)src & 31u));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned m, T v, int x) {
    return __shfl_sync(m, v, (int)((threadIdx.x & 31u) ^ (unsigned)x));
}
static inline int __all_sync(unsigned m, int p) {
    int all = 1;
    for (int s = 0; s < 32; ++s) all &= __shfl_sync(m, p, s) != 0;
    return all;
}
"#;

const MAIN: &str = r#"
template <typename... P, size_t... I>
static void call_impl(void (*k)(P...), void** b, std::index_sequence<I...>) { k((P)b[I]...); }

template <typename... P>
static void launch(void (*k)(P...), char mode, unsigned grid, unsigned block, void** args) {
    blockDim.x = block;
    if (mode == 'e') {
        for (unsigned b = 0; b < grid; ++b)
            for (unsigned t = 0; t < block; ++t) {
                blockIdx.x = b; threadIdx.x = t;
                call_impl(k, args, std::index_sequence_for<P...>{});
            }
        return;
    }
    std::barrier<> bar(block);
    cuplan_block_bar = &bar;
    cuplan_warp_bar.clear();
    for (unsigned w = 0; w < (block + 31) / 32; ++w)
        cuplan_warp_bar.emplace_back(new std::barrier<>(std::min(32u, block - 32 * w)));
    for (unsigned b = 0; b < grid; ++b) {
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < block; ++t)
            ts.emplace_back([&, b, t] {
                blockIdx.x = b; threadIdx.x = t;
                call_impl(k, args, std::index_sequence_for<P...>{});
            });
        for (auto& th : ts) th.join();
    }
}

static void dispatch(int kernel, char mode, unsigned grid, unsigned block, void** args);

// argv: kernel mode(e|r) grid block nregions region_files... nargs (region offset)...
int main(int argc, char** argv) {
    int kernel = atoi(argv[1]);
    char mode = argv[2][0];
    unsigned grid = (unsigned)atol(argv[3]), block = (unsigned)atol(argv[4]);
    int nr = atoi(argv[5]);
    std::vector<std::vector<unsigned char>> regions(nr);
    for (int r = 0; r < nr; ++r) {
        FILE* f = fopen(argv[6 + r], "rb");
        fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
        regions[r].resize(n + 1);
        if (n > 0 && fread(regions[r].data(), 1, n, f) != (size_t)n) return 2;
        fclose(f);
    }
    int na = atoi(argv[6 + nr]);
    std::vector<void*> args(na);
    for (int a = 0; a < na; ++a) {
        int r = atoi(argv[7 + nr + 2 * a]);
        long off = atol(argv[8 + nr + 2 * a]);
        args[a] = regions[r].data() + off;
    }
    dispatch(kernel, mode, grid, block, args.data());
    for (int r = 0; r < nr; ++r) {
        FILE* f = fopen(argv[6 + r], "wb");
        fwrite(regions[r].data(), 1, regions[r].size() - 1, f);
        fclose(f);
    }
    return 0;
}
"#;

/// The host C++ compiler, or None (the caller prints SKIP).
pub fn compiler() -> Option<&'static str> {
    ["c++", "g++", "clang++"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// The plan's regions as host byte arrays.
pub struct HostRegions(pub Vec<Vec<u8>>);

impl HostRegions {
    pub fn new(plan: &ExecutionPlan) -> Self {
        HostRegions(Region::ALL.iter().map(|&r| vec![0u8; plan.region_bytes(r) as usize]).collect())
    }

    pub fn bytes(&self, b: BufferRef) -> &[u8] {
        &self.0[b.region.index()][b.offset as usize..b.end() as usize]
    }

    pub fn bytes_mut(&mut self, b: BufferRef) -> &mut [u8] {
        &mut self.0[b.region.index()][b.offset as usize..b.end() as usize]
    }

    pub fn f32s(&self, b: BufferRef) -> Vec<f32> {
        crate::common::from_bytes(self.bytes(b))
    }
}

fn scratch(tag: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("host-emu-{tag}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One host executable holding many generated kernels, found by their source text.
pub struct HostProgram {
    exe: PathBuf,
    index: HashMap<String, usize>,
}

impl HostProgram {
    /// Compiles every distinct launched source of `sources` into one executable.
    pub fn build<'a>(cxx: &str, tag: &str, sources: impl IntoIterator<Item = &'a KernelSource>) -> Self {
        let dir = scratch(tag);
        let mut index = HashMap::new();
        let mut distinct: Vec<&KernelSource> = Vec::new();
        for s in sources {
            if s.launch != Launch::None && !index.contains_key(&s.source) {
                index.insert(s.source.clone(), distinct.len());
                distinct.push(s);
            }
        }
        let exe = build(cxx, &dir, &distinct);
        HostProgram { exe, index }
    }

    /// Number of distinct kernels.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether `src` is in the program.
    pub fn has(&self, src: &KernelSource) -> bool {
        src.launch == Launch::None || self.index.contains_key(&src.source)
    }

    /// Runs every step of `plan` on the host in submission order; `sources` are the plan's generated kernels.
    pub fn run(&self, plan: &ExecutionPlan, sources: &[KernelSource], regions: &mut HostRegions) {
        let dir = scratch("run");
        for step in &plan.steps {
            match step {
                PlanStep::Launch { kernel, .. } => {
                    let src = &sources[kernel.index()];
                    host_gemms(regions, &src.blas);
                    if src.launch != Launch::None {
                        let i = *self
                            .index
                            .get(&src.source)
                            .unwrap_or_else(|| panic!("{} is not in the program", src.name));
                        run_kernel(&self.exe, &dir, i, src, regions);
                    }
                }
                PlanStep::Copy { src, dst, bytes, .. } => {
                    let data = regions.bytes(*src)[..*bytes as usize].to_vec();
                    regions.bytes_mut(*dst)[..*bytes as usize].copy_from_slice(&data);
                }
                PlanStep::Record { .. } | PlanStep::Wait { .. } => {}
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Runs every step of `plan` on the host in submission order.
pub fn run_plan(cxx: &str, tag: &str, plan: &ExecutionPlan, regions: &mut HostRegions) {
    let sources = codegen::generate_all(plan).unwrap();
    let program = HostProgram::build(cxx, tag, &sources);
    program.run(plan, &sources, regions);
}

/// The host emulator as a graph-plan `Executor`: it runs plans whose kernels its program holds.
#[derive(Clone)]
pub struct HostEmu {
    pub program: Arc<HostProgram>,
}

/// A plan prepared on the host emulator.
pub struct HostEmuPrepared {
    program: Arc<HostProgram>,
    plan: ExecutionPlan,
    sources: Vec<KernelSource>,
    regions: HostRegions,
}

fn emu_error(e: CudaError) -> ExecError {
    match e {
        CudaError::Unsupported { kernel, what } => ExecError::Unsupported { kernel, what },
        other => ExecError::Backend { backend: "host-emu", message: other.to_string() },
    }
}

impl Executor for HostEmu {
    type Prepared = HostEmuPrepared;

    fn name(&self) -> &'static str {
        "host-emu"
    }

    fn availability(&self) -> Result<(), Unavailable> {
        Ok(())
    }

    fn prepare(&self, plan: &ExecutionPlan, weights: &TensorMap) -> Result<HostEmuPrepared, ExecError> {
        graph_plan::exec::check_tensors(plan, weights, BindingRole::Weight)?;
        let sources = codegen::generate_all(plan).map_err(emu_error)?;
        if let Some(s) = sources.iter().find(|s| !self.program.has(s)) {
            return Err(ExecError::Backend {
                backend: "host-emu",
                message: format!("{} is not in the program", s.name),
            });
        }
        let mut regions = HostRegions::new(plan);
        for b in plan.bindings() {
            let data = match b.role {
                BindingRole::Constant => b.data.as_deref(),
                BindingRole::Weight => weights.get(&*b.name).map(|t| t.data.as_slice()),
                _ => None,
            };
            if let Some(bytes) = data {
                regions.bytes_mut(b.buffer).copy_from_slice(bytes);
            }
        }
        Ok(HostEmuPrepared { program: self.program.clone(), plan: plan.clone(), sources, regions })
    }
}

impl PreparedPlan for HostEmuPrepared {
    fn run(&mut self, inputs: &TensorMap) -> Result<TensorMap, ExecError> {
        graph_plan::exec::check_tensors(&self.plan, inputs, BindingRole::Input)?;
        for b in self.plan.bindings().iter().filter(|b| b.role == BindingRole::Input) {
            self.regions.bytes_mut(b.buffer).copy_from_slice(&inputs[&*b.name].data);
        }
        self.program.run(&self.plan, &self.sources, &mut self.regions);
        Ok(self
            .plan
            .bindings()
            .iter()
            .filter(|b| b.role == BindingRole::Output)
            .map(|b| {
                let t =
                    HostTensor { dtype: b.dtype, shape: b.shape.clone(), data: self.regions.bytes(b.buffer).to_vec() };
                (b.name.to_string(), t)
            })
            .collect())
    }
}

/// One executable holding every given kernel, each in its own namespace under its own entry name.
fn build(cxx: &str, dir: &Path, sources: &[&KernelSource]) -> PathBuf {
    let mut cpp = String::from(SHIM);
    let mut dispatch = String::from(
        "static void dispatch(int kernel, char mode, unsigned grid, unsigned block, void** args) {\n    switch (kernel) {\n",
    );
    for (i, s) in sources.iter().enumerate() {
        cpp.push_str(&format!(
            "namespace k{i} {{\n#define {entry} cuplan_host_{i}\n{}\n#undef {entry}\n}}\n",
            s.source,
            entry = s.entry
        ));
        dispatch.push_str(&format!("    case {i}: launch(k{i}::cuplan_host_{i}, mode, grid, block, args); break;\n"));
    }
    dispatch.push_str("    default: exit(3);\n    }\n}\n");
    cpp.push_str(MAIN);
    cpp.push_str(&dispatch);
    let path = dir.join("plan.cpp");
    let exe = dir.join("plan");
    std::fs::write(&path, cpp).unwrap();
    let out =
        Command::new(cxx).args(["-std=c++20", "-O0", "-pthread", "-w", "-o"]).arg(&exe).arg(&path).output().unwrap();
    assert!(
        out.status.success(),
        "host compile of {} failed:\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// A kernel's cuBLAS work on the host: the calls the executor enqueues (`codegen::gemm_launches`: each step's
/// calls, those of one shape merged into one pointer-array call), each product through
/// `ColMajorGemm::host_reference` (f32, or f16/bf16 operands widened to f32, an f32 sum, one rounding to C's type
/// on the store), so that the emulated plans exercise the same mapping, merging, byte-extent checks and types as
/// the device calls.
fn host_gemms(regions: &mut HostRegions, steps: &[codegen::BlasStep]) {
    for launch in codegen::gemm_launches(steps) {
        let (g, operands) = match launch {
            codegen::GemmLaunch::Lt(c, epilogue) => {
                host_lt(regions, &c, &epilogue);
                continue;
            }
            codegen::GemmLaunch::Strided(c) => (c.gemm, vec![[c.a, c.b, c.c]]),
            codegen::GemmLaunch::Pointers { gemm, operands } => {
                assert_eq!(gemm.batch, 1, "a pointer-array call describes one product");
                (gemm, operands)
            }
        };
        for [a, b, c] in operands {
            let (a, bb) = (regions.bytes(a).to_vec(), regions.bytes(b).to_vec());
            g.host_reference(&a, &bb, regions.bytes_mut(c)).unwrap_or_else(|e| panic!("host GEMM {g:?}: {e}"));
        }
    }
}

/// A cuBLASLt call on the host: the product as `host_reference` computes it, then, per element of the
/// column-major C, `act(x + residual + bias[row])` in f32 (cuBLASLt's C with beta 1 and
/// `CUBLASLT_EPILOGUE_*_BIAS`; GELU in its tanh form).
fn host_lt(regions: &mut HostRegions, c: &codegen::BlasCall, epilogue: &codegen::LtEpilogue) {
    let g = c.gemm;
    assert_eq!((g.batch, g.types), (1, exec_cuda::GemmTypes::F32), "cuBLASLt calls are f32, batch 1");
    let (a, b) = (regions.bytes(c.a).to_vec(), regions.bytes(c.b).to_vec());
    g.host_reference(&a, &b, regions.bytes_mut(c.c)).unwrap_or_else(|e| panic!("host GEMM {g:?}: {e}"));
    let bias: Option<Vec<f32>> = epilogue.bias.map(|r| regions.f32s(r));
    let residual: Option<Vec<f32>> = epilogue.residual.map(|r| regions.f32s(r));
    let out = regions.bytes_mut(c.c);
    for j in 0..g.n {
        for i in 0..g.m {
            let at = (j * g.ldc + i) * 4;
            let e = &mut out[at..at + 4];
            let mut v = f32::from_le_bytes([e[0], e[1], e[2], e[3]]);
            if let Some(r) = &residual {
                v += r[j * g.ldc + i];
            }
            if let Some(b) = &bias {
                v += b[i];
            }
            v = match epilogue.activation {
                codegen::LtActivation::None => v,
                codegen::LtActivation::Relu => v.max(0.0),
                codegen::LtActivation::GeluTanh => {
                    let inner = (2.0 / std::f32::consts::PI).sqrt() * (v + 0.044_715 * v * v * v);
                    0.5 * v * (1.0 + inner.tanh())
                }
            };
            e.copy_from_slice(&v.to_le_bytes());
        }
    }
}

fn run_kernel(exe: &Path, dir: &Path, index: usize, src: &codegen::KernelSource, regions: &mut HostRegions) {
    let (mode, grid, block) = match src.launch {
        // Per-element kernels run one host thread at a time, unless they use warp intrinsics (the attention
        // kernel's cooperative scores): then one host thread per CUDA thread, as row kernels.
        Launch::Elements { threads, block } if src.source.contains("__shfl_sync(") => {
            ('r', threads.div_ceil(u64::from(block)).max(1), block)
        }
        Launch::Elements { threads, block } => ('e', threads.div_ceil(u64::from(block)).max(1), block),
        // Row kernels stride by blockDim, so any block size computes the same rows; two warps keep the
        // cross-warp step covered while costing the emulator a quarter of the host threads.
        Launch::Rows { rows, block } => ('r', rows.max(1), block.min(64)),
        other => panic!("cannot emulate {other:?}"),
    };
    let files: Vec<PathBuf> = (0..regions.0.len()).map(|r| dir.join(format!("region{r}.bin"))).collect();
    for (f, data) in files.iter().zip(&regions.0) {
        std::fs::write(f, data).unwrap();
    }
    let mut cmd = Command::new(exe);
    cmd.arg(index.to_string()).arg(mode.to_string()).arg(grid.to_string()).arg(block.to_string());
    cmd.arg(files.len().to_string()).args(&files);
    cmd.arg(src.args.len().to_string());
    for a in &src.args {
        cmd.arg(a.region.index().to_string()).arg(a.offset.to_string());
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "host run of {} failed: {}\n{}",
        src.name,
        String::from_utf8_lossy(&out.stderr),
        src.source
    );
    for (f, data) in files.iter().zip(regions.0.iter_mut()) {
        *data = std::fs::read(f).unwrap();
    }
}
