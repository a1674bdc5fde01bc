//! Packing core: offsets for plain buffers with lifetimes (placeholder).
