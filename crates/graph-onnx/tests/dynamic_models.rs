#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The dynamic-batch exports (the repository's `models/dynamic/`, or `$CUPLAN_MODELS_DIR/dynamic`) import and
//! plan at several batch sizes once `batch` is bound, and at batch 1 plan to the same figures as the static
//! exports. Without a binding, the symbol is named in the error.

use std::path::PathBuf;

use graph_onnx::{import_file, ImportOptions, OnnxError, OnnxModel};
use graph_plan::{ExecutionPlan, Region};

const MODELS: [&str; 4] = ["bert_base", "googlenet", "mobilenet_v2", "resnet50"];

/// The folder holding the static models, whose `dynamic/` subfolder holds the dynamic ones:
/// `$CUPLAN_MODELS_DIR` when set, else the repository's own `models/`. The tests fail without them.
fn models_dir() -> Option<PathBuf> {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let dir = std::env::var_os("CUPLAN_MODELS_DIR").map_or_else(|| root.join("models"), PathBuf::from);
    assert!(dir.join("dynamic/resnet50.onnx").is_file(), "no dynamic ONNX models in {}", dir.display());
    Some(dir)
}

fn import_at(dir: &std::path::Path, name: &str, batch: Option<usize>) -> Result<OnnxModel, OnnxError> {
    let opts = match batch {
        Some(b) => ImportOptions::with_dims([("batch", b)]),
        None => ImportOptions::default(),
    };
    import_file(dir.join(format!("{name}.onnx")), &opts)
}

/// The figures a plan is compared by.
#[derive(Debug, PartialEq, Eq)]
struct Figures {
    kernels_original: usize,
    kernels_fused: usize,
    launches: usize,
    pool_bytes: usize,
    weights_bytes: u64,
    io_bytes: u64,
    concats_eliminated: usize,
}

fn figures(model: &OnnxModel) -> Figures {
    let plan = ExecutionPlan::build(&model.graph, 1).unwrap();
    assert!(graph_plan::verify(&plan).is_ok(), "{}: plan fails verify", model.graph.name());
    Figures {
        kernels_original: plan.kernel_count_original,
        kernels_fused: plan.kernel_count_fused,
        launches: plan.compute_steps(),
        pool_bytes: plan.pool_bytes,
        weights_bytes: plan.region_bytes(Region::Weights),
        io_bytes: plan.region_bytes(Region::Io),
        concats_eliminated: plan.nodes().iter().filter(|n| n.eliminated).count(),
    }
}

#[test]
fn dynamic_models_plan_at_every_batch() {
    let Some(dir) = models_dir() else { return };
    for name in MODELS {
        let mut at1 = None;
        for batch in [1usize, 2, 8, 32] {
            let m =
                import_at(&dir.join("dynamic"), name, Some(batch)).unwrap_or_else(|e| panic!("{name}@{batch}: {e}"));
            let input = m.graph.tensor(m.graph.inputs()[0]);
            assert_eq!(input.shape.0[0], batch, "{name}@{batch}: input {}", input.name);
            let output = m.graph.tensor(m.graph.outputs()[0]);
            assert_eq!(output.shape.0[0], batch, "{name}@{batch}: output {}", output.name);
            let f = figures(&m);
            eprintln!("{name}@{batch}: {f:?} folded {}", m.stats.folded_nodes);
            match &at1 {
                None => at1 = Some(f),
                Some(one) => {
                    // The graph's structure does not depend on the batch; only the sizes do. One plan choice
                    // does: a Concat is eliminated only where each input's slice is one byte range, i.e. at
                    // batch 1 on axis 1 (googlenet's nine inception Concats), and launches as a kernel above it.
                    assert_eq!(f.kernels_original, one.kernels_original, "{name}@{batch}");
                    assert!(
                        (one.kernels_fused..=one.kernels_fused + one.concats_eliminated).contains(&f.kernels_fused),
                        "{name}@{batch}: {} launches, {} at batch 1 with {} Concats eliminated",
                        f.kernels_fused,
                        one.kernels_fused,
                        one.concats_eliminated
                    );
                    // bert's folded batch-shaped constants (token type ids, the expanded mask) grow with it.
                    if name == "bert_base" {
                        assert!(f.weights_bytes > one.weights_bytes, "{name}@{batch}: weights");
                    } else {
                        assert_eq!(f.weights_bytes, one.weights_bytes, "{name}@{batch}: weights");
                    }
                    // Every activation has the batch as its leading extent: the pool scales exactly (io is
                    // rounded up to the alignment per buffer, so only nearly).
                    assert_eq!(f.pool_bytes, batch * one.pool_bytes, "{name}@{batch}: pool");
                    assert!(f.io_bytes > (batch as u64 - 1) * one.io_bytes, "{name}@{batch}: io");
                }
            }
        }
    }
}

#[test]
fn dynamic_at_batch_one_matches_static() {
    let Some(dir) = models_dir() else { return };
    for name in MODELS {
        let stat = import_file(dir.join(format!("{name}.onnx")), &ImportOptions::default()).unwrap();
        let dynm = import_at(&dir.join("dynamic"), name, Some(1)).unwrap();
        let (s, d) = (figures(&stat), figures(&dynm));
        eprintln!("{name}: static {s:?}\n{name}: dynamic {d:?}");
        assert_eq!(d, s, "{name}");
    }
}

#[test]
fn unbound_batch_is_named() {
    let Some(dir) = models_dir() else { return };
    for (name, input) in
        [("bert_base", "input_ids"), ("googlenet", "pixels"), ("mobilenet_v2", "pixels"), ("resnet50", "pixels")]
    {
        let e = import_at(&dir.join("dynamic"), name, None).unwrap_err();
        assert!(
            matches!(&e, OnnxError::UnboundDim { input: i, axis: 0, dim } if i == input && dim == "batch"),
            "{name}: {e}"
        );
        assert_eq!(
            e.to_string(),
            format!("input '{input}' dimension 0 is symbolic ('batch'); bind it with --dim batch=VALUE")
        );
        let e = import_file(
            dir.join(format!("dynamic/{name}.onnx")),
            &ImportOptions::with_dims([("batch", 2), ("seq", 4)]),
        )
        .unwrap_err();
        assert!(matches!(&e, OnnxError::UnusedDimBinding { dim, .. } if dim == "seq"), "{name}: {e}");
    }
}
