use super::*;

#[test]
fn f32_bytes_convert_with_round_to_nearest_even_and_overflow_to_infinity() {
    let vals = [1.0f32, -2.5, 65504.0, 65520.0, 1.0 + 1.0 / 2048.0, 1e-8, f32::NAN];
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let h = convert_f32_bytes(&bytes, DType::F16);
    let got: Vec<u16> = h.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0). 65520 rounds to infinity; 1e-8 to 0.
    assert_eq!(&got[..6], &[0x3c00, 0xc100, 0x7bff, 0x7c00, 0x3c00, 0x0000]);
    assert!(half::f16::from_bits(got[6]).is_nan());
    let b = convert_f32_bytes(&bytes, DType::BF16);
    let got: Vec<u16> = b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    assert_eq!(&got[..4], &[0x3f80, 0xc020, 0x4780, 0x4780]);
    assert_eq!(convert_f32_bytes(&bytes, DType::F32), bytes);
}

#[test]
fn default_list_entries_parse_and_name_their_reason() {
    let list = default_keep_f32();
    assert_eq!(list.len(), DEFAULT_KEEP_F32.len());
    assert!(list.contains(&KeepEntry::SoftmaxInput));
    assert!(list.contains(&KeepEntry::Op("LayerNormalization".into())));
    for (entry, reason) in DEFAULT_KEEP_F32 {
        assert!(parse_entry(entry).is_ok(), "{entry}");
        assert!(reason.len() > 20, "{entry} needs its reason");
    }
}
