//! exec-cuda: cuplan's NVIDIA GPU backend, through cudarc.
//!
//! Place in the pipeline: it consumes an `ExecutionPlan` from graph-plan (and nothing else of the compiler), turns
//! each plan kernel into CUDA C, compiles it with NVRTC once per plan, allocates one device buffer per plan region,
//! creates the plan's streams and events once, captures the plan's steps into a CUDA graph and replays it.
//!
//! It builds everywhere: cudarc loads the CUDA libraries at run time (`dynamic-loading`), and every entry point
//! first checks that the library it needs can be loaded, returning [`CudaError::NoDriver`] /
//! [`CudaError::NvrtcUnavailable`] / [`CudaError::CublasUnavailable`] with the reason instead of panicking.
//! NVRTC needs no GPU, so on CPU-only machines the compile layer still works and CI proves that every generated
//! kernel compiles (`.ci/install-nvrtc.sh` installs the library).
//!
//! Layers, bottom up:
//! - [`probe`]: cheap availability checks ([`availability`], [`nvrtc_availability`]);
//! - [`nvrtc`]: CUDA C -> PTX with fixed, exact options and a (source, options) cache;
//! - [`device`]: RAII owners of the context, region buffers, streams, events, modules and kernels;
//! - [`blas`]: a cuBLAS handle bound to a stream, column- and row-major GEMM (f32, or f16/bf16 with f32 compute);
//! - [`capture`]: multi-stream CUDA graph capture and replay;
//! - [`codegen`]: CUDA C source for each plan kernel (per-element, row, cuBLAS + epilogue, custom);
//! - [`executor`]: [`CudaExecutor`], graph-plan's `Executor` for this backend, in graph-replay or eager
//!   [`SubmitMode`], with [`CudaPrepared::time_runs`] for CUDA-event timings;
//! - `ffi` (private): the only module with `unsafe`, each block justified by a `// SAFETY:` comment.

// Library code returns typed errors; tests may unwrap (clippy.toml allows it inside #[test] and #[cfg(test)]).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod blas;
pub mod capture;
pub mod codegen;
pub mod device;
pub mod error;
pub mod executor;
mod ffi;
pub mod nvrtc;
pub mod probe;

pub use blas::{Blas, ColMajorGemm, GemmType, GemmTypes, Matmul};
pub use capture::{capture, Graph};
pub use device::{Device, DeviceBuffer, DevicePtr, Event, Kernel, KernelArg, LaunchDims, Module, ParamKind, Stream};
pub use error::{CudaError, CudaResult};
pub use executor::{CudaExecutor, CudaOptions, CudaPrepared, CudaPreparedSet, PrepareInfo, SubmitMode};
pub use nvrtc::{compile, CacheStats, CompileCache, CompileOptions, Ptx};
pub use probe::{availability, cublas_availability, device_info, nvrtc_availability, DeviceInfo, NvrtcInfo};
