#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Phase A: the hand-written protobuf messages decode every shared model and round-trip through encode.
use graph_onnx::proto::{op_inventory, ModelProto};
use prost::Message;

#[test]
fn inventory() {
    for m in ["resnet50", "mobilenet_v2", "googlenet", "bert_base"] {
        let bytes = std::fs::read(format!("/work/shared/models/{m}.onnx")).unwrap();
        let t = std::time::Instant::now();
        let model = ModelProto::decode(bytes.as_slice()).unwrap();
        let el = t.elapsed();
        let g = model.graph.as_ref().unwrap();
        println!(
            "{m}: {} nodes {} inits decode {:?}",
            g.node.len(),
            g.initializer.len(),
            el
        );
        let mut inv: Vec<_> = op_inventory(g).into_iter().collect();
        inv.sort();
        for ((d, op), (n, attrs)) in inv {
            println!("  {d}:{op} x{n} {attrs:?}");
        }
        // Round trip
        let re = model.encode_to_vec();
        assert_eq!(ModelProto::decode(re.as_slice()).unwrap(), model);
    }
}
