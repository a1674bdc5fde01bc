//! Fuzzing and property entry point for the packing core: pack a buffer list, then check the packing with a
//! checker that shares nothing with the packer. The same function runs under proptest in `cargo test`
//! (`tests/reliability.rs`) and under `cargo fuzz` (`fuzz/fuzz_targets/pack.rs`).
//!
//! Contract: `Err(reason)` when the packer rejects the input with an error (an empty interval, offsets that
//! overflow); a **panic only on a real invariant violation**: a wrong number of offsets, a misaligned offset,
//! two buffers live at the same time sharing a byte, a height below the end of a buffer or below the
//! unaligned lower bound, or above the naive sum of aligned sizes.

use graph_ir::fuzz_entry::ByteSource;

use crate::memory::pack::{pack, Buffer, PackOptions};

fn align_up(v: u64, a: u64) -> Option<u64> {
    v.checked_add(a - 1).map(|x| x / a * a)
}

/// Pack `buffers` with `opts` and check the result independently (see the module doc).
pub fn pack_instance(buffers: &[Buffer], opts: &PackOptions) -> Result<(), String> {
    let packing = pack(buffers, opts).map_err(|e| e.to_string())?;
    let a = opts.alignment.max(1);
    let offsets = &packing.offsets;
    assert_eq!(offsets.len(), buffers.len(), "invariant: {} offsets for {} buffers", offsets.len(), buffers.len());
    let mut naive = 0u128;
    for (i, (b, &o)) in buffers.iter().zip(offsets).enumerate() {
        assert!(o % a == 0, "invariant: buffer {i} at offset {o}, not a multiple of {a}");
        let end = u128::from(o) + u128::from(b.size);
        assert!(end <= u128::from(packing.height), "invariant: buffer {i} ends at {end}, above {}", packing.height);
        naive += u128::from(align_up(b.size, a).unwrap_or(u64::MAX));
    }
    assert!(u128::from(packing.height) <= naive, "invariant: height {} above the naive {naive} bytes", packing.height);
    // Sweep by start time; among the buffers live at each start, any byte overlap is a violation. Sorting the
    // live set by offset makes each check a neighbour comparison.
    let mut order: Vec<usize> = (0..buffers.len()).filter(|&i| buffers[i].size > 0).collect();
    order.sort_by_key(|&i| (buffers[i].lower, i));
    let mut live: std::collections::BTreeMap<(u64, usize), ()> = std::collections::BTreeMap::new();
    let mut by_end: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>> = Default::default();
    let mut peak = 0u128;
    let mut live_bytes = 0u128;
    for &i in &order {
        let b = buffers[i];
        while let Some(&std::cmp::Reverse((end, j))) = by_end.peek() {
            if end > b.lower {
                break;
            }
            by_end.pop();
            live.remove(&(offsets[j], j));
            live_bytes -= u128::from(buffers[j].size);
        }
        let (o, end) = (offsets[i], u128::from(offsets[i]) + u128::from(b.size));
        // The live buffer starting at or below `o` nearest to it, and the one starting above it.
        if let Some((&(po, j), _)) = live.range(..=(o, usize::MAX)).next_back() {
            let pend = u128::from(po) + u128::from(buffers[j].size);
            assert!(pend <= u128::from(o), "invariant: buffers {j} and {i} are live together and overlap at {o}");
        }
        if let Some((&(no, j), _)) = live.range((o, usize::MAX)..).next() {
            assert!(end <= u128::from(no), "invariant: buffers {i} and {j} are live together and overlap at {no}");
        }
        live.insert((o, i), ());
        by_end.push(std::cmp::Reverse((b.upper, i)));
        live_bytes += u128::from(b.size);
        peak = peak.max(live_bytes);
    }
    assert!(
        u128::from(packing.height) >= peak,
        "invariant: height {} below the {peak} bytes live at once",
        packing.height
    );
    Ok(())
}

/// Sizes: mostly small, with the alignment edges and a few huge ones for the overflow paths.
const SIZES: [u64; 12] = [1, 256, 255, 257, 4096, 100, 0, 1 << 20, 3, 1 << 40, 1 << 62, u64::MAX];

/// A buffer list and options from fuzz bytes: up to 64 buffers over up to 256 time steps, some with empty
/// or reversed intervals (rejected with an error).
pub fn buffers_from_bytes(bytes: &[u8]) -> (Vec<Buffer>, PackOptions) {
    let mut b = ByteSource::new(bytes);
    let alignment = [1, 256, 64, 1 << 12][b.below(4)];
    let n = b.below(65);
    let mut buffers = Vec::with_capacity(n);
    for _ in 0..n {
        let lower = u64::from(b.byte());
        let len = u64::from(b.byte() % 32);
        // Length 0 (empty interval) stays rare: it is a plain error on the first occurrence.
        let upper = if len == 0 && b.byte() > 8 { lower + 1 } else { lower + len };
        let pick = b.byte();
        let size = if pick < 200 { u64::from(b.u16()) } else { SIZES[usize::from(pick) % SIZES.len()] };
        buffers.push(Buffer { lower, upper, size });
    }
    let mut opts = PackOptions { alignment, ..PackOptions::default() };
    // A small deterministic search budget: the fuzzer wants many instances per second.
    opts.budget.effort = opts.budget.effort.min(20_000);
    (buffers, opts)
}

/// The `pack` fuzz target.
pub fn pack_from_bytes(bytes: &[u8]) -> Result<(), String> {
    let (buffers, opts) = buffers_from_bytes(bytes);
    pack_instance(&buffers, &opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checker_accepts_a_known_packing_and_errors_pass_through() {
        let bufs = [
            Buffer { lower: 0, upper: 2, size: 100 },
            Buffer { lower: 1, upper: 3, size: 50 },
            Buffer { lower: 2, upper: 4, size: 100 },
        ];
        pack_instance(&bufs, &PackOptions { alignment: 64, ..PackOptions::default() }).unwrap();
        let bad = [Buffer { lower: 3, upper: 3, size: 1 }];
        assert!(pack_instance(&bad, &PackOptions::default()).unwrap_err().contains("empty"));
    }
}
