//! NVRTC on the CPU: generated-style kernels compile to PTX for sm_90, broken ones report NVRTC's log, the cache
//! compiles each distinct (source, options) once. Each test prints SKIP and passes where NVRTC is not installed
//! (run `eval "$(.ci/install-nvrtc.sh)"` first).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::nvrtc_or_skip;
use exec_cuda::{compile, CacheStats, CompileCache, CompileOptions, CudaError};

const ADD: &str = r#"
extern "C" __global__ void add_f32(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ out, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"#;

#[test]
fn elementwise_kernel_compiles_to_sm90_ptx() {
    if !nvrtc_or_skip("elementwise_kernel_compiles_to_sm90_ptx") {
        return;
    }
    let started = std::time::Instant::now();
    let ptx = compile("add_f32", ADD, &CompileOptions::default()).unwrap();
    eprintln!("compiled add_f32 in {:?}", started.elapsed());
    assert!(ptx.text().contains(".visible .entry add_f32("), "{ptx}");
    assert!(ptx.text().contains(".target sm_90"), "{ptx}");
    assert_eq!(ptx.target(), Some("sm_90"));
    assert_eq!(ptx.entries(), ["add_f32"]);
    assert_eq!(ptx.kernel(), "add_f32");
}

#[test]
fn a_broken_source_returns_the_log_with_the_line() {
    if !nvrtc_or_skip("a_broken_source_returns_the_log_with_the_line") {
        return;
    }
    let src = "extern \"C\" __global__ void broken(float* x) {\n    x[0] = 1.0f;\n    x[1] = undefined_name;\n}\n";
    let err = compile("broken", src, &CompileOptions::default()).unwrap_err();
    let CudaError::Compile { kernel, log } = &err else { panic!("expected Compile, got {err:?}") };
    assert_eq!(kernel, "broken");
    assert!(log.contains("broken.cu(3)"), "{log}");
    assert!(log.contains("undefined_name"), "{log}");
    assert!(err.to_string().contains("kernel `broken` failed to compile"), "{err}");
}

#[test]
fn a_nul_byte_is_a_compile_error_not_a_panic() {
    if !nvrtc_or_skip("a_nul_byte_is_a_compile_error_not_a_panic") {
        return;
    }
    let err = compile("k", "extern \"C\" __global__ void k() {}\0", &CompileOptions::default()).unwrap_err();
    assert!(matches!(&err, CudaError::Compile { log, .. } if log.contains("NUL byte at offset 33")), "{err:?}");
}

#[test]
fn fmad_stays_off_unless_asked() {
    if !nvrtc_or_skip("fmad_stays_off_unless_asked") {
        return;
    }
    let src = r#"extern "C" __global__ void mad(const float* a, const float* b, const float* c, float* o) {
        o[threadIdx.x] = a[threadIdx.x] * b[threadIdx.x] + c[threadIdx.x];
    }"#;
    let exact = compile("mad", src, &CompileOptions::default()).unwrap();
    assert!(!exact.text().contains("fma.rn.f32"), "{exact}");
    assert!(exact.text().contains("mul.rn.f32") && exact.text().contains("add.rn.f32"), "{exact}");
    let fast = compile("mad", src, &CompileOptions { fmad: true, ..CompileOptions::default() }).unwrap();
    assert!(fast.text().contains("fma.rn.f32"), "{fast}");
}

#[test]
fn the_cache_compiles_each_source_and_option_set_once() {
    if !nvrtc_or_skip("the_cache_compiles_each_source_and_option_set_once") {
        return;
    }
    let cache = CompileCache::new();
    let opts = CompileOptions::default();
    let first = cache.compile("add_f32", ADD, &opts).unwrap();
    let again = cache.compile("add_again", ADD, &opts).unwrap();
    assert_eq!(cache.stats(), CacheStats { hits: 1, misses: 1, disk_hits: 0 });
    assert_eq!(first.text(), again.text());
    assert_eq!(again.kernel(), "add_again");
    let sm80 = cache.compile("add_f32", ADD, &CompileOptions::for_arch("sm_80")).unwrap();
    assert_eq!(sm80.target(), Some("sm_80"));
    let other = cache.compile("add_f32", &ADD.replace("a[i] + b[i]", "a[i] - b[i]"), &opts).unwrap();
    assert_ne!(other.text(), first.text());
    assert_eq!(cache.stats(), CacheStats { hits: 1, misses: 3, disk_hits: 0 });
    assert_eq!(cache.len(), 3);
    // Failures are not cached.
    assert!(cache.compile("bad", "this is not C", &opts).is_err());
    assert!(cache.compile("bad", "this is not C", &opts).is_err());
    assert_eq!(cache.len(), 3);
}

#[test]
fn without_nvrtc_the_reason_says_how_to_install_it() {
    match exec_cuda::nvrtc_availability() {
        Ok(info) => eprintln!("NVRTC {}.{} present", info.version.0, info.version.1),
        Err(CudaError::NvrtcUnavailable { reason }) => {
            assert!(reason.contains("install-nvrtc.sh"), "{reason}");
            // Every compile then reports the same, without panicking.
            let err = compile("add_f32", ADD, &CompileOptions::default()).unwrap_err();
            assert!(matches!(err, CudaError::NvrtcUnavailable { .. }), "{err:?}");
        }
        Err(e) => panic!("unexpected {e:?}"),
    }
}
