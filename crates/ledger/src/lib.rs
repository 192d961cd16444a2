//! gpuledger's pure logic: decoding and validating pushes, merging a GPU's attributes from its
//! sources, ownership with its reason, hourly rates with their origin, and the summary
//! arithmetic of BRIEF section 4. No IO: everything here is tested with plain values.

pub mod billing;
pub mod catalog;
pub mod facts;
pub mod forecast;
pub mod identity;
pub mod ingest;
pub mod merge;
pub mod mig;
pub mod ownership;
pub mod rates;
pub mod settings;
pub mod summary;
pub mod usedby;
pub mod waste;

pub use ingest::{
    clip, decode_body, echo, raw_cutoff, validate_body, validate_collected, BodyLimits,
    DecodeError, Rejection, TimeBounds, Validated, MESSAGE_CHARS,
};
pub use merge::{merge_gpu, GpuRecord};
pub use ownership::{Ownership, OwnershipRules};
pub use rates::{
    Contract, ContractPrice, InstanceOverride, OnPremRate, RateFacts, RateTable, BUILTIN_RATES,
    BUILTIN_RATES_AS_OF,
};
pub use settings::Settings;
pub use summary::{summarize, GpuWindow, GroupBy};
