//! One module per collector kind; the module name is the kind string.

pub mod billing;
pub mod dcgm;
pub mod kubernetes;
