//! Skip helpers shared by the integration tests: each prints why it skips, to stderr, and the test passes.
#![allow(dead_code)]

use exec_cuda::{CudaError, Device};

/// True when NVRTC works here; otherwise prints the reason and returns false.
pub fn nvrtc_or_skip(test: &str) -> bool {
    match exec_cuda::nvrtc_availability() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            false
        }
    }
}

/// Device 0 when a driver and a device are present; otherwise prints the reason and returns None.
pub fn device_or_skip(test: &str) -> Option<Device> {
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e) if e.is_unavailable() => {
            eprintln!("SKIP {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: opening device 0 failed: {e}"),
    }
}

/// Unwraps a cuBLAS-dependent result, or prints why cuBLAS is missing and returns None.
pub fn blas_or_skip<T>(test: &str, r: Result<T, CudaError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e @ CudaError::CublasUnavailable { .. }) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

/// f32 slice to bytes.
pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// Bytes to f32s.
pub fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Compiles every distinct launched source of `sources` through `cache` on all cores, panicking with NVRTC's log
/// and the source on the first failure; returns the number of distinct sources. The caller checked NVRTC.
pub fn compile_distinct(
    test: &str,
    sources: &[exec_cuda::codegen::KernelSource],
    cache: &exec_cuda::CompileCache,
    options: &exec_cuda::CompileOptions,
) -> usize {
    use exec_cuda::codegen::Launch;
    let mut seen = std::collections::HashSet::new();
    let distinct: Vec<_> = sources.iter().filter(|s| s.launch != Launch::None && seen.insert(&s.source)).collect();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(distinct.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(s) = distinct.get(i) else { break };
                match cache.compile(&s.name, &s.source, options) {
                    Ok(ptx) => {
                        assert!(ptx.entries().contains(&s.entry.as_str()), "{test}: {} lacks {}", s.name, s.entry)
                    }
                    Err(CudaError::Compile { log, .. }) => {
                        panic!("{test}: kernel {} does not compile:\n{log}\n{}", s.name, s.source)
                    }
                    Err(e) => panic!("{test}: {}: {e}", s.name),
                }
            });
        }
    });
    distinct.len()
}

pub mod host;
