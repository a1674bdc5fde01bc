//! The memory pass: offset assignment of activations into one pool.
pub mod pack;
