//! Reading the store: GPU lists and details, the summary of BRIEF section 4, sources.
//!
//! Aggregates come from the hour and day rollups; raw samples are never scanned. A window uses
//! day rollups for its whole UTC days and hour rollups for the partial days at its edges.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use gpuledger_ledger::usedby::{split, HeldShare, UsedBy};
use gpuledger_ledger::{summarize, GpuRecord, GpuWindow, GroupBy};
use gpuledger_model::{
    day_floor, hour_floor, AttributeProvenance, GpuDetail, GpuState, GpuView, HourPoint,
    OwnerPeriod, SourceStatus, SourceView, Summary, DAY_SECS, HOUR_SECS, ORIGIN_ALLOCATION,
    ORIGIN_SAMPLES,
};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::live::{self, LiveRow};
use crate::rollup::{EVIDENCE_ACTIVITY, EVIDENCE_MEMORY};
use crate::rows::{allocation_from_row, gpu_from_row, ts, GpuRow, GPU_COLUMNS};
use crate::{Result, Store, StoreError, OPEN_END};

/// Filters shared by every query: each list matches any of its values; empty lists match all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    pub team: Vec<String>,
    pub env: Vec<String>,
    pub cloud: Vec<String>,
    pub cluster: Vec<String>,
    pub model: Vec<String>,
    pub vendor: Vec<String>,
}

impl Filters {
    /// The filter keys, in the order every page shows them: the one list the query string,
    /// the filter bar, links and SQL use. They are also what a summary can group by.
    pub const KEYS: [&'static str; 6] = GroupBy::NAMES;

    /// The values of filter `key` (one of [`Filters::KEYS`]).
    pub fn values(&self, key: &str) -> &[String] {
        match key {
            "team" => &self.team,
            "env" => &self.env,
            "cloud" => &self.cloud,
            "cluster" => &self.cluster,
            "model" => &self.model,
            "vendor" => &self.vendor,
            _ => &[],
        }
    }

    /// The values of filter `key` to add to; `None` for a name that is no filter.
    pub fn values_mut(&mut self, key: &str) -> Option<&mut Vec<String>> {
        Some(match key {
            "team" => &mut self.team,
            "env" => &mut self.env,
            "cloud" => &mut self.cloud,
            "cluster" => &mut self.cluster,
            "model" => &mut self.model,
            "vendor" => &mut self.vendor,
            _ => return None,
        })
    }

    /// Each key with its values, in [`Filters::KEYS`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &[String])> {
        Filters::KEYS.into_iter().map(|k| (k, self.values(k)))
    }

    pub fn is_empty(&self) -> bool {
        self.iter().all(|(_, v)| v.is_empty())
    }

    /// Whether a row passes the filters as their SQL clause ([`Filters::clause_with`]) passes
    /// it: for each key filtered, the row's value (`row`, in [`Filters::KEYS`] order) is one
    /// of the key's values, byte for byte as the database compares text; a row without one
    /// (NULL) passes no filter of its key. What a kept whole-fleet answer is filtered by
    /// (`crate::live`).
    pub(crate) fn admits(&self, row: [Option<&str>; 6]) -> bool {
        self.iter().zip(row).all(|((_, values), v)| {
            values.is_empty() || v.is_some_and(|v| values.iter().any(|x| x == v))
        })
    }

    /// ` AND g.team IN ($n, ...) ...` numbered from `first`, with the values to bind in order.
    pub(crate) fn clause(&self, first: usize) -> (String, Vec<String>) {
        self.clause_with(first, "g")
    }

    /// Whether team or environment is filtered (they come from the owner history).
    pub(crate) fn by_owner(&self) -> bool {
        !self.team.is_empty() || !self.env.is_empty()
    }

    /// As [`Filters::clause`], with team and environment read from the owner history row
    /// aliased `owner` (owner at the time of the data) instead of the GPU's current owner.
    pub(crate) fn clause_with(&self, first: usize, owner: &str) -> (String, Vec<String>) {
        self.clause_on(first, owner, "g")
    }

    /// As [`Filters::clause_with`], with the GPU's attributes read from the row aliased
    /// `attrs` instead of `g`.
    pub(crate) fn clause_on(
        &self,
        first: usize,
        owner: &str,
        attrs: &str,
    ) -> (String, Vec<String>) {
        let mut sql = String::new();
        let mut binds = Vec::new();
        for (col, vals) in self.iter() {
            if vals.is_empty() {
                continue;
            }
            let marks: Vec<String> = vals
                .iter()
                .map(|v| {
                    binds.push(v.clone());
                    format!("${}", first + binds.len() - 1)
                })
                .collect();
            let table = if matches!(col, "team" | "env") {
                owner
            } else {
                attrs
            };
            sql.push_str(&format!(" AND {table}.{col} IN ({})", marks.join(",")));
        }
        (sql, binds)
    }
}

/// One account, project or subscription a cloud collector read ([`Store::cloud_accounts`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CloudAccount {
    pub source: String,
    /// The collector kind: `aws`, `gcp` or `azure`.
    pub kind: String,
    pub account: String,
    pub gpus: i64,
    pub hosts: i64,
    /// When the collector last reported a GPU of the account.
    pub last_seen: DateTime<Utc>,
}

/// A query window `[from, to)`, in unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub from: i64,
    pub to: i64,
}

impl Window {
    /// The clock hours counted: those starting in `[hour_floor(from), min(to, now))`.
    pub fn hours(&self, now: i64) -> (i64, i64) {
        let lo = hour_floor(self.from);
        let to = self.to.min(now);
        let hi = if to <= lo {
            lo
        } else {
            hour_floor(to - 1) + HOUR_SECS
        };
        (lo, hi)
    }
}

/// The order of the GPU lists: by host (none first), each host's physical GPUs before its
/// MIG instances, then by parent, PCI address and UUID.
type ListKey<'a> = (
    &'a Option<Arc<str>>,
    bool,
    &'a Option<Arc<str>>,
    &'a Option<Arc<str>>,
    &'a Arc<str>,
);

fn list_order(g: &GpuView) -> ListKey<'_> {
    (
        &g.host,
        g.mig_parent_uuid.is_some(),
        &g.mig_parent_uuid,
        &g.pci_bus_id,
        &g.uuid,
    )
}

impl Store {
    /// A GPU last seen at `last_seen` is present at `now` while within the stale window.
    fn state_at(&self, last_seen: i64, now: i64) -> GpuState {
        if now - last_seen < self.settings.stale_window_secs {
            GpuState::Present
        } else {
            GpuState::Missing
        }
    }

    fn view(&self, rec: GpuRecord, now: i64) -> GpuView {
        let state = self.state_at(rec.last_seen.timestamp(), now);
        GpuView {
            vendor: rec.vendor(),
            uuid: rec.uuid.into(),
            model: rec.model.into(),
            memory_mib: rec.memory_mib,
            host: rec.host.map(Into::into),
            cluster: rec.cluster.map(Into::into),
            cloud: rec.cloud.map(Into::into),
            region: rec.region.map(Into::into),
            instance_type: rec.instance_type.map(Into::into),
            account: rec.account.map(Into::into),
            serial: rec.serial.map(Into::into),
            pci_bus_id: rec.pci_bus_id.map(Into::into),
            team: rec.team.into(),
            env: rec.env.into(),
            owner_reason: rec.owner_reason.into(),
            state,
            first_seen: rec.first_seen,
            last_seen: rec.last_seen,
            usd_per_hour: rec.rate.usd_per_hour,
            rate_origin: rec.rate.origin.label().into(),
            mig_parent_uuid: rec.mig_parent_uuid.map(Into::into),
            mig_profile: rec.mig_profile.map(Into::into),
            placeholder: rec.placeholder,
            source: rec.source.into(),
            labels: Arc::new(rec.labels),
        }
    }

