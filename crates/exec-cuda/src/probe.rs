//! Cheap availability checks: is there a driver, a device, a working NVRTC? Each returns a reason instead of
//! panicking, so that callers (the CLI, tests) can say why the CUDA backend is off.
//!
//! cudarc loads its libraries lazily and panics when one is missing; every probe here first asks whether the
//! library can be loaded at all, and runs the first real calls under `catch_unwind` as a second guard (cudarc also
//! panics on a symbol an old driver lacks).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use cudarc::driver::sys::{CUdevice_attribute, CUresult};
use cudarc::driver::{result as drv, DriverError};

use crate::error::{CudaError, CudaResult};
use crate::ffi;

/// What the driver says about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device ordinal.
    pub ordinal: usize,
    /// How many devices the driver sees.
    pub device_count: usize,
    /// The marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0).
    pub compute_capability: (u32, u32),
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// The driver's CUDA version as the driver encodes it: 1000 * major + 10 * minor (12080 for 12.8).
    pub driver_version: u32,
}

impl DeviceInfo {
    /// The NVRTC architecture for this device, e.g. `sm_90`.
    #[must_use]
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }

    /// The driver version as (major, minor).
    #[must_use]
    pub fn driver_version_pair(&self) -> (u32, u32) {
        (self.driver_version / 1000, (self.driver_version % 1000) / 10)
    }
}

/// What NVRTC reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcInfo {
    /// NVRTC's (major, minor) version.
    pub version: (i32, i32),
}

/// Checks that the CUDA backend can run on device 0, without creating a context.
///
/// # Errors
/// [`CudaError::NoDriver`] without a loadable, working driver; [`CudaError::NoDevice`] without a device;
/// [`CudaError::Driver`] when a query fails.
pub fn availability() -> CudaResult<DeviceInfo> {
    device_info(0)
}

/// Like [`availability`] for the device with this ordinal.
///
/// # Errors
/// As [`availability`].
pub fn device_info(ordinal: usize) -> CudaResult<DeviceInfo> {
    if !ffi::driver_lib_present() {
        return Err(no_driver_lib());
    }
    guard("the CUDA driver", || query_device(ordinal)).unwrap_or_else(|msg| {
        Err(CudaError::NoDriver { reason: format!("the driver library loaded but failed: {msg}") })
    })
}

fn no_driver_lib() -> CudaError {
    CudaError::NoDriver {
        reason: "libcuda.so (the NVIDIA driver library) cannot be loaded: no NVIDIA driver is installed on this \
                 machine, or its directory is not on the loader path"
            .to_owned(),
    }
}

fn query_device(ordinal: usize) -> CudaResult<DeviceInfo> {
    let version = ffi::driver_version().map_err(crate::error::driver("cuDriverGetVersion"))?;
    drv::init().map_err(|e| init_error(e, version))?;
    let count = drv::device::get_count().map_err(crate::error::driver("cuDeviceGetCount"))?;
    let count = usize::try_from(count).unwrap_or(0);
    if ordinal >= count {
        return Err(CudaError::NoDevice { ordinal, count });
    }
    let ordinal_c = i32::try_from(ordinal).map_err(|_| CudaError::NoDevice { ordinal, count })?;
    let dev = drv::device::get(ordinal_c).map_err(crate::error::driver("cuDeviceGet"))?;
    let name = drv::device::get_name(dev).map_err(crate::error::driver("cuDeviceGetName"))?;
    let attr = |a: CUdevice_attribute| -> CudaResult<u32> {
        let v = ffi::device_attribute(dev, a).map_err(crate::error::driver("cuDeviceGetAttribute"))?;
        Ok(u32::try_from(v).unwrap_or(0))
    };
    let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let total_memory = ffi::device_total_mem(dev).map_err(crate::error::driver("cuDeviceTotalMem_v2"))?;
    Ok(DeviceInfo {
        ordinal,
        device_count: count,
        name,
        compute_capability: (major, minor),
        sm_count,
        total_memory,
        driver_version: u32::try_from(version).unwrap_or(0),
    })
}

