//! `GET /api/v1/forecast`: month-end, next-month and next-quarter spend per team, environment
//! or cloud with their ranges, and the GPU-hours demand trend per group and per model, as
//! `ledger::forecast` makes them from the store's daily rows. Nothing is computed here.

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpuledger_ledger::forecast::Forecast;
use gpuledger_ledger::GroupBy;
use serde::Serialize;

use crate::contract;
use crate::params::{Params, ReadScope};
use crate::{error, AppState};

/// What a forecast may group by: the owner attributes and the cloud.
pub const GROUPS: [GroupBy; 3] = [GroupBy::Team, GroupBy::Env, GroupBy::Cloud];

/// The `group_by` of a forecast query, or the refusal naming the parameter.
pub fn group_by(p: &Params) -> Result<GroupBy, String> {
    match p.group_by {
        None => Ok(GroupBy::Team),
        Some(by) if GROUPS.contains(&by) => Ok(by),
        Some(by) => Err(format!(
            "group_by: a forecast groups by team, env or cloud, got `{}`",
            by.as_str()
        )),
    }
}

/// A model's GPU-hours demand trend.
#[derive(Debug, Serialize)]
pub struct ModelDemand {
    pub key: String,
    pub demand: Option<gpuledger_ledger::forecast::Demand>,
}

#[derive(Debug, Serialize)]
pub struct ForecastReply {
    pub as_of: chrono::DateTime<chrono::Utc>,
    pub group_by: &'static str,
    pub groups: Vec<Forecast>,
    pub total: Forecast,
    pub models: Vec<ModelDemand>,
}

/// The forecast reply as of `now` (the API and the pages read the same).
pub async fn reply(
    state: &AppState,
    p: &Params,
    by: GroupBy,
    now: chrono::DateTime<chrono::Utc>,
) -> gpuledger_store::Result<ForecastReply> {
    let ((groups, total), (models, _)) = tokio::try_join!(
        state.store.forecast(&p.filters, by, now),
        state.store.forecast(&p.filters, GroupBy::Model, now),
    )?;
    Ok(ForecastReply {
        as_of: now,
        group_by: by.as_str(),
        groups,
        total,
        models: models
            .into_iter()
            .map(|f| ModelDemand {
                key: f.key,
                demand: f.demand,
            })
            .collect(),
    })
}

pub async fn forecast(
    State(state): State<AppState>,
    scope: ReadScope,
    RawQuery(q): RawQuery,
) -> Response {
    let mut p = match Params::parse_api(q.as_deref(), &contract::FORECAST) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let by = match group_by(&p) {
        Ok(by) => by,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if let Err(e) = scope.apply(&mut p) {
        return error(StatusCode::FORBIDDEN, e);
    }
    match reply(&state, &p, by, state.now()).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "forecast query failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    }
}
