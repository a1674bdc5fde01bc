//! graph-plan: placeholder
