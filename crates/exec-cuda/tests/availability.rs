//! Without a driver every entry point fails cleanly with a reason; with one, the reported facts are sane.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use exec_cuda::{availability, device_info, CudaError, Device};

#[test]
fn availability_never_panics_and_explains() {
    match availability() {
        Ok(info) => {
            eprintln!("CUDA device 0: {info:?}");
            assert!(info.device_count >= 1);
            assert!(info.compute_capability.0 >= 3, "{info:?}");
            assert!(info.sm_count > 0 && info.total_memory > 0, "{info:?}");
            assert!(info.arch().starts_with("sm_"));
            assert!(info.driver_version >= 10_000, "{info:?}");
        }
        Err(CudaError::NoDriver { reason }) => {
            eprintln!("no driver (expected on CPU-only machines): {reason}");
            assert!(reason.contains("libcuda") || reason.contains("driver"), "{reason}");
        }
        Err(e @ CudaError::NoDevice { .. }) => eprintln!("driver without device: {e}"),
        Err(e) => panic!("availability() must report NoDriver/NoDevice or succeed, got {e:?}"),
    }
}

#[test]
fn availability_is_repeatable() {
    // A failed probe must not leave cudarc's lazily loaded library in a state that panics the second time.
    let first = availability().map(|i| i.name);
    let second = availability().map(|i| i.name);
    assert_eq!(first, second);
}

#[test]
fn open_fails_with_the_same_reason_as_the_probe() {
    match (availability(), Device::open(0)) {
        (Ok(_), Ok(dev)) => assert_eq!(dev.info().ordinal, 0),
        (Err(probe), Err(open)) => {
            assert!(open.is_unavailable(), "{open:?}");
            assert_eq!(probe, open);
        }
        (p, o) => panic!("probe and open disagree: {p:?} vs {:?}", o.map(|d| d.info().clone())),
    }
}

#[test]
fn a_missing_ordinal_is_no_device_or_no_driver() {
    let err = device_info(4096).unwrap_err();
    assert!(matches!(err, CudaError::NoDriver { .. } | CudaError::NoDevice { ordinal: 4096, .. }), "{err:?}");
    let err = Device::open(4096).unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

#[test]
fn error_messages_name_what_failed() {
    let e = CudaError::Compile {
        kernel: "fused_3".into(),
        log: "fused_3.cu(2): error: identifier \"y\" is undefined".into(),
    };
    let text = e.to_string();
    assert!(text.starts_with("kernel `fused_3` failed to compile"), "{text}");
    assert!(text.contains("fused_3.cu(2)"), "{text}");
    let e =
        CudaError::OutOfBounds { what: "argument 2".into(), buffer: "pool".into(), offset: 256, bytes: 512, size: 600 };
    assert_eq!(e.to_string(), "argument 2: range [256, 256+512) lies outside buffer `pool` of 600 bytes");
}

#[test]
fn the_executor_reports_unavailability_instead_of_panicking() {
    use graph_plan::{ExecutionPlan, Executor, TensorMap};
    let exec = exec_cuda::CudaExecutor::new(0);
    assert_eq!(exec.name(), "cuda");
    let g = graph_plan::ir::synth::mlp(1, 4, 2).unwrap();
    let plan = ExecutionPlan::build(&g, 1).unwrap();
    let mut weights = TensorMap::new();
    graph_plan::exec::fill_missing(&plan, &mut weights, graph_plan::BindingRole::Weight, 1, &[]);
    match exec.availability() {
        Ok(()) => eprintln!("CUDA backend available"),
        Err(u) => {
            assert_eq!(u.backend, "cuda");
            assert!(!u.reason.is_empty());
            let err = exec.prepare(&plan, &weights).unwrap_err();
            assert!(
                matches!(&err, graph_plan::ExecError::Backend { backend: "cuda", message } if message.contains("no CUDA driver") || message.contains("NVRTC")),
                "{err:?}"
            );
        }
    }
    // Missing weights are the caller's error, reported before any device work.
    let err = exec.prepare(&plan, &TensorMap::new()).unwrap_err();
    assert!(matches!(err, graph_plan::ExecError::Missing { role: "weight", .. }), "{err:?}");
}
