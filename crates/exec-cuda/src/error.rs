//! The backend's one error type, grouped by who can act on it.

use thiserror::Error;

/// Everything exec-cuda can fail with.
///
/// The variants fall in three groups, by audience:
/// - **environment** (`NoDriver`, `NoDevice`, `NvrtcUnavailable`, `CublasUnavailable`): the machine cannot run this
///   backend; callers report the reason and fall back or skip;
/// - **device** (`Driver`, `OutOfMemory`, `Cublas`): the GPU or a CUDA library refused a call at run time;
/// - **capability** (`PrecisionUnsupported`): the device cannot run one node's precision the way the plan asks
///   (a bf16 cuBLAS product below compute capability 8.0), found at prepare before anything is enqueued;
/// - **cuplan bugs** (`Compile`, `Signature`, `OutOfBounds`, `Unsupported`, `InvalidName`): a generated kernel or a
///   request that the plan should never have produced. `Compile` carries NVRTC's whole log so that the offending
///   generated line can be read off it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver library cannot be loaded or initialised (no NVIDIA driver on this machine).
    #[error("no CUDA driver: {reason}")]
    NoDriver {
        /// Why, in words a user can act on.
        reason: String,
    },
    /// The driver works but there is no device with the requested ordinal.
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver sees.
        count: usize,
    },
    /// NVRTC (the runtime CUDA C++ compiler library) cannot be loaded or does not work.
    #[error("NVRTC unavailable: {reason}")]
    NvrtcUnavailable {
        /// Why, and how to install it.
        reason: String,
    },
    /// cuBLAS cannot be loaded.
    #[error("cuBLAS unavailable: {reason}")]
    CublasUnavailable {
        /// Why, in words a user can act on.
        reason: String,
    },
    /// NVRTC rejected a kernel's source: a bug in the code generator (or in a custom kernel).
    #[error("kernel `{kernel}` failed to compile (NVRTC log follows)\n{log}")]
    Compile {
        /// The kernel (NVRTC program) name; the log's lines start with it.
        kernel: String,
        /// NVRTC's log, with file(line) positions.
        log: String,
    },
    /// A CUDA driver API call failed.
    #[error("CUDA driver call {call} failed: {detail}")]
    Driver {
        /// The driver entry point, e.g. `cuLaunchKernel`.
        call: &'static str,
        /// The driver's error name and description.
        detail: String,
    },
    /// A device allocation failed for lack of memory.
    #[error("out of device memory: allocating {requested} bytes")]
    OutOfMemory {
        /// The size of the failed allocation in bytes.
        requested: usize,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS call {call} failed: {status}")]
    Cublas {
        /// The cuBLAS entry point, e.g. `cublasSgemm_v2`.
        call: &'static str,
        /// The cuBLAS status name.
        status: String,
    },
    /// A node's precision that this device cannot run on cuBLAS (see `blas::GemmType::min_capability`).
    ///
    /// Found by a pure check at prepare (`blas::Matmul::check_device`), never by a failed cuBLAS call inside a
    /// capture. The executor then runs that product as a generated kernel (same numbers, slower) and lists the
    /// error in `PrepareInfo::cublas_refused`.
    #[error(
        "node '{node}': cuBLAS cannot run a {dtype} product on compute capability {}.{} (needs {}.{} or later)",
        capability.0, capability.1, needs.0, needs.1
    )]
    PrecisionUnsupported {
        /// The plan node (the MatMul/Gemm anchor).
        node: String,
        /// The operands' dtype.
        dtype: graph_plan::DType,
        /// The device's compute capability (major, minor).
        capability: (u32, u32),
        /// The lowest compute capability that runs it.
        needs: (u32, u32),
    },
    /// A kernel's declared parameters do not match the compiled function or the arguments of a launch.
    #[error("kernel `{kernel}`: parameter mismatch: {detail}")]
    Signature {
        /// The kernel's entry point name.
        kernel: String,
        /// Which parameter and how it differs.
        detail: String,
    },
    /// A device range lies outside its buffer.
    #[error("{what}: range [{offset}, {offset}+{bytes}) lies outside buffer `{buffer}` of {size} bytes")]
    OutOfBounds {
        /// What the range was for (an argument, a copy, a GEMM operand).
        what: String,
        /// The buffer's label (its plan region).
        buffer: String,
        /// Start of the range in bytes.
        offset: usize,
        /// Length of the range in bytes.
        bytes: usize,
        /// Size of the buffer in bytes.
        size: usize,
    },
    /// A kernel or a request uses something this backend does not implement.
    #[error("kernel `{kernel}`: unsupported: {what}")]
    Unsupported {
        /// The kernel (or operation) concerned.
        kernel: String,
        /// What is not supported.
        what: String,
    },
    /// A name handed to NVRTC or the driver is not a C identifier.
    #[error("invalid {what} name {name:?}: expected a C identifier ([A-Za-z_][A-Za-z0-9_]*)")]
    InvalidName {
        /// What the name is for (kernel, entry point).
        what: &'static str,
        /// The offending name.
        name: String,
    },
}

