//! One module per collector kind; the module name is the kind string.

pub mod aws;
pub mod azure;
pub mod billing;
pub mod cloud;
pub mod dcgm;
pub mod gcp;
pub mod kubernetes;
pub mod slurm;
pub mod spreadsheet;
