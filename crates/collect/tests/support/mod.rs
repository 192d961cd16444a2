//! Test helpers shared by test binaries (also included by the gpuledger binary's tests).

pub mod kube_api;