fn init_error(e: DriverError, version: i32) -> CudaError {
    match e.0 {
        CUresult::CUDA_ERROR_NO_DEVICE => CudaError::NoDevice { ordinal: 0, count: 0 },
        CUresult::CUDA_ERROR_STUB_LIBRARY => CudaError::NoDriver {
            reason: "the loaded libcuda.so is the CUDA toolkit's link stub, not a driver".to_owned(),
        },
        CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH | CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => {
            CudaError::NoDriver {
                reason: format!(
                    "the driver library (CUDA {}.{}) does not match the kernel driver: {e:?}",
                    version / 1000,
                    (version % 1000) / 10
                ),
            }
        }
        _ => CudaError::NoDriver { reason: format!("cuInit failed: {e:?}") },
    }
}

/// Checks that NVRTC can be loaded and compiles a trivial kernel. The answer is computed once per process.
///
/// # Errors
/// [`CudaError::NvrtcUnavailable`] with the reason and how to install NVRTC.
pub fn nvrtc_availability() -> CudaResult<NvrtcInfo> {
    static ANSWER: OnceLock<CudaResult<NvrtcInfo>> = OnceLock::new();
    ANSWER.get_or_init(probe_nvrtc).clone()
}

fn probe_nvrtc() -> CudaResult<NvrtcInfo> {
    if !ffi::nvrtc_lib_present() {
        return Err(CudaError::NvrtcUnavailable { reason: nvrtc_missing_reason() });
    }
    let version = guard("NVRTC", ffi::nvrtc_version)
        .map_err(unavailable)?
        .map_err(|e| unavailable(format!("nvrtcVersion failed: {e:?}")))?;
    // A library that loads can still lack its builtins companion (libnvrtc-builtins), which only shows when
    // compiling: prove it once with the smallest kernel.
    let src = "extern \"C\" __global__ void cuplan_probe(float* x) { x[threadIdx.x] += 1.0f; }";
    // Compiled through cudarc directly, not through `nvrtc` (which asks this probe first): no import circle.
    guard("NVRTC", || cudarc::nvrtc::compile_ptx(src))
        .map_err(unavailable)?
        .map_err(|e| unavailable(format!("NVRTC {}.{} loads but cannot compile: {e:?}", version.0, version.1)))?;
    Ok(NvrtcInfo { version })
}

fn unavailable(reason: String) -> CudaError {
    CudaError::NvrtcUnavailable { reason }
}

fn nvrtc_missing_reason() -> String {
    let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let hint = match std::env::var("CUPLAN_NVRTC_LIB_DIR") {
        Ok(dir) if !ld.split(':').any(|d| d == dir) => format!(
            "; CUPLAN_NVRTC_LIB_DIR={dir} is not on LD_LIBRARY_PATH (it must be set before the process starts: \
             `source target/nvrtc-venv/env.sh`)"
        ),
        _ => String::new(),
    };
    format!(
        "libnvrtc.so.12 cannot be loaded (LD_LIBRARY_PATH={ld:?}){hint}; install it with `.ci/install-nvrtc.sh` \
         and run with `eval \"$(.ci/install-nvrtc.sh)\"` or `source target/nvrtc-venv/env.sh`"
    )
}

/// Checks that libcublas can be loaded (without creating a handle, which needs a device).
///
/// # Errors
/// [`CudaError::CublasUnavailable`] with the reason; the executor then runs products as generated kernels.
pub fn cublas_availability() -> CudaResult<()> {
    if ffi::cublas_lib_present() {
        Ok(())
    } else {
        Err(CudaError::CublasUnavailable { reason: CUBLAS_MISSING.to_owned() })
    }
}

/// Why cuBLAS is missing, and how to provide it.
pub(crate) const CUBLAS_MISSING: &str = "libcublas.so.12 (or libcublas.so) cannot be loaded: install the CUDA \
     toolkit's cuBLAS, or the PyPI wheel nvidia-cublas-cu12, and put its directory on LD_LIBRARY_PATH";

/// Runs `f`, turning a panic from inside cudarc (a library or symbol that cannot be loaded) into a value.
pub(crate) fn guard<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown panic".to_owned());
        tracing::warn!(%what, %msg, "a CUDA library call panicked");
        format!("{what}: {msg}")
    })
}
