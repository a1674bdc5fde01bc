#![allow(clippy::unwrap_used, clippy::expect_used)]
//! scratch
use graph_onnx::{import, ImportOptions};

#[test]
fn smoke() {
    for m in ["resnet50", "mobilenet_v2", "googlenet", "bert_base"] {
        let bytes = std::fs::read(format!("/work/shared/models/{m}.onnx")).unwrap();
        let t = std::time::Instant::now();
        let r = import(&bytes, &ImportOptions::default());
        let el = t.elapsed();
        match r {
            Ok(model) => println!(
                "{m}: {:?} in {el:?}; tensors {} weights-with-data {}",
                model.stats,
                model.graph.num_tensors(),
                model.weights.len()
            ),
            Err(e) => println!("{m}: ERROR {e}"),
        }
    }
}