impl CudaError {
    /// True for the errors that mean "this machine cannot run the CUDA backend" (tests skip on these).
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::NoDriver { .. }
                | Self::NoDevice { .. }
                | Self::NvrtcUnavailable { .. }
                | Self::CublasUnavailable { .. }
        )
    }
}

/// Result alias of this crate.
pub type CudaResult<T> = Result<T, CudaError>;

/// Maps a driver error of `call` to [`CudaError::Driver`].
pub(crate) fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        // DriverError's Debug asks the driver for the error's name and text; it exists because a call returned it.
        detail: format!("{e:?}"),
    }
}

/// Maps a cuBLAS error of `call` to [`CudaError::Cublas`].
pub(crate) fn cublas(call: &'static str) -> impl FnOnce(cudarc::cublas::result::CublasError) -> CudaError {
    move |e| CudaError::Cublas { call, status: format!("{:?}", e.0) }
}

/// Checks that `name` is a C identifier, so that NVRTC and the driver never see NULs or odd characters (cudarc
/// would panic on an interior NUL).
pub(crate) fn check_identifier(what: &'static str, name: &str) -> CudaResult<()> {
    let mut chars = name.chars();
    let ok = match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => chars.all(|c| c.is_ascii_alphanumeric() || c == '_'),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(CudaError::InvalidName { what, name: name.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["a", "_", "add_f32", "k0", "_K_9"] {
            assert_eq!(check_identifier("kernel", ok), Ok(()), "{ok}");
        }
        for bad in ["", "0a", "a-b", "a b", "a\0b", "é", "a.b"] {
            assert!(
                matches!(check_identifier("kernel", bad), Err(CudaError::InvalidName { what: "kernel", ref name }) if name == bad),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn unavailable_kinds() {
        assert!(CudaError::NoDriver { reason: String::new() }.is_unavailable());
        assert!(CudaError::NoDevice { ordinal: 0, count: 0 }.is_unavailable());
        assert!(!CudaError::OutOfMemory { requested: 1 }.is_unavailable());
        assert!(!CudaError::Compile { kernel: "k".into(), log: String::new() }.is_unavailable());
    }

    #[test]
    fn precision_unsupported_names_node_dtype_and_capabilities() {
        let e = CudaError::PrecisionUnsupported {
            node: "fc1".into(),
            dtype: graph_plan::DType::BF16,
            capability: (7, 5),
            needs: (8, 0),
        };
        assert_eq!(
            e.to_string(),
            "node 'fc1': cuBLAS cannot run a bf16 product on compute capability 7.5 (needs 8.0 or later)"
        );
        // A capability refusal is not "no CUDA here": the plan still runs, with a generated product.
        assert!(!e.is_unavailable());
    }
}
