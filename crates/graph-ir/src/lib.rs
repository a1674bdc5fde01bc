//! graph-ir: placeholder
