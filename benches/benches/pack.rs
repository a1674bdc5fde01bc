//! Criterion benchmarks of the buffer packer: the MiniMalloc instances (default budget, and greedy only) and a
//! synthetic million-buffer transformer stack.
//!
//! The MiniMalloc CSVs are read from `shared/bench/minimalloc` next to the workspace (`CARGO_MANIFEST_DIR/../../
//! shared/bench/minimalloc`, or the nearest ancestor that has it); when absent, those benchmarks are skipped with
//! a message.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use graph_passes::memory::pack::{self, csv, Budget, Buffer, PackOptions};

/// A stack of transformer layers: each activation lives a few steps, each layer's residual crosses into the next
/// layer, and a few buffers (caches, workspaces) live throughout. Deterministic for a seed.
pub fn transformer_stack(buffers: usize, seed: u64) -> Vec<Buffer> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    const LONG: usize = 8;
    const PER_LAYER: usize = 10;
    let layers = buffers.saturating_sub(LONG) / PER_LAYER;
    let steps = layers as u64 * 8 + 10;
    let hidden = 4096u64 * 2;
    let mut out = Vec::with_capacity(buffers);
    for l in 0..layers as u64 {
        let t = l * 8;
        // Sequence length varies per layer group, as with bucketed batches.
        let seq = 128 * (1 + (next() % 8));
        let h = hidden * seq;
        let scores = 2 * seq * seq * 16;
        out.extend([
            Buffer::new(t, t + 9, h),                      // residual, read by the next layer
            Buffer::new(t + 1, t + 2, h),                  // layer norm
            Buffer::new(t + 1, t + 3, 3 * h),              // qkv
            Buffer::new(t + 2, t + 4, scores),             // attention scores
            Buffer::new(t + 3, t + 5, scores),             // softmax
            Buffer::new(t + 4, t + 6, h),                  // attention output
            Buffer::new(t + 5, t + 7, h),                  // projection
            Buffer::new(t + 6, t + 8, 4 * h),              // mlp up
            Buffer::new(t + 7, t + 9, 4 * h),              // activation
            Buffer::new(t + 8, t + 10, h + next() % 4096), // mlp down, odd size
        ]);
    }
    for k in 0..(buffers - out.len()) as u64 {
        out.push(Buffer::new(0, steps, (1 + k) * 1_048_576));
    }
    out
}

/// `shared/bench/minimalloc` beside the workspace: `CARGO_MANIFEST_DIR/../../shared/...` for a checkout at
/// `/work/main`, or the first ancestor holding it (a worktree deeper down).
fn minimalloc_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|a| a.join("shared/bench/minimalloc"))
        .find(|d| d.is_dir())
        .unwrap_or_else(|| manifest.join("../../shared/bench/minimalloc"))
}

fn minimalloc(c: &mut Criterion) {
    let dir = minimalloc_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!("skipping the MiniMalloc benchmarks: {} not found", dir.display());
        return;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    let mut group = c.benchmark_group("pack/minimalloc");
    group.sample_size(10);
    for path in files {
        let name = path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let Ok(text) = std::fs::read_to_string(&path) else {
            println!("skipping {}: unreadable", path.display());
            continue;
        };
        let Ok(rows) = csv::parse(&text) else {
            println!("skipping {}: not a MiniMalloc CSV", path.display());
            continue;
        };
        let buffers: Vec<Buffer> = rows.iter().map(|r| r.buffer).collect();
        let greedy = PackOptions { budget: Budget::greedy_only(), ..PackOptions::default() };
        group.bench_function(format!("{name}/greedy"), |b| b.iter(|| pack::pack(black_box(&buffers), &greedy)));
        group.bench_function(format!("{name}/default"), |b| {
            b.iter(|| pack::pack(black_box(&buffers), &PackOptions::default()))
        });
    }
    group.finish();
}

fn synthetic(c: &mut Criterion) {
    let mut group = c.benchmark_group("pack/synthetic");
    group.sample_size(10);
    for n in [10_000usize, 1_000_000] {
        let buffers = transformer_stack(n, 1);
        group.bench_function(format!("transformer_{n}"), |b| {
            b.iter(|| pack::pack(black_box(&buffers), &PackOptions::default()))
        });
    }
    group.finish();
}

criterion_group!(benches, minimalloc, synthetic);
criterion_main!(benches);
