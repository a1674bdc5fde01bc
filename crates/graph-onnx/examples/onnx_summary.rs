//! Imports ONNX files and prints what came out, with the median import time over a few runs.
//!
//! `cargo run --release -p graph-onnx --example onnx_summary -- MODEL.onnx [--dim NAME=VALUE ...]`

use std::time::Instant;

use graph_onnx::{import, ImportOptions};

fn main() {
    let mut opts = ImportOptions::default();
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--dim" {
            let Some((k, v)) = args.next().and_then(|s| s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            else {
                eprintln!("--dim needs NAME=VALUE");
                std::process::exit(2);
            };
            let Ok(v) = v.parse() else {
                eprintln!("--dim {k}: '{v}' is not a number");
                std::process::exit(2);
            };
            opts.dims.insert(k, v);
        } else {
            files.push(a);
        }
    }
    for f in files {
        let bytes = match std::fs::read(&f) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{f}: {e}");
                continue;
            }
        };
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..7 {
            let t = Instant::now();
            let r = import(&bytes, &opts);
            times.push(t.elapsed());
            last = Some(r);
        }
        times.sort();
        match last {
            Some(Ok(m)) => {
                let w: usize = m.weights.iter().map(|w| w.bytes.len()).sum();
                println!(
                    "{f}: {} bytes, opset {}, {:?}; {} tensors; {} weights with data ({w} bytes); median import {:?}",
                    bytes.len(),
                    m.opset,
                    m.stats,
                    m.graph.num_tensors(),
                    m.weights.len(),
                    times[times.len() / 2]
                );
            }
            Some(Err(e)) => println!("{f}: error: {e}"),
            None => {}
        }
    }
}
