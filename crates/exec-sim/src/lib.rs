//! exec-sim: placeholder
