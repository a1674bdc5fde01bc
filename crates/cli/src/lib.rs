//! The library half of the `cuplan` package: what the command line shares with other front ends (the Python
//! binding, `crates/py`). Loading a GRAPH argument ([`load`]), the `plan --report` object ([`report`]) and the
//! views of a finished plan ([`viz`]: the `explain` table, the memory SVG, the kernel DAG as DOT) sit here; the
//! subcommands themselves (argument parsing, printing, exit codes) stay in the `cuplan` binary (`main.rs`).

pub mod load;
pub mod report;
pub mod set;
pub mod viz;
