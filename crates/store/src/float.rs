//! Nullable floats, bound so that PostgreSQL always sees `DOUBLE PRECISION`.
//!
//! sqlx 0.8's Any driver sends a NULL `f64` as a `real` (float4) parameter (its `Null(Double)`
//! maps to `Option<f32>`). A cached prepared statement first run with a NULL there keeps that
//! parameter type, and every later run of it with a value fails with "incorrect binary data
//! format": a GPU without a rate, or a sample without `sm_active`, would break later writes
//! on that connection. [`F64`] sends its NULL the way the driver sends a NULL `real`, which it
//! maps to an `f64` NULL; values go as plain `f64`.

use sqlx::any::{Any, AnyTypeInfo, AnyTypeInfoKind};
use sqlx::encode::{Encode, IsNull};
use sqlx::error::BoxDynError;
use sqlx::Type;
use sqlx_core::any::{AnyArgumentBuffer, AnyValueKind};

/// An optional `f64` to bind; see the module docs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct F64(pub Option<f64>);

impl Type<Any> for F64 {
    fn type_info() -> AnyTypeInfo {
        <f64 as Type<Any>>::type_info()
    }
}

impl<'q> Encode<'q, Any> for F64 {
    fn encode_by_ref(&self, buf: &mut AnyArgumentBuffer<'q>) -> Result<IsNull, BoxDynError> {
        match self.0 {
            Some(v) => <f64 as Encode<'q, Any>>::encode_by_ref(&v, buf),
            None => {
                // `Null(Real)` is what the driver turns into an `f64` NULL.
                buf.0.push(AnyValueKind::Null(AnyTypeInfoKind::Real));
                Ok(IsNull::Yes)
            }
        }
    }
}
