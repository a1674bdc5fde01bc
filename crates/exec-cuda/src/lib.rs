//! exec-cuda: placeholder
