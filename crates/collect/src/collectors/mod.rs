//! One module per collector kind; the module name is the kind string.

pub mod dcgm;
pub mod kubernetes;
