#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `pack` fuzz target's check (`graph_passes::fuzz_entry`) under proptest with a fixed case count (the CI smoke
//! run when no fuzzer runs), and the packer's error paths on hostile sizes.

use graph_passes::fuzz_entry::{pack_from_bytes, pack_instance};
use graph_passes::memory::pack::{pack, Buffer, PackOptions};
use proptest::prelude::*;

#[test]
fn sizes_that_overflow_are_errors() {
    // Two buffers live together whose sizes add past u64::MAX: the pool cannot exist.
    let bufs =
        [Buffer { lower: 0, upper: 2, size: u64::MAX / 2 + 1 }, Buffer { lower: 1, upper: 3, size: u64::MAX / 2 + 1 }];
    assert!(pack(&bufs, &PackOptions::default()).is_err());
    // u64::MAX rounded up to an alignment overflows too.
    let one = [Buffer { lower: 0, upper: 1, size: u64::MAX }];
    assert!(pack_instance(&one, &PackOptions { alignment: 256, ..PackOptions::default() }).is_err());
}

#[test]
fn disjoint_lifetimes_may_share_and_touching_ends_do_not_overlap() {
    let bufs = [Buffer { lower: 0, upper: 3, size: 100 }, Buffer { lower: 3, upper: 5, size: 100 }];
    pack_instance(&bufs, &PackOptions::default()).unwrap();
    let p = pack(&bufs, &PackOptions::default()).unwrap();
    assert_eq!(p.height, 100);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The `pack` fuzz target on arbitrary bytes.
    #[test]
    fn pack_random_instances(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = pack_from_bytes(&bytes);
    }
}
