//! Shared helpers for cuplan benchmarks.