    /// Physical GPUs (and MIG instances when `include_mig`) matching the filters.
    pub async fn list_gpus(
        &self,
        filters: &Filters,
        include_mig: bool,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuView>> {
        self.list_gpus_of(filters, include_mig, false, now).await
    }

    /// One page of [`Store::list_gpus`] and the number of GPUs in the whole list: `page` gives
    /// the page's indexes in the list from the number there are. Only the page's GPUs are
    /// copied out of the kept list, so a page of 1,000 of 100,000 GPUs costs a thousand copies.
    pub async fn list_gpus_page(
        &self,
        filters: &Filters,
        include_mig: bool,
        page: impl FnOnce(usize) -> std::ops::Range<usize>,
        now: DateTime<Utc>,
    ) -> Result<(usize, Vec<GpuView>)> {
        if !self.keeps_live() {
            let mut views = self.list_gpus(filters, include_mig, now).await?;
            let total = views.len();
            let range = page(total);
            views.truncate(range.end);
            views.drain(..range.start.min(range.end));
            return Ok((total, views));
        }
        let rows = self.kept_list(include_mig, false, now).await?;
        let listed: Vec<&ListedGpu> = rows
            .iter()
            .filter(|r| filters.admits(r.filter_values()))
            .collect();
        let total = listed.len();
        let now = now.timestamp();
        let views = listed[page(total)]
            .iter()
            .map(|r| self.kept_view(r, now))
            .collect();
        Ok((total, views))
    }

    /// The physical GPUs matching the filters as [`Store::list_gpus`] reads them, without
    /// the reason for the owner (empty) and without labels: for the pages that show neither
    /// (the findings, a team's GPUs), which at 10,000 GPUs read half the bytes.
    pub async fn list_gpus_brief(
        &self,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuView>> {
        self.list_gpus_of(filters, false, true, now).await
    }

    async fn list_gpus_of(
        &self,
        filters: &Filters,
        include_mig: bool,
        brief: bool,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuView>> {
        if !self.keeps_live() {
            let mut views: Vec<GpuView> = self
                .listed_gpus(filters, include_mig, brief, None, now)
                .await?
                .into_iter()
                .map(|r| r.view)
                .collect();
            views.sort_unstable_by(|a, b| list_order(a).cmp(&list_order(b)));
            return Ok(views);
        }
        let rows = self.kept_list(include_mig, brief, now).await?;
        let now = now.timestamp();
        Ok(rows
            .iter()
            .filter(|r| filters.admits(r.filter_values()))
            .map(|r| self.kept_view(r, now))
            .collect())
    }

    /// A kept GPU's view at `now`: its state was told at its read, and is told again at this
    /// request's time.
    fn kept_view(&self, r: &ListedGpu, now: i64) -> GpuView {
        let mut view = r.view.clone();
        view.state = self.state_at(view.last_seen.timestamp(), now);
        view
    }

    /// The whole fleet's list of [`Store::list_gpus_of`] kept between requests
    /// (`crate::live`; PostgreSQL only), which every filter's list is taken from: each request
    /// reads again the GPUs whose row was written since (every push writes its GPUs' last
    /// seen). Its GPUs' states are as of their read.
    pub(crate) async fn kept_list(
        &self,
        include_mig: bool,
        brief: bool,
        now: DateTime<Utc>,
    ) -> Result<Arc<Vec<ListedGpu>>> {
        let changed = format!(
            "SELECT string_agg(CAST(g.id AS TEXT), ',') FROM gpus g WHERE {}",
            live::written_since("g")
        );
        let all = Filters::default();
        let all = &all;
        self.live_rows(
            &self.live.lists,
            format!("GPU list with MIG {include_mig} brief {brief}"),
            &changed,
            &[],
            |a: &ListedGpu, b: &ListedGpu| list_order(&a.view).cmp(&list_order(&b.view)),
            |only| async move {
                self.listed_gpus(all, include_mig, brief, only.as_deref(), now)
                    .await
            },
        )
        .await
    }

    /// The rows of [`Store::list_gpus_of`] as read from the database, in no order; of the GPUs
    /// `only` alone where given (PostgreSQL only: they are written in place as an array).
    async fn listed_gpus(
        &self,
        filters: &Filters,
        include_mig: bool,
        brief: bool,
        only: Option<&[i64]>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ListedGpu>> {
        let (clause, binds) = filters.clause(1);
        let mig = if include_mig {
            ""
        } else {
            " AND g.mig_parent_uuid IS NULL"
        };
        let only = only
            .map(|ids| format!(" AND g.id = ANY({})", live::id_array(ids)))
            .unwrap_or_default();
        // A list shows no attribute provenance and no holders: those two columns, most of a
        // record's bytes, are left unread.
        let mut columns = GPU_COLUMNS
            .replace(", ", ", g.")
            .replacen("id", "g.id", 1)
            .replace("g.attr_seen", "'{}' AS attr_seen")
            .replace("g.holders", "'[]' AS holders");
        if brief {
            columns = columns
                .replace("g.owner_reason", "'' AS owner_reason")
                .replace("g.labels", "'{}' AS labels");
        }
        // The stored vendor last, which the kept lists are filtered by.
        let inner =
            format!("SELECT {columns}, g.vendor FROM gpus g WHERE 1 = 1{mig}{only}{clause}");
        let wide: Vec<crate::wide::Col> = GPU_COLUMNS
            .split(", ")
            .chain(["vendor"])
            .map(|c| match c.trim() {
                "usd_per_hour" => crate::wide::Col::Real("usd_per_hour"),
                c => crate::wide::Col::Plain(c),
            })
            .collect();
        // Ordered by the caller rather than by the database: sorting 10,000 wide rows took
        // SQLite a third of the read, and the order is then the same bytewise one on both
        // backends whatever PostgreSQL's collation (no host, no PCI address first).
        let sql = self.wide_sql(&inner, &wide, "");
        let sql = self.sql(&sql);
        let mut q = sqlx::query_scalar(&sql).persistent(false);
        for b in binds {
            q = q.bind(b);
        }
        let rows: Vec<GpuRow> = Self::wide_rows(q.fetch_one(self.pool()).await?)?;
        let now = now.timestamp();
        Ok(rows
            .into_iter()
            .map(|mut r| {
                let vendor = r.vendor.take();
                let (id, rec) = r.record();
                ListedGpu {
                    id,
                    view: self.view(rec, now),
                    vendor,
                }
            })
            .collect())
    }

    /// One GPU (or MIG instance) as the lists show it.
    pub async fn gpu(&self, uuid: &str, now: DateTime<Utc>) -> Result<Option<GpuView>> {
        let row =
            sqlx::query(&self.sql(&format!("SELECT {GPU_COLUMNS} FROM gpus WHERE uuid = $1")))
                .bind(uuid.to_string())
                .fetch_optional(self.pool())
                .await?;
        row.map(|r| gpu_from_row(&r).map(|(_, rec)| self.view(rec, now.timestamp())))
            .transpose()
    }

    /// One GPU with its provenance, MIG children, hourly series and allocations in `window`.
    pub async fn gpu_detail(
        &self,
        uuid: &str,
        window: Window,
        now: DateTime<Utc>,
    ) -> Result<Option<GpuDetail>> {
        let row =
            sqlx::query(&self.sql(&format!("SELECT {GPU_COLUMNS} FROM gpus WHERE uuid = $1")))
                .bind(uuid.to_string())
                .fetch_optional(self.pool())
                .await?;
        let Some(row) = row else { return Ok(None) };
        let (id, rec) = gpu_from_row(&row)?;
        let provenance = sqlx::query(&self.sql(
            "SELECT attribute, value, source, observed_at FROM gpu_attrs WHERE gpu_id = $1 \
             ORDER BY attribute, observed_at DESC",
        ))
        .bind(id)
        .fetch_all(self.pool())
        .await?
        .iter()
        .map(|r| {
            Ok(AttributeProvenance {
                attribute: r.try_get("attribute")?,
                value: r.try_get("value")?,
                source: r.try_get("source")?,
                observed_at: ts(r.try_get("observed_at")?),
            })
        })
        .collect::<Result<Vec<_>>>()?;
        let owner_history = self.owner_history(id).await?;
        let mig_children: Vec<String> = sqlx::query_scalar(
            &self
                .sql("SELECT uuid FROM gpus WHERE mig_parent_uuid = $1 ORDER BY mig_profile, uuid"),
        )
        .bind(uuid.to_string())
        .fetch_all(self.pool())
        .await?;
        let (lo, hi) = window.hours(now.timestamp());
        let hours = sqlx::query(&self.sql(
            "SELECT hour, samples, act_n, act_sum, mem_max, power_sum, power_n, allocated, \
             evidence FROM gpu_hours WHERE gpu_id = $1 AND hour >= $2 AND hour < $3 ORDER BY hour",
        ))
        .bind(id)
        .bind(lo)
        .bind(hi)
        .fetch_all(self.pool())
        .await?
        .iter()
        .map(|r| {
            let act_n: i64 = r.try_get("act_n")?;
            let act_sum: f64 = r.try_get("act_sum")?;
            let power_n: i64 = r.try_get("power_n")?;
            let power_sum: f64 = r.try_get("power_sum")?;
            let evidence: i64 = r.try_get("evidence")?;
            let mem: Option<f64> = r.try_get("mem_max")?;
            let origin = |bit: i64| {
                if evidence & bit != 0 {
                    ORIGIN_ALLOCATION
                } else {
                    ORIGIN_SAMPLES
                }
                .to_string()
            };
            Ok(HourPoint {
                hour: ts(r.try_get("hour")?),
                samples: r.try_get("samples")?,
                activity_pct: (act_n > 0).then(|| act_sum / act_n as f64),
                activity_origin: (act_n > 0).then(|| origin(EVIDENCE_ACTIVITY)),
                mem_used_mib_max: mem,
                mem_origin: mem.map(|_| origin(EVIDENCE_MEMORY)),
                power_w_avg: (power_n > 0).then(|| power_sum / power_n as f64),
                allocated: r.try_get::<i64, _>("allocated")? != 0,
            })
        })
        .collect::<Result<Vec<_>>>()?;
        let (billed_gpu_hours, billed_usd) = self.billed_hours(id, window, now).await?;
        let allocations = sqlx::query(&self.sql(
            "SELECT start_ts, end_ts, workload, kind, user_name, team, owner, source, context, \
             avg_util_pct, avg_mem_mib FROM allocations \
             WHERE gpu_id = $1 AND start_ts < $3 AND (end_ts IS NULL OR end_ts > $2) \
             ORDER BY start_ts, workload",
        ))
        .bind(id)
        .bind(window.from)
        .bind(window.to)
        .fetch_all(self.pool())
        .await?
        .iter()
        .map(|r| allocation_from_row(r, uuid.to_string()))
        .collect::<Result<Vec<_>>>()?;
        let mut by_attr: BTreeMap<&str, Vec<&gpuledger_model::AttributeProvenance>> =
            BTreeMap::new();
        for p in &provenance {
            by_attr.entry(p.attribute.as_str()).or_default().push(p);
        }
        let conflicts = by_attr
            .into_iter()
            .filter(|(_, v)| v.iter().any(|p| p.value != v[0].value))
            .map(|(attribute, v)| gpuledger_model::Conflict {
                attribute: attribute.to_string(),
                values: v.into_iter().cloned().collect(),
            })
            .collect();
        let gpu = self.view(rec, now.timestamp());
        let (usd_per_hour, rate_basis) = match &gpu.mig_parent_uuid {
            None => (gpu.usd_per_hour, format!("origin: {}", gpu.rate_origin)),
            Some(parent) => {
                let parent = self.gpu(parent, now).await?;
                gpuledger_ledger::mig::instance_rate_with_basis(
                    gpu.mig_profile.as_deref(),
                    parent.as_ref(),
                )
            }
        };
        let figures = gpuledger_ledger::summary::gpu_figures(
            &hours,
            self.settings.idle_threshold_pct,
            usd_per_hour,
            rate_basis,
        );
        Ok(Some(GpuDetail {
            gpu,
            from: ts(window.from),
            to: ts(window.to),
            conflicts,
            provenance,
            owner_history,
            billed_gpu_hours,
            billed_usd: (billed_usd * 100.0).round() / 100.0,
            cost_basis: gpuledger_model::CostBasis::of(billed_gpu_hours, hours.len() as i64),
            mig_children,
            figures,
            hours,
            allocations,
        }))
    }

    /// A GPU's present hours in the window that billing exports cover, and what was billed for
    /// them.
    async fn billed_hours(
        &self,
        id: i64,
        window: Window,
        now: DateTime<Utc>,
    ) -> Result<(i64, f64)> {
        let (lo, hi) = window.hours(now.timestamp());
        let row: (i64, f64) = sqlx::query_as(&self.sql(
            "SELECT CAST(COUNT(billed_usd) AS BIGINT), \
             CAST(COALESCE(SUM(billed_usd), 0) AS DOUBLE PRECISION) FROM gpu_hours \
             WHERE gpu_id = $1 AND hour >= $2 AND hour < $3",
        ))
        .bind(id)
        .bind(lo)
        .bind(hi)
        .fetch_one(self.pool())
        .await?;
        Ok(row)
    }

    /// The owner periods of a GPU, oldest first.
    async fn owner_history(&self, id: i64) -> Result<Vec<OwnerPeriod>> {
        sqlx::query(&self.sql(
            "SELECT from_ts, to_ts, team, env, reason FROM gpu_owners WHERE gpu_id = $1 \
             ORDER BY from_ts",
        ))
        .bind(id)
        .fetch_all(self.pool())
        .await?
        .iter()
        .map(|r| {
            let (from, to): (i64, i64) = (r.try_get("from_ts")?, r.try_get("to_ts")?);
            Ok(OwnerPeriod {
                from: (from > 0).then(|| ts(from)),
                to: (to < OPEN_END).then(|| ts(to)),
                team: r.try_get("team")?,
                env: r.try_get("env")?,
                reason: r.try_get("reason")?,
            })
        })
        .collect()
    }

    /// Per physical GPU and owner period counts over the window, from day rollups for whole
    /// days and hour rollups for the edges and for days split by a change of owner. A GPU whose
    /// owner or environment changed within the window has one row per owner, in time order;
    /// [`Store::gpu_totals`] folds them into one row per GPU.
    pub async fn gpu_windows(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuWindow>> {
        self.gpu_windows_of(window, filters, now, true).await
    }

    /// [`Store::gpu_windows`], with each GPU's peak memory (`mem_max_mib`) only when
    /// `with_mem` (a read of the index by GPU per GPU, and of the edge days' peaks, which the
    /// summary and the per-GPU tables do without).
    ///
    /// The counts of the window's part before today are kept while those days stay as they
    /// are (`crate::settled`), for every GPU and owner period whatever the filters; each
    /// request reads the attributes and owners of the GPUs the filters select with today's
    /// counts (today's day row less the hours ahead of the clock), and adds the two.
    async fn gpu_windows_of(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
        with_mem: bool,
    ) -> Result<Vec<GpuWindow>> {
        Ok(self
            .gpu_windows_split(window, filters, now, with_mem, false)
            .await?
            .0)
    }

    /// Whether the window runs to now from a day before today, so that its per-GPU rows of
    /// today ([`Store::gpu_windows_split`]) are today's part of any other read of the same
    /// filters up to now (the daily trend, the forecast): today's day rows less the hours
    /// ahead of the clock, whatever the window's start.
    pub(crate) fn shares_today(window: Window, now: DateTime<Utc>) -> bool {
        let today = day_floor(now.timestamp());
        let (lo, hi) = window.hours(now.timestamp());
        window.to >= now.timestamp() && lo < today && hi > today
    }

    /// [`Store::gpu_windows_of`], with the rows of today alone (owner periods apart, peak
    /// memory only `with_mem`) where `keep_today` and [`Store::shares_today`] (else none).
    pub(crate) async fn gpu_windows_split(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
        with_mem: bool,
        keep_today: bool,
    ) -> Result<(Vec<GpuWindow>, Vec<GpuWindow>)> {
        let today = day_floor(now.timestamp());
        let (lo, hi) = window.hours(now.timestamp());
        if lo >= today || hi <= lo {
            let windows = self
                .gpu_windows_read(window, filters, now, with_mem)
                .await?;
            return Ok((windows, Vec::new()));
        }
        let keep_today = keep_today && Self::shares_today(window, now);
        let before = Window {
            from: window.from,
            to: window.to.min(today),
        };
        let (_, before_hi) = before.hours(now.timestamp());
        let kept = self
            .settled(
                format!(
                    "window counts mem {with_mem} threshold {} hours {lo}..{before_hi}",
                    self.settings.idle_threshold_pct
                ),
                (
                    day_floor(lo),
                    today.min(day_floor(before_hi - 1) + DAY_SECS),
                ),
                || self.window_counts(before, now, with_mem),
            )
            .await?;
        let by_period: foldhash::HashMap<(i64, i64), &CountsRow> =
            kept.iter().map(|c| ((c.gpu_id, c.o_from), c)).collect();
        let live = self.window_today(lo, hi, today, filters, with_mem).await?;
        let mut out = Vec::with_capacity(live.len());
        let mut today_rows = Vec::new();
        for r in live.iter() {
            if keep_today {
                today_rows.extend(r.today(with_mem));
            }
            let c = by_period.get(&(r.gpu_id, r.o_from)).copied();
            let mut w = r.clone().window(c);
            if w.present_hours <= 0 {
                continue;
            }
            if !with_mem {
                w.mem_max_mib = None;
            }
            out.push(w);
        }
        Ok((out, today_rows))
    }

    /// The rows of today alone of [`Store::gpu_windows_split`] (owner periods apart, no peak
    /// memory) where the window shares them ([`Store::shares_today`]), else none: today's part
    /// of a read of the same filters up to now, summed from the rows every page reads (kept
    /// between requests on PostgreSQL) rather than read again.
    pub(crate) async fn todays_windows(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuWindow>> {
        if !Self::shares_today(window, now) {
            return Ok(Vec::new());
        }
        let today = day_floor(now.timestamp());
        let (lo, hi) = window.hours(now.timestamp());
        let live = self.window_today(lo, hi, today, filters, false).await?;
        Ok(live.iter().filter_map(|r| r.today(false)).collect())
    }

    /// The SQL of [`Store::gpu_windows`]' counts: the binds, the CTEs, then one row per GPU
    /// and owner period (`gpu_id`, `o_from` and [`WINDOW_SUMS`]).
    fn window_counts_sql(
        window: Window,
        now: DateTime<Utc>,
        with_mem: bool,
    ) -> ([i64; 6], String, String) {
        // Most GPUs keep one owner period over the whole window: their rows are summed per
        // GPU without looking up a period for each row (most of the cost), then given that
        // period. Only the GPUs whose owner changed within the window (`nc`) are read row by
        // row, each row under the period it fell in, through the per-GPU indexes.
        let (binds_at, unowned, peaks) = running_window_rows(window, now, with_mem);
        let (_, changed) = window_rows_of_only(window, now, "nc");
        const HI: &str = "(CASE WHEN $6 > $4 THEN $6 ELSE $4 END)";
        let rows = format!(
            "SELECT a.gpu_id, c.from_ts AS o_from, a.present, a.known, a.idle, a.alloc, \
             a.alloc_idle, a.act, a.mem, a.b_hours, a.b_usd \
             FROM (SELECT gpu_id, {WINDOW_SUMS} FROM ({unowned}) u GROUP BY gpu_id \
               HAVING SUM(present) > 0) a \
             JOIN cover c ON c.gpu_id = a.gpu_id \
             UNION ALL SELECT gpu_id, o_from, {WINDOW_SUMS} FROM ({changed}) u \
             GROUP BY gpu_id, o_from"
        );
        let ctes = format!(
            "{SPLIT_DAYS}, {peaks}\
             span AS (SELECT gpu_id, from_ts, to_ts FROM gpu_owners \
               WHERE from_ts < {HI} AND to_ts > $3), \
             cover AS (SELECT gpu_id, from_ts FROM span WHERE from_ts <= $3 AND to_ts >= {HI}), \
             nc AS (SELECT DISTINCT gpu_id FROM span \
               WHERE NOT (from_ts <= $3 AND to_ts >= {HI}))"
        );
        (binds_at, ctes, rows)
    }

    /// [`Store::gpu_windows`] read at once.
    async fn gpu_windows_read(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
        with_mem: bool,
    ) -> Result<Vec<GpuWindow>> {
        let (binds_at, ctes, rows) = Self::window_counts_sql(window, now, with_mem);
        let mut windows = self
            .gpu_windows_from(&ctes, &rows, binds_at, filters)
            .await?;
        if !with_mem {
            for w in &mut windows {
                w.mem_max_mib = None;
            }
        }
        Ok(windows)
    }

    /// The counts of [`Store::gpu_windows`] of every GPU (physical or MIG) and owner period,
    /// without attributes or filters.
    async fn window_counts(
        &self,
        window: Window,
        now: DateTime<Utc>,
        with_mem: bool,
    ) -> Result<Vec<CountsRow>> {
        let (binds_at, ctes, rows) = Self::window_counts_sql(window, now, with_mem);
        let inner = format!("WITH {ctes} SELECT x.* FROM ({rows}) x");
        use crate::wide::Col::Plain;
        let columns = [
            &[Plain("gpu_id"), Plain("o_from")][..],
            &WINDOW_COLUMNS[10..],
        ]
        .concat();
        let sql = self.wide_sql(&inner, &columns, "");
        self.fetch_window_wide(&sql, binds_at, Vec::new()).await
    }

    /// The GPUs `filters` select with each owner period overlapping the clock hours `[lo, hi)`
    /// and their attributes, each with its counts over `[today, hi)` (none where `hi` is not
    /// past `today`): today's day row less the hours ahead of the clock, a day a change of
    /// owner splits from its hours, the day's peak memory as [`edge_day_mem`] reads it.
    async fn window_today(
        &self,
        lo: i64,
        hi: i64,
        today: i64,
        filters: &Filters,
        with_mem: bool,
    ) -> Result<Arc<Vec<WindowRow>>> {
        if !(self.keeps_live() && hi > today) {
            let rows = self
                .window_today_of(lo, hi, today, filters, with_mem, None)
                .await?;
            return Ok(Arc::new(WindowRow::in_order(rows)));
        }
        // Kept between requests (`crate::live`), one answer for every window ending in this
        // hour and every filter: every owner period up to now of every GPU (those before the
        // window's start and those the filters leave out taken out below), with peak memory
        // whether asked or not. Read again: the GPUs whose day row of
        // today or hours ahead of the clock were written since, those whose owner changed
        // within today (read from their hours) and those whose peak of today lies ahead of
        // the clock (the peak so far is then read from their hours). Today's day rows are
        // read once for both of theirs.
        let changed = format!(
            "WITH d AS MATERIALIZED (SELECT gpu_id, mem_max, {} AS w FROM gpu_days \
               WHERE day = $2) \
             SELECT string_agg(CAST(gpu_id AS TEXT), ',') FROM (\
             SELECT gpu_id FROM d WHERE w \
             UNION SELECT h.gpu_id FROM gpu_hours h LEFT JOIN d ON d.gpu_id = h.gpu_id \
               WHERE h.hour >= $3 AND h.hour < $2 + 86400 AND ({} OR h.mem_max >= d.mem_max) \
             UNION SELECT gpu_id FROM gpu_owners WHERE from_ts > $2 AND from_ts < $2 + 86400) f",
            live::written_since("gpu_days"),
            live::written_since("h"),
        );
        let all_gpus = &Filters::default();
        let all = self
            .live_rows(
                &self.live.today,
                format!(
                    "today's window rows threshold {} until {hi} today {today}",
                    self.settings.idle_threshold_pct
                ),
                &changed,
                &[today, hi],
                |a: &WindowRow, b: &WindowRow| (&a.uuid, a.o_from).cmp(&(&b.uuid, b.o_from)),
                |only| async move {
                    self.window_today_of(0, hi, today, all_gpus, true, only.as_deref())
                        .await
                },
            )
            .await?;
        let wanted =
            |r: &WindowRow| r.o_to.is_none_or(|to| to > lo) && filters.admits(r.filter_values());
        if all.iter().all(wanted) {
            return Ok(all);
        }
        Ok(Arc::new(
            all.iter().filter(|r| wanted(r)).cloned().collect(),
        ))
    }

    /// [`Store::window_today`] read from the database (on either backend), of the GPUs `only`
    /// alone where given (PostgreSQL only: they are written in place as an array).
    async fn window_today_of(
        &self,
        lo: i64,
        hi: i64,
        today: i64,
        filters: &Filters,
        with_mem: bool,
        only: Option<&[i64]>,
    ) -> Result<Vec<WindowRow>> {
        let (clause, binds) = filters.clause_with(8, "o");
        let array = only.map(live::id_array);
        let (outside, inside, only_owned) = match &array {
            Some(a) => (
                format!("h.hour >= $6 AND h.hour < $5 + 86400 AND h.gpu_id = ANY({a})"),
                format!("h.hour >= $5 AND h.hour < $6 AND h.gpu_id = ANY({a})"),
                format!(" AND o.gpu_id = ANY({a})"),
            ),
            None => (
                "h.hour >= $6 AND h.hour < $5 + 86400".to_string(),
                "h.hour >= $5 AND h.hour < $6".to_string(),
                String::new(),
            ),
        };
        let (outside, inside) = (outside.as_str(), inside.as_str());
        // A window that ends before today reads no row of today (the binds stay referenced).
        let live = hi > today;
        let (net, split) = net_day_parts_of(true, "$5", outside, inside, array.as_deref());
        let split = split.unwrap_or_default();
        let none = if live { "" } else { " WHERE 1 = 0" };
        let (peaks, mem, peak_join) = if with_mem && live {
            (
                format!(
                    ", e2 AS MATERIALIZED ({})",
                    edge_day_mem_of("$5", outside, inside, array.as_deref())
                ),
                "CASE WHEN x.gpu_id IS NULL THEN NULL ELSE COALESCE(x.mem, e2.m) END",
                " LEFT JOIN e2 ON e2.gpu_id = o.gpu_id",
            )
        } else {
            (String::new(), "x.mem", "")
        };
        let counts = format!(
            "x.present, x.known, x.idle, x.alloc, x.alloc_idle, x.act, {mem} AS mem, \
             x.b_hours, x.b_usd"
        );
        // The net rows are one per GPU already; only the hours of split days are summed.
        let join = format!(
            " LEFT JOIN (SELECT gpu_id, o_from, present, known, idle, alloc, alloc_idle, act, \
               mem, b_hours, b_usd FROM ({net}) n{none} \
             UNION ALL SELECT gpu_id, o_from, {WINDOW_SUMS} FROM ({split}) u{none} \
             GROUP BY gpu_id, o_from) x ON x.gpu_id = o.gpu_id AND x.o_from = o.from_ts\
             {peak_join}"
        );
        let inner = format!(
            "WITH {SPLIT_DAYS}{peaks} \
             SELECT g.id AS gpu_id, o.from_ts AS o_from, g.uuid, g.host, g.memory_mib, o.team, \
             o.env, g.cloud, g.cluster, g.model, g.vendor, g.usd_per_hour, {counts}, \
             o.to_ts AS o_to \
             FROM gpu_owners o JOIN gpus g ON g.id = o.gpu_id{join} \
             WHERE o.from_ts < {hi} AND o.to_ts > {lo} AND g.mig_parent_uuid IS NULL \
             AND $1 <= $2 AND $3 <= $4{only_owned}{clause}"
        );
        let columns = [window_columns(), vec![crate::wide::Col::Plain("o_to")]].concat();
        let sql = self.wide_sql(&inner, &columns, "");
        let t = today.min(hi);
        self.fetch_window_wide(&sql, [t, t, t, t, t, hi.max(t)], binds)
            .await
    }

    /// [`Store::gpu_windows`] read the plain way, every row joined to the owner period it fell
    /// in: the same figures by the definition itself, for tests of the fast path.
    pub async fn gpu_windows_joined(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuWindow>> {
        let (binds_at, union) = window_rows(window, now);
        let rows = format!(
            "SELECT gpu_id, o_from, {WINDOW_SUMS} FROM ({union}) u GROUP BY gpu_id, o_from"
        );
        self.gpu_windows_from(SPLIT_DAYS, &rows, binds_at, filters)
            .await
    }

    /// Per-GPU window counts from `rows` (one row per GPU and owner period: `gpu_id`,
    /// `o_from` and [`WINDOW_SUMS`]) after the CTEs `ctes`, with each GPU's attributes and
    /// the period's owner, filtered.
    async fn gpu_windows_from(
        &self,
        ctes: &str,
        rows: &str,
        binds_at: [i64; 6],
        filters: &Filters,
    ) -> Result<Vec<GpuWindow>> {
        let (clause, binds) = filters.clause_with(8, "o");
        let inner = format!(
            "WITH {ctes} \
             SELECT x.gpu_id, o.from_ts AS o_from, g.uuid, g.host, g.memory_mib, o.team, o.env, \
             g.cloud, g.cluster, g.model, g.vendor, g.usd_per_hour, x.present, x.known, x.idle, \
             x.alloc, x.alloc_idle, x.act, x.mem, x.b_hours, x.b_usd \
             FROM ({rows}) x JOIN gpus g ON g.id = x.gpu_id \
             JOIN gpu_owners o ON o.gpu_id = x.gpu_id AND o.from_ts = x.o_from \
             WHERE g.mig_parent_uuid IS NULL{clause}"
        );
        let sql = self.wide_sql(&inner, &window_columns(), "");
        let rows = self.fetch_window_wide(&sql, binds_at, binds).await?;
        Ok(WindowRow::in_order(rows)
            .into_iter()
            .map(|r| r.window(None))
            .collect())
    }

    /// [`Store::fetch_window_rows`] of a [`Store::wide_sql`] query: its rows, deserialized.
    pub(crate) async fn fetch_window_wide<T: serde::de::DeserializeOwned>(
        &self,
        sql: &str,
        bounds: [i64; 6],
        filters: Vec<String>,
    ) -> Result<Vec<T>> {
        let rows = self.fetch_window_rows(sql, bounds, filters).await?;
        let json = match rows.first() {
            Some(r) => r.try_get::<Option<String>, _>(0)?,
            None => None,
        };
        Self::wide_rows(json)
    }

    /// Run a query over [`window_rows`]: its six bounds, the idle threshold, then the filters'
    /// values.
    pub(crate) async fn fetch_window_rows(
        &self,
        sql: &str,
        bounds: [i64; 6],
        filters: Vec<String>,
    ) -> Result<Vec<AnyRow>> {
        let sql = self.sql(sql);
        let mut q = sqlx::query(&sql).persistent(false);
        for b in bounds {
            q = q.bind(b);
        }
        q = q.bind(self.settings.idle_threshold_pct);
        for b in filters {
            q = q.bind(b);
        }
        Ok(q.fetch_all(self.pool()).await?)
    }

    /// [`Store::gpu_windows`] without peak memory (`mem_max_mib` is None), owner periods
    /// apart: what the summary reads ([`Store::summary_of`]), and with owner periods folded
    /// ([`gpuledger_ledger::summary::per_gpu`]) what [`Store::gpu_totals`] gives.
    pub async fn gpu_windows_without_peak(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuWindow>> {
        self.gpu_windows_of(window, filters, now, false).await
    }

    /// One row per physical GPU over the window (owner periods folded; team and environment are
    /// the latest period's), for per-GPU tables, without peak memory (`mem_max_mib` is None):
    /// no table shows it, and without it the window's edge days are read the cheaper way
    /// ([`running_window_rows`]).
    pub async fn gpu_totals(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuWindow>> {
        Ok(gpuledger_ledger::summary::per_gpu(
            self.gpu_windows_of(window, filters, now, false).await?,
        ))
    }

    /// [`Store::gpu_totals`] with each GPU's peak memory over the window: what the low-memory
    /// finding (`ledger::waste`) reads.
    pub async fn gpu_totals_with_peak(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<GpuWindow>> {
        Ok(gpuledger_ledger::summary::per_gpu(
            self.gpu_windows(window, filters, now).await?,
        ))
    }

    /// `GET /api/v1/summary`: groups and total over the window, by BRIEF section 4.
    pub async fn summary(
        &self,
        window: Window,
        filters: &Filters,
        group_by: GroupBy,
        now: DateTime<Utc>,
    ) -> Result<Summary> {
        // No figure of the summary needs peak memory.
        let windows = self.gpu_windows_without_peak(window, filters, now).await?;
        Ok(self.summary_of(&windows, window, group_by, now))
    }

    /// [`Store::summary`] of per-GPU windows already read for `window` and the same filters
    /// ([`Store::gpu_windows_without_peak`]): for a page that shows the summary and the
    /// per-GPU figures of one read.
    pub fn summary_of(
        &self,
        windows: &[GpuWindow],
        window: Window,
        group_by: GroupBy,
        now: DateTime<Utc>,
    ) -> Summary {
        let (groups, total) = summarize(windows, group_by);
        Summary {
            from: ts(window.from),
            to: ts(window.to.min(now.timestamp())),
            group_by: group_by.as_str().to_string(),
            idle_threshold_pct: self.settings.idle_threshold_pct,
            groups,
            total,
        }
    }

    /// Every source with its freshness against the objective.
    pub async fn sources(&self, now: DateTime<Utc>) -> Result<Vec<SourceView>> {
        let rows = sqlx::query(
            "SELECT s.name, s.kind, s.last_success, s.last_error, s.last_error_at, \
             (SELECT COUNT(*) FROM gpus g WHERE g.source = s.name AND g.mig_parent_uuid IS NULL) AS gpus \
             FROM sources s ORDER BY s.name",
        )
        .fetch_all(self.pool())
        .await?;
        let now = now.timestamp();
        rows.iter()
            .map(|r| {
                let last_success: Option<i64> = r.try_get("last_success")?;
                let last_error_at: Option<i64> = r.try_get("last_error_at")?;
                let lag = last_success.map(|s| (now - s).max(0));
                let status = match (last_success, last_error_at) {
                    (None, _) => SourceStatus::Never,
                    (Some(s), Some(e)) if e > s => SourceStatus::Error,
                    (Some(_), _) if lag.unwrap_or(0) > self.settings.freshness_objective_secs => {
                        SourceStatus::Stale
                    }
                    _ => SourceStatus::Ok,
                };
                Ok(SourceView {
                    name: r.try_get("name")?,
                    kind: r.try_get("kind")?,
                    last_success: last_success.map(ts),
                    lag_secs: lag,
                    status,
                    last_error: r.try_get("last_error")?,
                    last_error_at: last_error_at.map(ts),
                    gpus: r.try_get("gpus")?,
                })
            })
            .collect()
    }

    /// What each cloud collector found per account, project or subscription: the physical
    /// GPUs and hosts it reported there (wherever they were merged to) and when it last did.
    pub async fn cloud_accounts(&self) -> Result<Vec<CloudAccount>> {
        let rows: Vec<(String, String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT a.source, s.kind, a.value, CAST(COUNT(*) AS BIGINT), \
             CAST(COUNT(DISTINCT g.host) AS BIGINT), MAX(a.observed_at) \
             FROM gpu_attrs a JOIN gpus g ON g.id = a.gpu_id JOIN sources s ON s.name = a.source \
             WHERE a.attribute = 'account' AND g.mig_parent_uuid IS NULL \
             AND s.kind IN ('aws', 'gcp', 'azure') \
             GROUP BY a.source, s.kind, a.value ORDER BY a.source, a.value",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(source, kind, account, gpus, hosts, last)| CloudAccount {
                source,
                kind,
                account,
                gpus,
                hosts,
                last_seen: ts(last),
            })
            .collect())
    }

    /// Distinct values of a GPU attribute, for filter pickers.
    pub async fn distinct(&self, column: &str) -> Result<Vec<String>> {
        if !GroupBy::NAMES.contains(&column) {
            return Err(StoreError::Invalid(format!(
                "cannot list values of `{column}`"
            )));
        }
        let sql = format!(
            "SELECT DISTINCT {column} FROM gpus WHERE {column} IS NOT NULL ORDER BY {column}"
        );
        Ok(sqlx::query_scalar(&sql).fetch_all(self.pool()).await?)
    }
}

/// A GPU's id and rate, read wide (`crate::wide`).
#[derive(serde::Deserialize)]
struct RateRow(
    i64,
    #[serde(deserialize_with = "crate::wide::opt_real")] Option<f64>,
);

/// A GPU's held hours by a team (`gpu_id, team, hours`), read wide (`crate::wide`).
#[derive(serde::Deserialize)]
struct HeldRow(
    i64,
    String,
    #[serde(deserialize_with = "crate::wide::real")] f64,
);

/// One GPU and owner period's counts over a window ([`Store::gpu_windows`] before today),
/// read wide: `gpu_id`, `o_from`, then [`WINDOW_SUMS`]' columns.
#[derive(serde::Deserialize)]
struct CountsRow {
    gpu_id: i64,
    o_from: i64,
    present: i64,
    known: i64,
    idle: i64,
    alloc: i64,
    alloc_idle: i64,
    #[serde(deserialize_with = "crate::wide::real")]
    act: f64,
    #[serde(deserialize_with = "crate::wide::opt_real")]
    mem: Option<f64>,
    b_hours: i64,
    #[serde(deserialize_with = "crate::wide::real")]
    b_usd: f64,
}

/// A GPU's attributes and owner, then its counts: the columns of [`WindowRow`] after its GPU
/// and owner period, the last nine (from `present`) being [`WINDOW_SUMS`]' columns.
const WINDOW_COLUMNS: [crate::wide::Col; 19] = {
    use crate::wide::Col::{Plain, Real};
    [
        Plain("uuid"),
        Plain("host"),
        Plain("memory_mib"),
        Plain("team"),
        Plain("env"),
        Plain("cloud"),
        Plain("cluster"),
        Plain("model"),
        Plain("vendor"),
        Real("usd_per_hour"),
        Plain("present"),
        Plain("known"),
        Plain("idle"),
        Plain("alloc"),
        Plain("alloc_idle"),
        Real("act"),
        Real("mem"),
        Plain("b_hours"),
        Real("b_usd"),
    ]
};

/// The columns of [`WindowRow`].
fn window_columns() -> Vec<crate::wide::Col<'static>> {
    let ids = [
        crate::wide::Col::Plain("gpu_id"),
        crate::wide::Col::Plain("o_from"),
    ];
    [&ids[..], &WINDOW_COLUMNS].concat()
}

/// A GPU and owner period with its attributes and counts, read wide ([`Store::gpu_windows`]):
/// over the whole window, or over today where the days before are kept (none where it has no
/// row today).
#[derive(Clone, serde::Deserialize)]
struct WindowRow {
    gpu_id: i64,
    o_from: i64,
    uuid: Arc<str>,
    host: Option<Arc<str>>,
    memory_mib: Option<i64>,
    team: Arc<str>,
    env: Arc<str>,
    cloud: Option<Arc<str>>,
    cluster: Option<Arc<str>>,
    model: Arc<str>,
    vendor: Option<Arc<str>>,
    #[serde(deserialize_with = "crate::wide::opt_real")]
    usd_per_hour: Option<f64>,
    present: Option<i64>,
    known: Option<i64>,
    idle: Option<i64>,
    alloc: Option<i64>,
    alloc_idle: Option<i64>,
    #[serde(deserialize_with = "crate::wide::opt_real")]
    act: Option<f64>,
    #[serde(deserialize_with = "crate::wide::opt_real")]
    mem: Option<f64>,
    b_hours: Option<i64>,
    #[serde(deserialize_with = "crate::wide::opt_real")]
    b_usd: Option<f64>,
    /// The owner period's end, where read (the rows of today kept for every window).
    #[serde(default)]
    o_to: Option<i64>,
}

/// A GPU of a list with its id, as the list is kept (`crate::live`).
#[derive(Clone)]
pub(crate) struct ListedGpu {
    pub(crate) id: i64,
    view: GpuView,
    /// The stored `vendor` column, as the SQL filters read it (the view's is told from the
    /// UUID and the labels a brief list leaves unread).
    vendor: Option<String>,
}

impl ListedGpu {
    /// The GPU's values of the filter keys ([`Filters::admits`]), as the GPU list's SQL
    /// clause reads them: the `gpus` row's own columns, its current owner's team and
    /// environment.
    pub(crate) fn filter_values(&self) -> [Option<&str>; 6] {
        let v = &self.view;
        let (cloud, cluster) = (v.cloud.as_deref(), v.cluster.as_deref());
        [
            Some(&v.team),
            Some(&v.env),
            cloud,
            cluster,
            Some(&v.model),
            self.vendor.as_deref(),
        ]
    }
}

impl LiveRow for ListedGpu {
    fn gpu_id(&self) -> i64 {
        self.id
    }
}

impl LiveRow for WindowRow {
    fn gpu_id(&self) -> i64 {
        self.gpu_id
    }
}

impl WindowRow {
    /// The row's values of the filter keys ([`Filters::admits`]): its owner period's team
    /// and environment, the GPU's other attributes; `None` where the column is NULL.
    fn filter_values(&self) -> [Option<&str>; 6] {
        let (cloud, cluster) = (self.cloud.as_deref(), self.cluster.as_deref());
        let vendor = self.vendor.as_deref();
        [
            Some(&self.team),
            Some(&self.env),
            cloud,
            cluster,
            Some(&self.model),
            vendor,
        ]
    }

    /// `rows` by GPU (UUID) and owner period in time order, as the readers fold them: sorted
    /// here, where it costs next to nothing, rather than by the database, where sorting the
    /// wide rows was a tenth of the read.
    fn in_order(mut rows: Vec<WindowRow>) -> Vec<WindowRow> {
        rows.sort_unstable_by(|a, b| (&a.uuid, a.o_from).cmp(&(&b.uuid, b.o_from)));
        rows
    }

    /// The row as a [`GpuWindow`], its counts added to `kept` (the same GPU and owner period's
    /// counts before today) where given; the peak memory is the higher of the two.
    /// The row's counts of today alone as a [`GpuWindow`] (peak memory only `with_mem`);
    /// `None` where the GPU was not present today.
    fn today(&self, with_mem: bool) -> Option<GpuWindow> {
        if self.present.unwrap_or(0) <= 0 {
            return None;
        }
        let mut t = self.clone().window(None);
        if !with_mem {
            t.mem_max_mib = None;
        }
        Some(t)
    }

    fn window(self, kept: Option<&CountsRow>) -> GpuWindow {
        let int = |own: Option<i64>, kept_of: fn(&CountsRow) -> i64| {
            own.unwrap_or(0) + kept.map(kept_of).unwrap_or(0)
        };
        let real = |own: Option<f64>, kept_of: fn(&CountsRow) -> f64| {
            own.unwrap_or(0.0) + kept.map(kept_of).unwrap_or(0.0)
        };
        let known = int(self.known, |c| c.known);
        let idle = int(self.idle, |c| c.idle);
        GpuWindow {
            uuid: self.uuid,
            host: self.host,
            memory_mib: self.memory_mib.map(|m| m.max(0) as u64),
            mem_max_mib: match (self.mem, kept.and_then(|c| c.mem)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            team: self.team,
            env: self.env,
            cloud: self.cloud,
            cluster: self.cluster,
            model: self.model,
            vendor: self.vendor,
            usd_per_hour: self.usd_per_hour,
            present_hours: int(self.present, |c| c.present),
            busy_hours: known - idle,
            idle_hours: idle,
            allocated_hours: int(self.alloc, |c| c.alloc),
            allocated_idle_hours: int(self.alloc_idle, |c| c.alloc_idle),
            known_hours: known,
            activity_sum: real(self.act, |c| c.act),
            billed_hours: int(self.b_hours, |c| c.b_hours),
            billed_usd: real(self.b_usd, |c| c.b_usd),
        }
    }
}

/// The sums of [`window_rows`]' columns per group, named as the columns.
const WINDOW_SUMS: &str = "CAST(SUM(present) AS BIGINT) AS present, \
     CAST(SUM(known) AS BIGINT) AS known, CAST(SUM(idle) AS BIGINT) AS idle, \
     CAST(SUM(alloc) AS BIGINT) AS alloc, CAST(SUM(alloc_idle) AS BIGINT) AS alloc_idle, \
     CAST(SUM(act) AS DOUBLE PRECISION) AS act, MAX(mem) AS mem, \
     CAST(SUM(b_hours) AS BIGINT) AS b_hours, CAST(SUM(b_usd) AS DOUBLE PRECISION) AS b_usd";

/// Days of a window split by a change of owner (`split`): read from their hours, not their
/// day rollup, so each hour counts under the owner of that hour.
pub(crate) const SPLIT_DAYS: &str = "split AS (\
       SELECT DISTINCT gpu_id, from_ts - (from_ts % 86400) AS day FROM gpu_owners \
       WHERE from_ts % 86400 <> 0)";

/// The rows behind every figure of a window: per physical or MIG GPU, owner period (`o_from`)
/// and UTC day (`t`), the counts of BRIEF section 4 — from day rollups for whole days and hour
/// rollups for the partial days at the window's edges and for days split by a change of owner.
/// The summary sums them per GPU and owner period, the daily trend per day, so the trend's bars
/// add up to the summary's figures. Binds `$1..$6` (returned, in order) and `$7`, the idle
/// threshold; needs the [`SPLIT_DAYS`] CTE.
pub(crate) fn window_rows(window: Window, now: DateTime<Utc>) -> ([i64; 6], String) {
    window_rows_of(window, now, true, None, false)
}

/// [`window_rows`] with the whole days limited to those listed in `group_dirty`: what the group
/// rollups (`crate::groups`) do not answer. The split GPU-days and the edges are all there, as
/// the group rows leave them out. Without `owned`, the rows carry no owner period (`o_from` is
/// 0), for sums that neither group nor filter by owner: a GPU's owner periods cover all its
/// time (owners.rs keeps them contiguous from its first), so no row is lost by not joining
/// them, and reading each row's period is most of the cost of these rows.
pub(crate) fn dirty_window_rows(
    window: Window,
    now: DateTime<Utc>,
    owned: bool,
) -> ([i64; 6], String) {
    window_rows_of(window, now, owned, None, true)
}

/// [`window_rows`] of only the GPUs in the CTE `only` (a column `gpu_id`), read GPU by GPU
/// through the rollups' per-GPU indexes: for the few GPUs whose owner changed in the window.
pub(crate) fn window_rows_of_only(
    window: Window,
    now: DateTime<Utc>,
    only: &str,
) -> ([i64; 6], String) {
    window_rows_of(window, now, true, Some(only), false)
}

/// One row per hour of `gpu_hours h` (read `FROM {from}`, where `{range}`), with the columns of
/// [`window_rows`]: its owner period's start when `owned` (else 0), and only GPUs of the CTE
/// `only` when given.
fn hour_rows(owned: bool, only: Option<&str>, from: &str, range: &str) -> String {
    // The hours are read first, by the window's range (or a split day's), then their owner
    // period: CROSS JOIN fixes that order on SQLite (PostgreSQL plans it freely), and
    // `+h.hour` keeps the period from bounding the hours instead (SQLite would then read
    // every hour of the period and filter).
    let (o_from, owner, mut period) = if owned {
        (
            "o.from_ts",
            " CROSS JOIN gpu_owners o",
            " AND o.gpu_id = h.gpu_id AND o.from_ts <= +h.hour AND o.to_ts > +h.hour".to_string(),
        )
    } else {
        ("0", "", String::new())
    };
    let drive = match only {
        Some(only) => {
            period.push_str(&format!(" AND h.gpu_id = {only}.gpu_id"));
            format!("{only} CROSS JOIN ")
        }
        None => String::new(),
    };
    format!(
        "SELECT h.gpu_id, {o_from} AS o_from, (h.hour / 86400) * 86400 AS t, 1 AS present, \
         CASE WHEN h.act_n > 0 THEN 1 ELSE 0 END AS known, \
         CASE WHEN h.act_n > 0 AND h.act_sum < $7 * h.act_n THEN 1 ELSE 0 END AS idle, \
         h.allocated AS alloc, \
         CASE WHEN h.allocated = 1 AND h.act_n > 0 AND h.act_sum < $7 * h.act_n THEN 1 ELSE 0 END \
           AS alloc_idle, \
         CASE WHEN h.act_n > 0 THEN h.act_sum / h.act_n ELSE 0 END AS act, h.mem_max AS mem, \
         CASE WHEN h.billed_usd IS NULL THEN 0 ELSE 1 END AS b_hours, \
         COALESCE(h.billed_usd, 0) AS b_usd \
         FROM {drive}{from}{owner} WHERE {range}{period}"
    )
}

/// The window's two partial edge days, from hour rows (the binds of [`window_rows`]).
fn edge_rows(owned: bool, only: Option<&str>) -> [String; 2] {
    [
        hour_rows(owned, only, "gpu_hours h", "h.hour >= $3 AND h.hour < $4"),
        hour_rows(owned, only, "gpu_hours h", "h.hour >= $5 AND h.hour < $6"),
    ]
}

/// [`window_rows`] without owner periods (see [`dirty_window_rows`]) of the GPUs in the CTE
/// `cover` (one owner period over the whole window, so no whole day of theirs is split): each
/// GPU's whole days as one row, its last day row's running totals less its first's plus the
/// first's own figures (two rows read per GPU however many days), and its edge hours.
///
/// An edge day may instead be read as its day row (taken into the running totals' span) less
/// the hours of that day outside the window, as rows of negated figures: what a day row holds
/// is the sum of its hour rows (both are re-rolled in the same transaction and pruned at the
/// same day), so the difference is exact. That is done where those hours are fewer
/// ([`edges_by_day`]): for the last edge of a window that ends now, the rest of today holds
/// only the hours ahead of the clock, so today costs a day row and a row or two per GPU
/// instead of one row per hour so far. A GPU whose rows all fell outside the window sums to no
/// present hour and is left out, as it was never read before.
///
/// With `with_mem` the whole days' peak memory is read from the index by GPU (`gpu_days_gpu`
/// carries it). A maximum cannot be subtracted: an edge day read by day gives its peak as
/// [`edge_day_mem`] does, in the CTEs returned third (each followed by a comma, to go before
/// `cover`'s). Without, `mem` is NULL and there are none.
pub(crate) fn running_window_rows(
    window: Window,
    now: DateTime<Utc>,
    with_mem: bool,
) -> ([i64; 6], String, String) {
    let binds = window_binds(window, now);
    let [edge1, edge2] = edge_rows(false, None);
    let (first_by_day, last_by_day) = edges_by_day(window, now);
    let lo = if first_by_day { "($1 - 86400)" } else { "$1" };
    let hi = if last_by_day { "($2 + 86400)" } else { "$2" };
    let first_last = |dir: &str| {
        format!(
            "(SELECT d.day FROM gpu_days d WHERE d.gpu_id = c.gpu_id AND d.day >= {lo} \
             AND d.day < {hi} ORDER BY d.day {dir} LIMIT 1)"
        )
    };
    let (first, last) = (first_last("ASC"), first_last("DESC"));
    let run = |own: &str, run: &str| format!("z.{run} - a.{run} + a.{own}");
    let (mut edge_peaks, mut peak_ctes) = (String::new(), String::new());
    let mem = if with_mem {
        let mut peaks = vec!["SELECT MAX(d.mem_max) AS m FROM gpu_days d \
             WHERE d.gpu_id = c.gpu_id AND d.day >= $1 AND d.day < $2"
            .to_string()];
        for (by_day, name, day, outside, inside) in [
            (
                first_by_day,
                "e1",
                "$1 - 86400",
                "h.hour >= $1 - 86400 AND h.hour < $3",
                "h.hour >= $3 AND h.hour < $4",
            ),
            (
                last_by_day,
                "e2",
                "$5",
                "h.hour >= $6 AND h.hour < $5 + 86400",
                "h.hour >= $5 AND h.hour < $6",
            ),
        ] {
            if by_day {
                peak_ctes.push_str(&format!(
                    "{name} AS MATERIALIZED ({}), ",
                    edge_day_mem(day, outside, inside)
                ));
                edge_peaks.push_str(&format!(" LEFT JOIN {name} ON {name}.gpu_id = c.gpu_id"));
                peaks.push(format!("SELECT {name}.m"));
            }
        }
        format!("(SELECT MAX(m) FROM ({}) p)", peaks.join(" UNION ALL "))
    } else {
        "CAST(NULL AS DOUBLE PRECISION)".to_string()
    };
    let mut union = format!(
        "SELECT a.gpu_id, 0 AS o_from, 0 AS t, {} AS present, {} AS known, {} AS idle, \
         {} AS alloc, {} AS alloc_idle, {} AS act, f.mem AS mem, \
         {} AS b_hours, {} AS b_usd \
         FROM (SELECT c.gpu_id, {first} AS lo_day, {last} AS hi_day, {mem} AS mem \
           FROM cover c{edge_peaks}) f \
         JOIN gpu_days a ON a.gpu_id = f.gpu_id AND a.day = f.lo_day \
         JOIN gpu_days z ON z.gpu_id = f.gpu_id AND z.day = f.hi_day",
        run("present_hours", "run_present"),
        run("known_hours", "run_known"),
        run("idle_hours", "run_idle"),
        run("allocated_hours", "run_alloc"),
        run("allocated_idle_hours", "run_alloc_idle"),
        run("act_sum", "run_act"),
        run("billed_hours", "run_b_hours"),
        run("billed_usd", "run_b_usd"),
    );
    for (by_day, outside, edge) in [
        (first_by_day, "h.hour >= $1 - 86400 AND h.hour < $3", edge1),
        (last_by_day, "h.hour >= $6 AND h.hour < $2 + 86400", edge2),
    ] {
        let rows = if by_day {
            negated_hour_rows(outside)
        } else {
            edge
        };
        union.push_str(&format!(" UNION ALL {rows}"));
    }
    (binds, union, peak_ctes)
}

/// Each GPU's peak memory (`gpu_id`, `m`) in the window's part (`{inside}`) of the edge day
/// `day`, read as a day: the day row's peak unless an hour of the day outside the window
/// (`{outside}`) reached it, and only then the hours inside. The outside hours are few (an
/// edge is read by day where they are; the hours ahead of the clock hold no sample) and read
/// for every GPU at once in hour order: grouped by an expression of `gpu_id`, which SQLite
/// cannot take from the index by GPU's order (it would walk that index GPU by GPU and look up
/// each row's peak in the table), and whose `CAST` keeps the integer affinity SQLite needs to
/// index the result for the join. Nearly every GPU costs its day row and a row or two. Read
/// as a `MATERIALIZED` CTE, once: as a table joined to each GPU, PostgreSQL ran it GPU by
/// GPU, each time over every GPU's outside hours.
fn edge_day_mem(day: &str, outside: &str, inside: &str) -> String {
    edge_day_mem_of(day, outside, inside, None)
}

/// [`edge_day_mem`] of the GPUs in the SQL array `only` alone, where given (`outside` and
/// `inside` must restrict the hours themselves).
fn edge_day_mem_of(day: &str, outside: &str, inside: &str, only: Option<&str>) -> String {
    let only = only
        .map(|a| format!(" AND ed.gpu_id = ANY({a})"))
        .unwrap_or_default();
    format!(
        "SELECT ed.gpu_id, CASE WHEN COALESCE(o.m, -1) < ed.mem_max THEN ed.mem_max \
         ELSE (SELECT MAX(h.mem_max) FROM gpu_hours h WHERE h.gpu_id = ed.gpu_id AND {inside}) \
         END AS m FROM gpu_days ed LEFT JOIN (\
           SELECT CAST(h.gpu_id AS BIGINT) AS gpu_id, MAX(h.mem_max) AS m FROM gpu_hours h \
           WHERE {outside} GROUP BY CAST(h.gpu_id AS BIGINT)) o ON o.gpu_id = ed.gpu_id \
         WHERE ed.day = {day}{only}"
    )
}

/// Which edge days of a window to read as their day row less the hours of that day outside
/// the window (see [`running_window_rows`]): an edge longer than half a day, whose outside
/// hours are fewer, and the last edge of a window that ends now, whose outside hours are only
/// those ahead of the clock (a GPU counts as present for the stale window after its last
/// sample). Only windows with whole days between their edges: a window within a day or two is
/// all edges.
fn edges_by_day(window: Window, now: DateTime<Utc>) -> (bool, bool) {
    edges_by_day_of(window_binds(window, now), window.to >= now.timestamp())
}

/// [`edges_by_day`] of a window's binds ([`window_binds`]) and whether it ends now.
pub(crate) fn edges_by_day_of(binds: [i64; 6], ends_now: bool) -> (bool, bool) {
    let [d_lo, d_hi, e1_lo, e1_hi, e2_lo, e2_hi] = binds;
    if d_lo >= d_hi {
        return (false, false);
    }
    let long = |lo: i64, hi: i64| lo < hi && hi - lo > DAY_SECS / 2;
    (
        long(e1_lo, e1_hi),
        e2_lo < e2_hi && (ends_now || long(e2_lo, e2_hi)),
    )
}

/// One row per GPU (physical or MIG) for the edge day `day` of a window: its day row less its
/// hour rows where `{outside}` (the day's hours outside the window), as [`window_rows`]'
/// columns with the bucket `t` = `day` and no peak memory. GPUs left with no present hour
/// are left out: none of their hours was in the window.
///
/// With `owned`, each row carries its owner period: one period covers the whole day of a GPU
/// whose owner did not change within it (periods are contiguous, `crate::owners`), so its
/// day row and hour rows share that period. A GPU-day a change of owner splits (`split`) is
/// read from its hours where `{inside}` (the window's part of the day) instead, each hour
/// under its own period.
fn net_day_rows(owned: bool, day: &str, outside: &str, inside: &str) -> String {
    let (net, split) = net_day_parts(owned, day, outside, inside);
    match split {
        Some(split) => format!("{net} UNION ALL {split}"),
        None => net,
    }
}

/// The two parts of [`net_day_rows`]: one row per GPU whose day no change of owner splits
/// (every GPU, without `owned`), and with `owned` the hour rows of the GPU-days it splits.
///
/// The hours outside the window are summed per GPU on their own and joined to the day rows,
/// rather than taken off them as negated rows in one grouping of both: the hours are few
/// (for today, those ahead of the clock) and the day rows need no grouping at all, which at
/// 10,000 GPUs took a third of the time. The hours are grouped by an expression of `gpu_id`
/// so SQLite reads them by hour, not GPU by GPU through the index by GPU (see
/// [`edge_day_mem`]).
fn net_day_parts(owned: bool, day: &str, outside: &str, inside: &str) -> (String, Option<String>) {
    net_day_parts_of(owned, day, outside, inside, None)
}

/// [`net_day_parts`] of the GPUs in the SQL array `only` alone, where given (the restriction
/// goes into the day rows read; `outside` and `inside` must restrict the hours themselves).
fn net_day_parts_of(
    owned: bool,
    day: &str,
    outside: &str,
    inside: &str,
    only: Option<&str>,
) -> (String, Option<String>) {
    let only = only
        .map(|a| format!(" AND d.gpu_id = ANY({a})"))
        .unwrap_or_default();
    let (o_from, owner, unsplit) = if owned {
        (
            "o.from_ts",
            " JOIN gpu_owners o ON o.gpu_id = d.gpu_id AND o.from_ts <= d.day AND o.to_ts > d.day",
            " AND NOT EXISTS (SELECT 1 FROM split s WHERE s.gpu_id = d.gpu_id AND s.day = d.day)",
        )
    } else {
        ("0", "", "")
    };
    let net = |own: &str, out: &str| format!("d.{own} - COALESCE(a.{out}, 0)");
    let rows = format!(
        "SELECT d.gpu_id, {o_from} AS o_from, {day} AS t, {} AS present, {} AS known, \
         {} AS idle, {} AS alloc, {} AS alloc_idle, {} AS act, \
         CAST(NULL AS DOUBLE PRECISION) AS mem, {} AS b_hours, {} AS b_usd \
         FROM gpu_days d LEFT JOIN ({}) a ON a.gpu_id = d.gpu_id{owner} \
         WHERE d.day = {day}{only}{unsplit} AND d.present_hours - COALESCE(a.present, 0) > 0",
        net("present_hours", "present"),
        net("known_hours", "known"),
        net("idle_hours", "idle"),
        net("allocated_hours", "alloc"),
        net("allocated_idle_hours", "alloc_idle"),
        net("act_sum", "act"),
        net("billed_hours", "b_hours"),
        net("billed_usd", "b_usd"),
        hour_sums_per_gpu(outside),
    );
    let split = owned.then(|| {
        hour_rows(
            true,
            None,
            "split s CROSS JOIN gpu_hours h",
            &format!("s.day = {day} AND h.gpu_id = s.gpu_id AND {inside}"),
        )
    });
    (rows, split)
}

/// The hour rows of `gpu_hours h` where `{range}` summed per GPU (`gpu_id` and the figures of
/// [`window_rows`] but `mem`), read by hour.
fn hour_sums_per_gpu(range: &str) -> String {
    format!(
        "SELECT CAST(h.gpu_id AS BIGINT) AS gpu_id, CAST(COUNT(*) AS BIGINT) AS present, \
         CAST(SUM(CASE WHEN h.act_n > 0 THEN 1 ELSE 0 END) AS BIGINT) AS known, \
         CAST(SUM(CASE WHEN h.act_n > 0 AND h.act_sum < $7 * h.act_n THEN 1 ELSE 0 END) \
           AS BIGINT) AS idle, \
         CAST(SUM(h.allocated) AS BIGINT) AS alloc, \
         CAST(SUM(CASE WHEN h.allocated = 1 AND h.act_n > 0 AND h.act_sum < $7 * h.act_n \
           THEN 1 ELSE 0 END) AS BIGINT) AS alloc_idle, \
         CAST(SUM(CASE WHEN h.act_n > 0 THEN h.act_sum / h.act_n ELSE 0 END) \
           AS DOUBLE PRECISION) AS act, \
         CAST(SUM(CASE WHEN h.billed_usd IS NULL THEN 0 ELSE 1 END) AS BIGINT) AS b_hours, \
         CAST(SUM(COALESCE(h.billed_usd, 0)) AS DOUBLE PRECISION) AS b_usd \
         FROM gpu_hours h WHERE {range} GROUP BY CAST(h.gpu_id AS BIGINT)"
    )
}

/// Every GPU's present hours in a window of binds `$1..$6` ([`window_binds`]), as
/// `(gpu_id, hours)`: whole days from the day rows' running totals (two rows per GPU, however
/// many days), the edges from their hours or, where [`edges_by_day_of`] says so, as their day
/// row less the day's hours outside the window. GPUs with none are left out.
fn running_present_rows(binds: [i64; 6], ends_now: bool) -> String {
    let (first_by_day, last_by_day) = edges_by_day_of(binds, ends_now);
    let lo = if first_by_day { "($1 - 86400)" } else { "$1" };
    let hi = if last_by_day { "($2 + 86400)" } else { "$2" };
    let first_last = |dir: &str| {
        format!(
            "(SELECT d.day FROM gpu_days d WHERE d.gpu_id = g.id AND d.day >= {lo} \
             AND d.day < {hi} ORDER BY d.day {dir} LIMIT 1)"
        )
    };
    let edge = |by_day: bool, outside: &str, inside: &str| {
        if by_day {
            format!("SELECT h.gpu_id, -1 AS n FROM gpu_hours h WHERE {outside}")
        } else {
            format!("SELECT h.gpu_id, 1 AS n FROM gpu_hours h WHERE {inside}")
        }
    };
    // A window with no whole day (and so no edge read by its day row) has no day row to
    // look up: two lookups per GPU that find nothing. (Its first two binds stay referenced.)
    let (days, keep) = if binds[0] < binds[1] {
        let days = format!(
            "SELECT f.gpu_id, z.run_present - a.run_present + a.present_hours AS n \
             FROM (SELECT g.id AS gpu_id, {} AS lo_day, {} AS hi_day FROM gpus g) f \
             JOIN gpu_days a ON a.gpu_id = f.gpu_id AND a.day = f.lo_day \
             JOIN gpu_days z ON z.gpu_id = f.gpu_id AND z.day = f.hi_day UNION ALL ",
            first_last("ASC"),
            first_last("DESC"),
        );
        (days, "")
    } else {
        (String::new(), " WHERE $1 <= $2")
    };
    format!(
        "SELECT gpu_id, CAST(SUM(n) AS BIGINT) AS n FROM (\
           {days}{} UNION ALL {}\
         ) p{keep} GROUP BY gpu_id HAVING SUM(n) > 0",
        edge(
            first_by_day,
            "h.hour >= $1 - 86400 AND h.hour < $3",
            "h.hour >= $3 AND h.hour < $4"
        ),
        edge(
            last_by_day,
            "h.hour >= $6 AND h.hour < $2 + 86400",
            "h.hour >= $5 AND h.hour < $6"
        ),
    )
}

/// The hour rows of `gpu_hours h` where `{range}` with every figure negated and no peak
/// memory (`o_from` 0): the part of an edge day's row outside the window, taken back off it.
fn negated_hour_rows(range: &str) -> String {
    format!(
        "SELECT h.gpu_id, 0 AS o_from, 0, -1, \
         -(CASE WHEN h.act_n > 0 THEN 1 ELSE 0 END), \
         -(CASE WHEN h.act_n > 0 AND h.act_sum < $7 * h.act_n THEN 1 ELSE 0 END), -h.allocated, \
         -(CASE WHEN h.allocated = 1 AND h.act_n > 0 AND h.act_sum < $7 * h.act_n THEN 1 ELSE 0 END), \
         -(CASE WHEN h.act_n > 0 THEN h.act_sum / h.act_n ELSE 0 END), \
         CAST(NULL AS DOUBLE PRECISION), \
         -(CASE WHEN h.billed_usd IS NULL THEN 0 ELSE 1 END), -COALESCE(h.billed_usd, 0) \
         FROM gpu_hours h WHERE {range}"
    )
}

/// The binds `$1..$6` of [`window_rows`]: the window's whole days, then its two edges.
fn window_binds(window: Window, now: DateTime<Utc>) -> [i64; 6] {
    let (lo, hi) = window.hours(now.timestamp());
    let ((d_lo, d_hi), [e1, e2]) = whole_days(lo, hi);
    [d_lo, d_hi, e1.0, e1.1, e2.0, e2.1]
}

/// The shortest last edge of a window that a per-day sum by owner reads as its day row less
/// the hours outside the window (see [`window_rows_of`]).
const OWNED_LAST_EDGE_BY_DAY: i64 = 6 * 3600;

fn window_rows_of(
    window: Window,
    now: DateTime<Utc>,
    owned: bool,
    only: Option<&str>,
    dirty_only: bool,
) -> ([i64; 6], String) {
    let o_from = if owned { "o.from_ts" } else { "0" };
    let drive = only.map_or(String::new(), |o| format!("{o} CROSS JOIN "));
    let [mut edge1, mut edge2] = edge_rows(owned, only);
    // Sums per day over every GPU (the rollups' readers): an edge day may be its day rows
    // less the hours outside the window ([`edges_by_day`]).
    if dirty_only && only.is_none() {
        let (first, mut last) = edges_by_day(window, now);
        if owned {
            // Each row read by owner costs a lookup of its period, and a day row the check
            // for a change of owner that day: the first hours of today are fewer rows read
            // from their hours.
            let [.., e2_lo, e2_hi] = window_binds(window, now);
            last = last && e2_hi - e2_lo >= OWNED_LAST_EDGE_BY_DAY;
        }
        if first {
            edge1 = net_day_rows(
                owned,
                "($1 - 86400)",
                "h.hour >= $1 - 86400 AND h.hour < $3",
                "h.hour >= $3 AND h.hour < $4",
            );
        }
        if last {
            edge2 = net_day_rows(
                owned,
                "$5",
                "h.hour >= $6 AND h.hour < $5 + 86400",
                "h.hour >= $5 AND h.hour < $6",
            );
        }
    }
    let split_hours = hour_rows(
        owned,
        only,
        "split s CROSS JOIN gpu_hours h",
        "s.day >= $1 AND s.day < $2 AND h.gpu_id = s.gpu_id AND h.hour >= s.day \
         AND h.hour < s.day + 86400",
    );
    let day_period = if owned {
        " JOIN gpu_owners o ON o.gpu_id = d.gpu_id AND o.from_ts <= d.day AND o.to_ts > d.day"
    } else {
        ""
    };
    let day_driven = only.map_or(String::new(), |o| format!(" AND d.gpu_id = {o}.gpu_id"));
    let (days, day_range) = if dirty_only {
        (
            "group_dirty x CROSS JOIN gpu_days d",
            "x.day >= $1 AND x.day < $2 AND d.day = x.day",
        )
    } else {
        ("gpu_days d", "d.day >= $1 AND d.day < $2")
    };
    let union = format!(
        "SELECT d.gpu_id, {o_from} AS o_from, d.day AS t, d.present_hours AS present, \
         d.known_hours AS known, d.idle_hours AS idle, d.allocated_hours AS alloc, \
         d.allocated_idle_hours AS alloc_idle, d.act_sum AS act, d.mem_max AS mem, \
         d.billed_hours AS b_hours, d.billed_usd AS b_usd \
         FROM {drive}{days}{day_period} \
         WHERE {day_range}{day_driven} AND NOT EXISTS (\
           SELECT 1 FROM split s WHERE s.gpu_id = d.gpu_id AND s.day = d.day) \
         UNION ALL {split_hours} UNION ALL {edge1} UNION ALL {edge2}"
    );
    (window_binds(window, now), union)
}

/// The workloads holding each present hour (`x`: one row per physical GPU, hour and
/// workload, with the kind and the team the allocation names, `''` when none) and how many
/// there are (`n`), for the window `[$1, $2)`. An allocation on a MIG instance holds its
/// physical GPU; the same workload reported by two sources holds once. `by_end`: find the
/// allocations overlapping the window by when they end ([`Store::allocations_by_end`]).
pub(crate) fn held(by_end: bool) -> &'static str {
    if by_end {
        HELD_BY_END
    } else {
        HELD_BY_START
    }
}

/// [`held`] over the allocated and idle hours only (`$3`: the idle threshold): the holders
/// of those hours and how many there are, for allocated-but-idle hours per workload.
pub(crate) fn held_idle(by_end: bool) -> &'static str {
    if by_end {
        HELD_IDLE_BY_END
    } else {
        HELD_IDLE_BY_START
    }
}

// The allocations overlapping `[$1, $2)`, two ways: GPU by GPU, those started before `$2`
// (`allocations_gpu_start`), few for a window far back and every allocation each GPU had for
// one near now; or by when they end (`allocations_end`, an open one at the end of time), few
// near now and all of them far back. By end, SQLite reads the allocations first (the left
// side of a LEFT JOIN). Either way an allocation on a MIG instance finds its physical GPU in
// `m`, the MIG instances alone (`gpus_parent`), rather than by a read of every GPU's row: at
// 100,000 GPUs on PostgreSQL that read was 100 ms of the 450 of the hours ahead of the
// clock. (No GPU's allocations outlive it, `Store::delete_gpu`.)
macro_rules! mig_parents {
    () => {
        "LEFT JOIN (SELECT c.id, p.id AS parent FROM gpus c JOIN gpus p \
           ON p.uuid = c.mig_parent_uuid WHERE c.mig_parent_uuid IS NOT NULL) m \
           ON m.id = al.gpu_id "
    };
}
/// [`mig_parents`] as a string, for the queries written at run time.
pub(crate) const MIG_PARENTS: &str = mig_parents!();
macro_rules! by_start {
    () => {
        concat!(
            "FROM allocations al JOIN gpus c ON c.id = al.gpu_id ",
            mig_parents!(),
            "WHERE al.start_ts < $2 AND (al.end_ts IS NULL OR al.end_ts > $1)"
        )
    };
}
macro_rules! by_end {
    () => {
        concat!(
            "FROM allocations al ",
            mig_parents!(),
            "WHERE COALESCE(al.end_ts, 9223372036854775807) > $1 AND al.start_ts < $2"
        )
    };
}

// `+h.hour` in the hour joins below: the window (`$1`, `$2`) bounds the scan of a GPU's
// hours, not the allocation's own span, which may be months long. A workload two sources
// report counts once, for the team one of them names (`MAX`: `''`, none, sorts first). `a` is
// materialized: expecting a row or two of hours (those ahead of the clock, which used-by
// leaves out of today's day rows), PostgreSQL joined every open allocation with each hour
// before keeping the hour's GPU, 1.7 s at 100,350 GPUs against 0.2.
macro_rules! held_sql {
    ($from:expr, $gpus:expr, $hours:expr) => {
        concat!(
            "WITH a AS MATERIALIZED (\
               SELECT COALESCE(m.parent, al.gpu_id) AS gpu_id, al.start_ts, al.end_ts, al.workload, al.kind, \
               COALESCE(al.team, '') AS team ",
            $from,
            $gpus,
            "), \
             x AS (\
               SELECT h.gpu_id, h.hour, a.workload, MIN(a.kind) AS kind, MAX(a.team) AS team \
               FROM a JOIN gpu_hours h ON h.gpu_id = a.gpu_id AND +h.hour > a.start_ts - 3600 \
               AND +h.hour < COALESCE(a.end_ts, $2) AND h.hour >= $1 AND h.hour < $2",
            $hours,
            " GROUP BY h.gpu_id, h.hour, a.workload), \
             n AS (SELECT gpu_id, hour, COUNT(*) AS n FROM x GROUP BY gpu_id, hour)"
        )
    };
}
const HELD_BY_START: &str = held_sql!(by_start!(), "", "");
const HELD_BY_END: &str = held_sql!(by_end!(), "", "");
// The allocations of the physical GPUs `{ids}` alone (PostgreSQL only: an array written in
// place, `live::id_array`): theirs and their MIG instances', found by GPU, for a kept answer
// brought up to date.
macro_rules! of_gpus {
    () => {
        " AND COALESCE(m.parent, al.gpu_id) = ANY({ids}) \
         AND al.gpu_id IN (SELECT i FROM unnest({ids}) i \
           UNION ALL SELECT mc.id FROM gpus mc JOIN gpus mp ON mp.uuid = mc.mig_parent_uuid \
           WHERE mp.id = ANY({ids}))"
    };
}
// [`HELD_BY_START`] of the physical GPUs `{ids}` alone ([`of_gpus`]).
const HELD_OF_GPUS: &str = held_sql!(by_start!(), of_gpus!(), "");
/// Each GPU's held hours per allocating team, after [`held`] or [`HELD_OF_GPUS`].
const HELD_SHARES: &str = " SELECT x.gpu_id, x.team, CAST(SUM(1.0 / n.n) AS DOUBLE PRECISION) \
     FROM x JOIN n ON n.gpu_id = x.gpu_id AND n.hour = x.hour GROUP BY x.gpu_id, x.team";
// Only GPUs with an allocated-and-idle hour on a day of the window (the day rollups say which)
// are walked hour by hour.
macro_rules! idle_gpus {
    () => {
        " AND COALESCE(m.parent, al.gpu_id) IN (SELECT gpu_id FROM gpu_days WHERE day >= $1 - ($1 % 86400) \
         AND day < $2 AND allocated_idle_hours > 0)"
    };
}
const HELD_IDLE_BY_START: &str = held_sql!(
    by_start!(),
    idle_gpus!(),
    " AND h.allocated = 1 AND h.act_n > 0 AND h.act_sum < $3 * h.act_n"
);
// [`HELD_IDLE_BY_START`] of the physical GPUs `{ids}` alone ([`of_gpus`]).
pub(crate) const HELD_IDLE_OF_GPUS: &str = held_sql!(
    by_start!(),
    concat!(idle_gpus!(), of_gpus!()),
    " AND h.allocated = 1 AND h.act_n > 0 AND h.act_sum < $3 * h.act_n"
);
const HELD_IDLE_BY_END: &str = held_sql!(
    by_end!(),
    idle_gpus!(),
    " AND h.allocated = 1 AND h.act_n > 0 AND h.act_sum < $3 * h.act_n"
);

impl Store {
    /// "Used by" in a window: each present hour of the physical GPUs matching `filters`
    /// (filters select owners) split among the workloads that held the GPU or its MIG
    /// instances in that hour, by the team each allocation names (`ledger::usedby::split`);
    /// hours nobody held go to `unallocated`. The rows' costs add up to the GPUs' cost.
    pub async fn used_by_cost(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<UsedBy>> {
        let (lo, hi) = window.hours(now.timestamp());
        let ends_now = window.to >= now.timestamp();
        let today = day_floor(now.timestamp());
        let (rates, present) = self
            .used_by_inputs(lo, hi, filters, Some((ends_now, today)))
            .await?;
        // Whole days from the day rollup; the partial days at the window's edges from the
        // allocations and hours themselves, or as their day rows less the day's shares outside
        // the window ([`edges_by_day_of`]).
        let ((d_lo, d_hi), [e1, e2]) = whole_days(lo, hi);
        let (first, last) = edges_by_day_of([d_lo, d_hi, e1.0, e1.1, e2.0, e2.1], ends_now);
        let day_lo = if first { d_lo - DAY_SECS } else { d_lo };
        let day_hi = if last { d_hi + DAY_SECS } else { d_hi };
        // The days before today are read once while they stay as they are (`crate::settled`);
        // today's rows each time.
        let today = day_floor(now.timestamp()).clamp(day_lo, day_hi);
        let kept = self
            .settled("used-by day shares".to_string(), (day_lo, today), || {
                self.held_day_shares(day_lo, today)
            })
            .await?;
        let mut shares: Vec<HeldShare> = kept.as_ref().clone();
        if today < day_hi {
            if self.keeps_live() && day_hi - today == DAY_SECS {
                shares.extend(self.held_day_shares_kept(today).await?.iter().cloned());
            } else {
                shares.extend(self.held_day_shares(today, day_hi).await?);
            }
        }
        let mut outside = Vec::new();
        for (ahead, by_day, (e_lo, e_hi), (o_lo, o_hi)) in [
            (false, first, e1, (day_lo, e1.0)),
            (ends_now, last, e2, (e2.1, day_hi)),
        ] {
            if by_day && ahead {
                // The hours ahead of the clock: the same for every window ending now.
                outside.extend(
                    self.held_shares_kept(o_lo, o_hi, now)
                        .await?
                        .iter()
                        .cloned(),
                );
            } else if by_day {
                outside.extend(self.held_shares(o_lo, o_hi, now).await?);
            } else if e_lo < e_hi {
                shares.extend(self.held_shares(e_lo, e_hi, now).await?);
            }
        }
        if !outside.is_empty() {
            shares = less_outside(
                shares,
                outside,
                |s| (s.gpu_id, s.team.clone()),
                |s| &mut s.gpu_hours,
            );
        }
        Ok(split(&rates, &shares, &present))
    }

    /// [`Store::held_day_shares`] of day `day`, kept between requests on PostgreSQL
    /// (`crate::live`): at 100,000 GPUs today's used-by day rows are tens of thousands, 0.065 s
    /// at each request of used-by and the Teams page. Read again: the GPUs whose used-by rows
    /// or day row of that day were written since (a re-roll deletes a GPU-day's rows and
    /// writes them anew), and those with an allocation (on them or their MIG instances)
    /// written since; a removed allocation or row reads the whole answer again (migrations 22
    /// and 23).
    async fn held_day_shares_kept(&self, day: i64) -> Result<Arc<Vec<HeldShare>>> {
        let changed = day_table_changed("gpu_day_use");
        self.live_rows(
            &self.live.held_today,
            format!("used-by day rows of {day}"),
            &changed,
            &[day],
            |a: &HeldShare, b: &HeldShare| (a.gpu_id, &a.team).cmp(&(b.gpu_id, &b.team)),
            |only| async move {
                self.held_day_shares_of(day, day + DAY_SECS, only.as_deref())
                    .await
            },
        )
        .await
    }

    /// Each physical GPU's held hours per allocating team over the days `[lo, hi)`, from the
    /// used-by day rows.
    async fn held_day_shares(&self, lo: i64, hi: i64) -> Result<Vec<HeldShare>> {
        self.held_day_shares_of(lo, hi, None).await
    }

    /// [`Store::held_day_shares`], of the GPUs `only` alone where given (PostgreSQL only: they
    /// are written in place as an array).
    async fn held_day_shares_of(
        &self,
        lo: i64,
        hi: i64,
        only: Option<&[i64]>,
    ) -> Result<Vec<HeldShare>> {
        if lo >= hi {
            return Ok(Vec::new());
        }
        let only = only
            .map(|ids| format!(" AND gpu_id = ANY({})", live::id_array(ids)))
            .unwrap_or_default();
        let sql = self.wide_sql(
            &format!(
                "SELECT gpu_id, team, CAST(SUM(held_hours) AS DOUBLE PRECISION) AS hours \
                 FROM gpu_day_use WHERE day >= $1 AND day < $2{only} GROUP BY gpu_id, team"
            ),
            &[
                crate::wide::Col::Plain("gpu_id"),
                crate::wide::Col::Plain("team"),
                crate::wide::Col::Real("hours"),
            ],
            "",
        );
        let rows: Vec<HeldRow> = Self::wide_rows(
            sqlx::query_scalar(&self.sql(&sql))
                .bind(lo)
                .bind(hi)
                .fetch_one(self.pool())
                .await?,
        )?;
        Ok(rows
            .into_iter()
            .map(|r| held_share((r.0, r.1, r.2)))
            .collect())
    }

    /// The rates of the physical GPUs matching `filters` and every GPU's present hours in
    /// `[lo, hi)`. The whole fleet's rates, with `ends_now`, are those of its kept list on
    /// PostgreSQL (`Store::kept_list`). With `ends_now` (whether the window ends now, and today), whole days from
    /// the day rows' running totals (two rows per GPU) and the edges as
    /// [`running_window_rows`] reads them, the part before today kept while its days stay as
    /// they are (`crate::settled`) and today's part read each time ([`Store::present_today`]);
    /// without, the plain way, one day row per GPU and day and the edges' hours: the reference
    /// the property tests hold the fast way to.
    async fn used_by_inputs(
        &self,
        lo: i64,
        hi: i64,
        filters: &Filters,
        ends_now: Option<(bool, i64)>,
    ) -> Result<(HashMap<i64, Option<f64>>, Vec<(i64, i64)>)> {
        let rates = if ends_now.is_some() && self.keeps_live() && filters.is_empty() {
            // The whole fleet's rates are those of its kept list of physical GPUs.
            self.kept_list(false, true, Utc::now())
                .await?
                .iter()
                .map(|r| (r.id, r.view.usd_per_hour))
                .collect()
        } else {
            self.rates_of(filters).await?
        };
        let present = match ends_now {
            Some((_, today)) if lo < today && today < hi => {
                let kept = self
                    .settled(
                        format!("present hours {lo}..{today}"),
                        (day_floor(lo), today),
                        || self.present_rows(lo, today, Some(false)),
                    )
                    .await?;
                let mut by_gpu: BTreeMap<i64, i64> = kept.iter().copied().collect();
                for (gpu, n) in self.present_today(today, hi).await? {
                    *by_gpu.entry(gpu).or_default() += n;
                }
                by_gpu.into_iter().collect()
            }
            _ => self.present_rows(lo, hi, ends_now.map(|(e, _)| e)).await?,
        };
        Ok((rates, present))
    }

    /// The rates of the physical GPUs matching `filters`, by GPU id.
    async fn rates_of(&self, filters: &Filters) -> Result<HashMap<i64, Option<f64>>> {
        let (clause, binds) = filters.clause(1);
        use crate::wide::Col::{Plain, Real};
        let sql = self.wide_sql(
            &format!(
                "SELECT g.id AS id, g.usd_per_hour AS rate FROM gpus g \
                 WHERE g.mig_parent_uuid IS NULL{clause}"
            ),
            &[Plain("id"), Real("rate")],
            "",
        );
        let sql = self.sql(&sql);
        let mut q = sqlx::query_scalar(&sql).persistent(false);
        for b in binds {
            q = q.bind(b);
        }
        Ok(Self::wide_rows::<RateRow>(q.fetch_one(self.pool()).await?)?
            .into_iter()
            .map(|r| (r.0, r.1))
            .collect())
    }

    /// Every GPU's present hours in `[lo, hi)` as [`Store::used_by_inputs`] reads them, at
    /// once.
    async fn present_rows(
        &self,
        lo: i64,
        hi: i64,
        ends_now: Option<bool>,
    ) -> Result<Vec<(i64, i64)>> {
        use crate::wide::Col::Plain;
        let ((d_lo, d_hi), [e1, e2]) = whole_days(lo, hi);
        let binds = [d_lo, d_hi, e1.0, e1.1, e2.0, e2.1];
        let sql = match ends_now {
            Some(ends_now) => running_present_rows(binds, ends_now),
            None => "SELECT gpu_id, CAST(SUM(n) AS BIGINT) AS n FROM (\
               SELECT gpu_id, present_hours AS n FROM gpu_days WHERE day >= $1 AND day < $2 \
               UNION ALL SELECT gpu_id, 1 FROM gpu_hours WHERE hour >= $3 AND hour < $4 \
               UNION ALL SELECT gpu_id, 1 FROM gpu_hours WHERE hour >= $5 AND hour < $6\
             ) p GROUP BY gpu_id"
                .to_string(),
        };
        let sql = self.wide_sql(&sql, &[Plain("gpu_id"), Plain("n")], "");
        let sql = self.sql(&sql);
        let mut q = sqlx::query_scalar(&sql).persistent(false);
        for b in binds {
            q = q.bind(b);
        }
        Self::wide_rows(q.fetch_one(self.pool()).await?)
    }

    /// Every GPU's present hours from midnight `today` to the clock hour `hi` (at most a day
    /// later): today's day row less its hours from `hi` on (those ahead of the clock), one row
    /// per GPU, rather than every hour of the day so far. GPUs with none are left out.
    ///
    /// On PostgreSQL, from today's per-GPU rows the pages keep (`crate::live`), physical GPUs
    /// alone (the only ones used-by prices): each owner period's present hours of today, the
    /// same day row less the same hours, summed per GPU.
    async fn present_today(&self, today: i64, hi: i64) -> Result<Vec<(i64, i64)>> {
        if self.keeps_live() && hi > today {
            let rows = self
                .window_today(0, hi, today, &Filters::default(), false)
                .await?;
            let mut by_gpu: BTreeMap<i64, i64> = BTreeMap::new();
            for r in rows.iter() {
                if let Some(n) = r.present.filter(|n| *n > 0) {
                    *by_gpu.entry(r.gpu_id).or_default() += n;
                }
            }
            return Ok(by_gpu.into_iter().collect());
        }
        use crate::wide::Col::Plain;
        let sql = self.wide_sql(
            "SELECT d.gpu_id, d.present_hours - COALESCE(a.n, 0) AS n FROM gpu_days d \
             LEFT JOIN (SELECT CAST(h.gpu_id AS BIGINT) AS gpu_id, COUNT(*) AS n \
               FROM gpu_hours h WHERE h.hour >= $2 AND h.hour < $1 + 86400 \
               GROUP BY CAST(h.gpu_id AS BIGINT)) a ON a.gpu_id = d.gpu_id \
             WHERE d.day = $1 AND d.present_hours - COALESCE(a.n, 0) > 0",
            &[Plain("gpu_id"), Plain("n")],
            "",
        );
        let sql = self.sql(&sql);
        Self::wide_rows(
            sqlx::query_scalar(&sql)
                .persistent(false)
                .bind(today)
                .bind(hi)
                .fetch_one(self.pool())
                .await?,
        )
    }

    /// [`Store::used_by_cost`] computed from the allocations for the whole window, never from
    /// the day rollup: the reference the rollup is tested against.
    #[doc(hidden)]
    pub async fn used_by_cost_unrolled(
        &self,
        window: Window,
        filters: &Filters,
        now: DateTime<Utc>,
    ) -> Result<Vec<UsedBy>> {
        let (lo, hi) = window.hours(now.timestamp());
        let (rates, present) = self.used_by_inputs(lo, hi, filters, None).await?;
        let shares = self.held_shares(lo, hi, now).await?;
        Ok(split(&rates, &shares, &present))
    }

    /// Each physical GPU's held hours per allocating team in `[lo, hi)`, from the allocations
    /// and present hours ([`held`]): the slow path, for the partial days at a window's edges.
    pub(crate) async fn held_shares(
        &self,
        lo: i64,
        hi: i64,
        now: DateTime<Utc>,
    ) -> Result<Vec<HeldShare>> {
        let by_end = self.allocations_by_end(lo, hi, now).await?;
        self.held_shares_with(lo, hi, by_end).await
    }

    /// [`Store::held_shares`] with the allocations found by end or by start ([`held`]).
    async fn held_shares_with(&self, lo: i64, hi: i64, by_end: bool) -> Result<Vec<HeldShare>> {
        let held = held(by_end);
        let rows: Vec<(i64, String, f64)> =
            sqlx::query_as(&self.sql(&format!("{held}{HELD_SHARES}")))
                .bind(lo)
                .bind(hi)
                .fetch_all(self.pool())
                .await?;
        Ok(rows.into_iter().map(held_share).collect())
    }

    /// [`Store::held_shares`] of `[lo, hi)` kept between requests on PostgreSQL
    /// (`crate::live`), for the hours ahead of the clock that used-by takes out of today's day
    /// rows: at 100,000 GPUs a read of every open allocation and its hours there, a fifth of a
    /// second at each request. Read again: the GPUs whose hours in `[lo, hi)` were written
    /// since, and those with an allocation (on them or their MIG instances) written since;
    /// a removed allocation reads the whole answer again (migration 23).
    async fn held_shares_kept(
        &self,
        lo: i64,
        hi: i64,
        now: DateTime<Utc>,
    ) -> Result<Arc<Vec<HeldShare>>> {
        if !self.keeps_live() {
            return Ok(Arc::new(self.held_shares(lo, hi, now).await?));
        }
        let changed = format!(
            "SELECT string_agg(CAST(gpu_id AS TEXT), ',') FROM (\
             SELECT h.gpu_id FROM gpu_hours h WHERE h.hour >= $2 AND h.hour < $3 AND {} \
             UNION SELECT COALESCE(m.parent, al.gpu_id) AS gpu_id FROM allocations al {}\
             WHERE {}) f",
            live::written_since("h"),
            MIG_PARENTS,
            live::written_since("al"),
        );
        self.live_rows(
            &self.live.ahead,
            format!("used-by shares of hours {lo}..{hi}"),
            &changed,
            &[lo, hi],
            |a: &HeldShare, b: &HeldShare| (a.gpu_id, &a.team).cmp(&(b.gpu_id, &b.team)),
            |only| async move {
                match only {
                    None => self.held_shares(lo, hi, now).await,
                    Some(ids) => {
                        let held = HELD_OF_GPUS.replace("{ids}", &live::id_array(&ids));
                        let rows: Vec<(i64, String, f64)> =
                            sqlx::query_as(&format!("{held}{HELD_SHARES}"))
                                .persistent(false)
                                .bind(lo)
                                .bind(hi)
                                .fetch_all(self.pool())
                                .await?;
                        Ok(rows.into_iter().map(held_share).collect())
                    }
                }
            },
        )
        .await
    }

    /// The holders' shares of the hours `[lo, hi)`, used-by and allocated-and-idle per
    /// workload, with the allocations found by start, then by end: for the test that the two
    /// ways agree, whichever [`Store::allocations_by_end`] would pick.
    #[doc(hidden)]
    pub async fn held_shares_both_ways(
        &self,
        lo: i64,
        hi: i64,
    ) -> Result<[(Vec<HeldShare>, Vec<gpuledger_ledger::waste::IdleShare>); 2]> {
        let mut out: [(Vec<HeldShare>, Vec<_>); 2] = Default::default();
        for (i, by_end) in [false, true].into_iter().enumerate() {
            out[i] = (
                self.held_shares_with(lo, hi, by_end).await?,
                self.idle_shares_with(lo, hi, &Filters::default(), by_end)
                    .await?,
            );
        }
        Ok(out)
    }

    /// Whether to find the allocations overlapping the hours `[lo, hi)` by when they end
    /// (those ending after `lo`, or open) rather than GPU by GPU by when they start (those
    /// started before `hi`): the side with fewer allocations, taking the history as starting
    /// at the oldest day row. Either way gives the same rows; near now, by end is a few
    /// thousand allocations against every one the fleet ever had.
    pub(crate) async fn allocations_by_end(
        &self,
        lo: i64,
        hi: i64,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let first: Option<i64> = sqlx::query_scalar("SELECT MIN(day) FROM gpu_days")
            .fetch_one(self.pool())
            .await?;
        Ok(match first {
            Some(first) => now.timestamp() - lo < hi - first,
            None => false,
        })
    }
}

/// A `(gpu_id, team, held hours)` row as the used-by split takes it.
/// `shares` less `outside` (shares of the same `key`: the part of an edge day's rows outside a
/// window, see [`edges_by_day_of`]), each key's shares summed into one, dropping what nothing
/// is left of. A share is a sum of hours each split among at most a few hundred holders, so
/// what is left is either at least a thousandth of an hour or the rounding of two float sums
/// of the same hours.
pub(crate) fn less_outside<T, K: Eq + std::hash::Hash>(
    shares: Vec<T>,
    outside: Vec<T>,
    key: impl Fn(&T) -> K,
    hours: impl Fn(&mut T) -> &mut f64,
) -> Vec<T> {
    let mut less: foldhash::HashMap<K, f64> = Default::default();
    for mut o in outside {
        let h = *hours(&mut o);
        *less.entry(key(&o)).or_default() += h;
    }
    let mut out: Vec<T> = Vec::with_capacity(shares.len());
    let mut at: foldhash::HashMap<K, usize> = Default::default();
    for mut s in shares {
        let k = key(&s);
        match at.get(&k) {
            Some(&i) => {
                let h = *hours(&mut s);
                *hours(&mut out[i]) += h;
            }
            None => {
                at.insert(k, out.len());
                out.push(s);
            }
        }
    }
    for s in &mut out {
        if let Some(h) = less.get(&key(s)) {
            *hours(s) -= h;
        }
    }
    out.retain_mut(|s| *hours(s) > 1e-9);
    out
}

/// What changed since a kept answer of a day table split from the allocations (`table`:
/// `gpu_day_use` or `gpu_day_idle`) for day `$2` was read, as `crate::live` asks it: the GPUs
/// whose rows of the table or day row of that day were written since the watermark `$1` (a
/// re-roll deletes a GPU-day's rows and writes them anew), and those with an allocation (on
/// them or their MIG instances) written since.
pub(crate) fn day_table_changed(table: &str) -> String {
    format!(
        "SELECT string_agg(CAST(gpu_id AS TEXT), ',') FROM (\
         SELECT t.gpu_id FROM {table} t WHERE t.day = $2 AND {} \
         UNION SELECT d.gpu_id FROM gpu_days d WHERE d.day = $2 AND {} \
         UNION SELECT COALESCE(m.parent, al.gpu_id) AS gpu_id FROM allocations al {MIG_PARENTS}\
         WHERE {}) f",
        live::written_since("t"),
        live::written_since("d"),
        live::written_since("al"),
    )
}

impl live::LiveRow for HeldShare {
    fn gpu_id(&self) -> i64 {
        self.gpu_id
    }
}

fn held_share((gpu_id, team, gpu_hours): (i64, String, f64)) -> HeldShare {
    HeldShare {
        gpu_id,
        team: Some(team.into()),
        gpu_hours,
    }
}

/// The whole UTC days inside the clock hours `[lo, hi)`, and the hours before and after them
/// (`[lo, hi)` itself when it holds no whole day): what day rollups and hour rollups answer.
pub(crate) fn whole_days(lo: i64, hi: i64) -> ((i64, i64), [(i64, i64); 2]) {
    let mut d_lo = day_floor(lo);
    if d_lo < lo {
        d_lo += DAY_SECS;
    }
    let d_hi = day_floor(hi);
    if d_lo < d_hi {
        ((d_lo, d_hi), [(lo, d_lo), (d_hi, hi)])
    } else {
        ((0, 0), [(lo, hi), (0, 0)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_hours_clip_to_now_and_include_partial_hours() {
        let w = Window {
            from: 3600 + 10,
            to: 3 * 3600 + 1,
        };
        assert_eq!(w.hours(10 * 3600), (3600, 4 * 3600));
        assert_eq!(w.hours(2 * 3600), (3600, 2 * 3600));
        assert_eq!(w.hours(0), (3600, 3600));
    }

    #[test]
    fn filter_clause_numbers_from_first() {
        let f = Filters {
            team: vec!["a".into(), "b".into()],
            model: vec!["m".into()],
            ..Default::default()
        };
        let (sql, binds) = f.clause(3);
        assert_eq!(sql, " AND g.team IN ($3,$4) AND g.model IN ($5)");
        assert_eq!(binds, ["a", "b", "m"]);
    }
}
