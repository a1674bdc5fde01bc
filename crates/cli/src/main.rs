//! The `cuplan` command line (placeholder until the CLI lands).
fn main() {}
