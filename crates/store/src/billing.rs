//! Billing exports reconciled and kept: a FOCUS file's GPU spend matched to GPUs (the matching
//! and arithmetic are `ledger::billing`'s), stored per GPU and charge period so that costs over
//! any window can show what was billed for its hours beside what was estimated.
//!
//! A file is keyed by its name: importing it again replaces what it said (a corrected or
//! extended export of the month), and importing the same content again changes nothing.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, TimeZone, Utc};
use gpuledger_ledger::billing::{
    month_range, months, parse_focus, reconcile, BilledRow, PeriodHours, Reconciliation,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::Row;

use gpuledger_model::{day_floor, hour_floor, DAY_SECS, HOUR_SECS};

use crate::rollup::values;
use crate::{Filters, Result, Store, StoreError, Window};

/// What importing one export did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BillingImport {
    pub name: String,
    pub sha256: String,
    pub imported_at: DateTime<Utc>,
    /// The same name with the same content was imported before: nothing changed.
    pub unchanged: bool,
    pub report: Reconciliation,
}

/// An imported export as `GET /api/v1/billing` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BillingFile {
    pub name: String,
    pub sha256: String,
    pub imported_at: DateTime<Utc>,
    /// The reconciliation as it was at import.
    pub report: serde_json::Value,
}

/// GPU spend an export billed that no known GPU matched, per resource: GPUs paid for that no
/// source reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnseenSpend {
    pub resource_id: String,
    pub instance_type: Option<String>,
    pub description: Option<String>,
    /// Billed in the window's charge periods.
    pub effective_cost: f64,
    /// The first and last charge period billed in the window.
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
    /// The export it was last billed in.
    pub file: String,
}

/// Billed periods written per `INSERT` statement (six parameters each, under SQLite's limit
/// of 32,766).
const BILLED_CHUNK: usize = 500;

/// A row of billed hours as read back: uuid, host, team, rate, period start, hours, billed.
type BilledRowSql = (String, Option<String>, String, Option<f64>, i64, i64, f64);

fn widen(touched: &mut BTreeMap<i64, (i64, i64)>, id: i64, lo: i64, hi: i64) {
    let e = touched.entry(id).or_insert((lo, hi));
    *e = (e.0.min(lo), e.1.max(hi));
}

/// The parts of `[lo, hi)` that none of `covered` covers.
fn uncovered((lo, hi): (i64, i64), covered: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut by_start: Vec<(i64, i64)> = covered
        .iter()
        .copied()
        .filter(|&(s, e)| s < hi && e > lo && s < e)
        .collect();
    by_start.sort_unstable();
    let mut out = Vec::new();
    let mut at = lo;
    for (s, e) in by_start {
        if s > at {
            out.push((at, s.min(hi)));
        }
        at = at.max(e);
        if at >= hi {
            break;
        }
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

/// GPUs grouped by their range, widened to whole hours, so each range is one statement.
fn by_hour_range(ranges: BTreeMap<i64, (i64, i64)>) -> BTreeMap<(i64, i64), Vec<i64>> {
    let mut by_range: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
    for (id, (lo, hi)) in ranges {
        by_range
            .entry((hour_floor(lo), hour_floor(hi - 1) + HOUR_SECS))
            .or_default()
            .push(id);
    }
    by_range
}

/// Clear the billed share of the hours of GPUs `IDS` in `[$1, $2)`: run over the ranges that
/// billed periods covered before an import ([`SPREAD_BILLED`] sets a share only on hours a
/// period covers, so no other hour holds one), ahead of setting the shares again.
const CLEAR_BILLED: &str = "UPDATE gpu_hours SET billed_usd = NULL \
     WHERE gpu_id IN (IDS) AND hour >= $1 AND hour < $2 AND billed_usd IS NOT NULL";

/// An hour's billed share, for the hours of GPUs `IDS` in `[$1, $2)` before `$3`: the sum
/// over the billed periods covering it of each period's bill over its present hours, set
/// from a join driven by the periods (`CROSS JOIN` keeps SQLite's planner from turning it
/// round): each period reads its own hours by key. Asking every hour for its periods instead
/// read all earlier periods of its GPU, quadratic in the history (20–58 s per 500 GPUs at
/// 10,000 GPUs × 90 days). Hours no period covers keep NULL (an estimate only), as
/// [`CLEAR_BILLED`] left them; an hour whose share is already the same is not written again (a
/// month's export delivered each day with one more day writes that day's hours). The hours
/// written are bounded by the GPUs and range too, not only by the join: else PostgreSQL read
/// every hour of the table to join them by hash, for each statement of 500 GPUs (at 30,150
/// GPUs × 30 days, 21.7 million rows for each 500 GPUs billed).
const SPREAD_BILLED: &str = "UPDATE gpu_hours SET billed_usd = s.usd FROM (\
       SELECT h.gpu_id AS gid, h.hour AS hr, SUM(bp.billed_usd / bp.hours) AS usd \
       FROM billed_gpu_periods bp CROSS JOIN gpu_hours h WHERE h.gpu_id = bp.gpu_id \
       AND h.hour >= bp.period_start AND h.hour < bp.period_end \
       AND h.hour >= $1 AND h.hour < $2 AND h.hour < $3 \
       AND bp.gpu_id IN (IDS) AND bp.hours > 0 \
       AND bp.period_start < $2 AND bp.period_end > $1 \
       GROUP BY h.gpu_id, h.hour) s \
     WHERE gpu_hours.gpu_id = s.gid AND gpu_hours.hour = s.hr \
     AND gpu_hours.gpu_id IN (IDS) AND gpu_hours.hour >= $1 AND gpu_hours.hour < $2 \
     AND (gpu_hours.billed_usd IS NULL OR gpu_hours.billed_usd <> s.usd)";

impl Store {
    /// Read a FOCUS export, reconcile its GPU spend with the estimates per GPU, team and month,
    /// and keep what was billed per GPU and charge period under the file's `name`: a newer
    /// import of the same GPU and period, from any file, replaces an older one. The same
    /// content under the same name changes nothing unless `force` (reconcile again, e.g. after
    /// new GPUs or aliases are known). A file that is not a FOCUS export is refused whole; a
    /// line that cannot be read is named in the report's problems and the rest is kept.
    pub async fn import_billing(
        &self,
        name: &str,
        text: &str,
        now: DateTime<Utc>,
        force: bool,
    ) -> Result<BillingImport> {
        self.import_billing_file(name, text, None, now, force).await
    }

    /// [`Store::import_billing`] of a file, remembering its size and modification time
    /// (`stamp`, see [`Store::billing_stamp`]).
    pub async fn import_billing_file(
        &self,
        name: &str,
        text: &str,
        stamp: Option<(i64, i64)>,
        now: DateTime<Utc>,
        force: bool,
    ) -> Result<BillingImport> {
        let sha256 = hex::encode(Sha256::digest(text.as_bytes()));
        let stored: Option<(String, String, i64)> = sqlx::query_as(
            &self.sql("SELECT sha256, report, imported_at FROM billing_files WHERE name = $1"),
        )
        .bind(name.to_string())
        .fetch_optional(self.pool())
        .await?;
        if let Some((sha, report, at)) = stored.as_ref().filter(|_| !force) {
            if *sha == sha256 {
                sqlx::query(&self.sql(
                    "UPDATE billing_files SET size_bytes = $2, modified = $3 WHERE name = $1",
                ))
                .bind(name.to_string())
                .bind(stamp.map(|s| s.0))
                .bind(stamp.map(|s| s.1))
                .execute(self.pool())
                .await?;
                return Ok(BillingImport {
                    name: name.to_string(),
                    sha256,
                    imported_at: Utc.timestamp_opt(*at, 0).single().unwrap_or_default(),
                    unchanged: true,
                    report: serde_json::from_str(report).unwrap_or_default(),
                });
            }
        }
        let (lines, problems) =
            parse_focus(name, text).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let filters = Filters::default();
        let mut windows = BTreeMap::new();
        for l in lines.iter().filter(|l| l.gpu) {
            if windows.contains_key(&l.month) {
                continue;
            }
            let (from, to) = month_range(l.charge_period_start);
            windows.insert(
                l.month.clone(),
                self.gpu_totals(Window { from, to }, &filters, now).await?,
            );
        }
        // Each GPU's present hours in each charge period of the GPU lines.
        let cap = Window {
            from: 0,
            to: now.timestamp(),
        }
        .hours(now.timestamp())
        .1;
        let mut period_hours = PeriodHours::new();
        for l in lines.iter().filter(|l| l.gpu) {
            let period = (
                l.charge_period_start.timestamp(),
                l.charge_period_end.timestamp(),
            );
            if period_hours.contains_key(&period) {
                continue;
            }
            let rows: Vec<(String, i64)> = sqlx::query_as(&self.sql(
                "SELECT g.uuid, CAST(COUNT(*) AS BIGINT) FROM gpu_hours h \
                 JOIN gpus g ON g.id = h.gpu_id \
                 WHERE h.hour >= $1 AND h.hour < $2 AND h.hour < $3 \
                 AND g.mig_parent_uuid IS NULL GROUP BY g.uuid",
            ))
            .bind(period.0)
            .bind(period.1)
            .bind(cap)
            .fetch_all(self.pool())
            .await?;
            period_hours.insert(period, rows.into_iter().collect());
        }
        // A cloud instance ID (from a Kubernetes node's providerID) names its host.
        let aliases: HashMap<String, String> = self
            .list_gpus(&filters, false, now)
            .await?
            .into_iter()
            .filter_map(|g| {
                Some((
                    g.labels.get("instance_id")?.to_ascii_lowercase(),
                    g.host?.to_string(),
                ))
            })
            .collect();
        let mut report = reconcile(&lines, &windows, &period_hours, &aliases, problems);

        let _writer = self.write_lock.lock().await;
        let mut tx = self.writer_tx().await?;
        let json = serde_json::to_string(&report).unwrap_or_else(|_| "{}".into());
        let file_id: i64 = sqlx::query_scalar(&self.sql(
            "INSERT INTO billing_files (name, sha256, imported_at, report, size_bytes, modified) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256, \
             imported_at = excluded.imported_at, report = excluded.report, \
             size_bytes = excluded.size_bytes, modified = excluded.modified RETURNING id",
        ))
        .bind(name.to_string())
        .bind(sha256.clone())
        .bind(now.timestamp())
        .bind(json)
        .bind(stamp.map(|s| s.0))
        .bind(stamp.map(|s| s.1))
        .fetch_one(&mut *tx)
        .await?;
        // The GPU-hours whose billed share changes: what the file said before, and what it
        // says now. Only the first (and the periods of other files it replaces) may hold a
        // share to clear.
        let mut touched: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
        let mut billed_before: Vec<(i64, i64, i64)> = sqlx::query_as(&self.sql(
            "SELECT gpu_id, period_start, period_end FROM billed_gpu_periods WHERE file_id = $1",
        ))
        .bind(file_id)
        .fetch_all(&mut *tx)
        .await?;
        for &(id, lo, hi) in &billed_before {
            widen(&mut touched, id, lo, hi);
        }
        sqlx::query(&self.sql("DELETE FROM billed_gpu_periods WHERE file_id = $1"))
            .bind(file_id)
            .execute(&mut *tx)
            .await?;
        // The shares as rows, one per GPU and charge period (an export may bill one GPU's
        // period on several lines: their bills add up), written many to a statement instead
        // of one a share (at 100,350 GPUs × 30 days, some 250,000 statements an import).
        let ids: HashMap<String, i64> =
            sqlx::query_as::<_, (String, i64)>("SELECT uuid, id FROM gpus")
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
        let mut periods: BTreeMap<(i64, i64, i64), (f64, i64)> = BTreeMap::new();
        for b in &report.shares {
            let Some(&id) = ids.get(&b.uuid) else {
                continue;
            };
            let e = periods
                .entry((id, b.period_start, b.period_end))
                .or_insert((0.0, b.hours));
            e.0 += b.billed_usd;
            widen(&mut touched, id, b.period_start, b.period_end);
        }
        let periods: Vec<_> = periods.into_iter().collect();
        for chunk in periods.chunks(BILLED_CHUNK) {
            let sql = format!(
                "INSERT INTO billed_gpu_periods \
                 (file_id, gpu_id, period_start, period_end, billed_usd, hours) VALUES {}",
                values(chunk.len(), 6)
            );
            let sql = self.sql(&sql);
            let mut q = sqlx::query(&sql).persistent(chunk.len() == BILLED_CHUNK);
            for ((id, lo, hi), (usd, hours)) in chunk {
                q = q
                    .bind(file_id)
                    .bind(*id)
                    .bind(*lo)
                    .bind(*hi)
                    .bind(*usd)
                    .bind(*hours);
            }
            q.execute(&mut *tx).await?;
        }
        // A newer bill of a GPU's hours replaces what older files said of them: exports
        // delivered again under new names, or one file imported under two paths, never add up.
        let overlap = "FROM billed_gpu_periods WHERE file_id <> $1 AND EXISTS (\
             SELECT 1 FROM billed_gpu_periods n WHERE n.file_id = $1 \
             AND n.gpu_id = billed_gpu_periods.gpu_id \
             AND n.period_start < billed_gpu_periods.period_end \
             AND n.period_end > billed_gpu_periods.period_start)";
        let replaced: Vec<(i64, i64, i64)> = sqlx::query_as(&self.sql(&format!(
            "SELECT gpu_id, period_start, period_end {overlap}"
        )))
        .bind(file_id)
        .fetch_all(&mut *tx)
        .await?;
        for (id, lo, hi) in replaced {
            widen(&mut touched, id, lo, hi);
            billed_before.push((id, lo, hi));
        }
        sqlx::query(&self.sql(&format!("DELETE {overlap}")))
            .bind(file_id)
            .execute(&mut *tx)
            .await?;
        // Per GPU, owner and month: what this file billed for the hours it covers, against the
        // estimate of the same hours. Summed per GPU before its names are joined, and read
        // before the hours' shares are written: the hours are then read from their index
        // alone (on PostgreSQL, rows just updated are read from the table; this took half
        // of an import).
        let rows: Vec<BilledRowSql> = sqlx::query_as(&self.sql(
            "SELECT g.uuid, g.host, x.team, g.usd_per_hour, x.period_start, x.n, x.usd FROM (\
                 SELECT bp.gpu_id AS gid, o.team AS team, bp.period_start AS period_start, \
                 CAST(COUNT(*) AS BIGINT) AS n, \
                 CAST(SUM(bp.billed_usd / bp.hours) AS DOUBLE PRECISION) AS usd \
                 FROM billed_gpu_periods bp \
                 JOIN gpu_hours h ON h.gpu_id = bp.gpu_id AND h.hour >= bp.period_start \
                 AND h.hour < bp.period_end AND h.hour < $2 \
                 JOIN gpu_owners o ON o.gpu_id = h.gpu_id AND o.from_ts <= +h.hour \
                 AND o.to_ts > +h.hour \
                 WHERE bp.file_id = $1 AND bp.hours > 0 \
                 GROUP BY bp.gpu_id, o.team, bp.period_start) x \
                 JOIN gpus g ON g.id = x.gid \
                 UNION ALL \
                 SELECT g.uuid, g.host, g.team, g.usd_per_hour, bp.period_start, \
                 CAST(0 AS BIGINT), CAST(bp.billed_usd AS DOUBLE PRECISION) \
                 FROM billed_gpu_periods bp JOIN gpus g ON g.id = bp.gpu_id \
                 WHERE bp.file_id = $1 AND bp.hours = 0",
        ))
        .bind(file_id)
        .bind(cap)
        .fetch_all(&mut *tx)
        .await?;
        // Clear what the periods before covered and the new ones do not (a first import
        // clears nothing: reading every hour of its range for a share took half of a
        // 10,000-GPU import; a month's export delivered again with a day more clears nothing
        // either), spread each GPU's billed periods over their present hours (as counted
        // above: only the hours whose share changes are written), and roll the days up again.
        let mut billing: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
        for ((id, lo, hi), (_, hours)) in &periods {
            if *hours > 0 {
                billing.entry(*id).or_default().push((*lo, *hi));
            }
        }
        let mut to_clear: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
        for (id, lo, hi) in billed_before {
            let billed = billing.get(&id).map(Vec::as_slice).unwrap_or_default();
            for (lo, hi) in uncovered((lo, hi), billed) {
                to_clear
                    .entry((hour_floor(lo), hour_floor(hi - 1) + HOUR_SECS))
                    .or_default()
                    .push(id);
            }
        }
        for ((lo, hi), mut ids) in to_clear {
            ids.sort_unstable();
            ids.dedup();
            self.for_ids(&mut tx, &ids, lo, hi, None, CLEAR_BILLED)
                .await?;
        }
        for ((lo, hi), ids) in &by_hour_range(touched) {
            self.for_ids(&mut tx, ids, *lo, *hi, Some(cap as f64), SPREAD_BILLED)
                .await?;
            self.reroll_days(&mut tx, ids, day_floor(*lo), day_floor(*hi - 1) + DAY_SECS)
                .await?;
        }
        let rows: Vec<BilledRow> = rows
            .into_iter()
            .map(|(uuid, host, team, rate, start, hours, billed)| BilledRow {
                month: Utc
                    .timestamp_opt(start, 0)
                    .single()
                    .unwrap_or_default()
                    .format("%Y-%m")
                    .to_string(),
                uuid,
                host: host.unwrap_or_default(),
                team,
                gpu_hours: hours,
                usd_per_hour: rate,
                billed_usd: billed,
            })
            .collect();
        (report.gpus, report.teams) = months(&rows);
        let json = serde_json::to_string(&report).unwrap_or_else(|_| "{}".into());
        sqlx::query(&self.sql("UPDATE billing_files SET report = $2 WHERE id = $1"))
            .bind(file_id)
            .bind(json)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(BillingImport {
            name: name.to_string(),
            sha256,
            imported_at: now,
            unchanged: false,
            report,
        })
    }

    /// GPU spend billed in charge periods overlapping `[from, to)` that matched no known GPU,
    /// per resource, largest first.
    pub async fn billed_unseen(&self, from: i64, to: i64) -> Result<Vec<UnseenSpend>> {
        /// A report's lines that matched no GPU, the rest of it skipped as it is read: a
        /// report lists every GPU-month too (2.6 MB for 10,000 GPUs over three months), and
        /// this runs on every Overview, Waste and savings request.
        #[derive(serde::Deserialize)]
        struct UnmatchedOf {
            unmatched: Vec<gpuledger_ledger::billing::Unmatched>,
        }
        let files: Vec<(String, String)> = sqlx::query_as(
            "SELECT name, report FROM billing_files ORDER BY imported_at DESC, name",
        )
        .fetch_all(self.pool())
        .await?;
        let mut by_resource: BTreeMap<String, UnseenSpend> = BTreeMap::new();
        for (name, report) in files {
            let Ok(report) = serde_json::from_str::<UnmatchedOf>(&report) else {
                continue;
            };
            for u in report.unmatched {
                if u.period_end <= from || u.period_start >= to {
                    continue;
                }
                let key = u
                    .resource_id
                    .clone()
                    .unwrap_or_else(|| format!("line {} of {name}", u.line));
                let at = |t: i64| Utc.timestamp_opt(t, 0).single().unwrap_or_default();
                let e = by_resource.entry(key.clone()).or_insert(UnseenSpend {
                    resource_id: key,
                    instance_type: u.instance_type.clone(),
                    description: u.description.clone(),
                    effective_cost: 0.0,
                    first: at(u.period_start),
                    last: at(u.period_end),
                    file: name.clone(),
                });
                e.effective_cost += u.effective_cost;
                e.first = e.first.min(at(u.period_start));
                e.last = e.last.max(at(u.period_end));
            }
        }
        let mut out: Vec<UnseenSpend> = by_resource.into_values().collect();
        out.sort_by(|a, b| b.effective_cost.total_cmp(&a.effective_cost));
        Ok(out)
    }

    /// The size and modification time a file had when it was last imported under `name`.
    pub async fn billing_stamp(&self, name: &str) -> Result<Option<(i64, i64)>> {
        let row: Option<(Option<i64>, Option<i64>)> = sqlx::query_as(
            &self.sql("SELECT size_bytes, modified FROM billing_files WHERE name = $1"),
        )
        .bind(name.to_string())
        .fetch_optional(self.pool())
        .await?;
        Ok(row.and_then(|(s, m)| Some((s?, m?))))
    }

    /// The imported exports, newest first, with their reports as at import.
    pub async fn billing_files(&self) -> Result<Vec<BillingFile>> {
        sqlx::query(
            "SELECT name, sha256, imported_at, report FROM billing_files \
             ORDER BY imported_at DESC, name",
        )
        .fetch_all(self.pool())
        .await?
        .iter()
        .map(|r| {
            let report: String = r.try_get("report")?;
            Ok(BillingFile {
                name: r.try_get("name")?,
                sha256: r.try_get("sha256")?,
                imported_at: Utc
                    .timestamp_opt(r.try_get("imported_at")?, 0)
                    .single()
                    .unwrap_or_default(),
                report: serde_json::from_str(&report).unwrap_or_default(),
            })
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::uncovered;

    #[test]
    fn uncovered_leaves_the_gaps_of_a_range_that_no_period_covers() {
        assert_eq!(uncovered((0, 10), &[]), [(0, 10)]);
        assert_eq!(uncovered((0, 10), &[(0, 10)]), []);
        assert_eq!(uncovered((0, 10), &[(-5, 20)]), []);
        // Out of order, overlapping, touching, and outside the range.
        assert_eq!(
            uncovered(
                (0, 10),
                &[(6, 8), (2, 4), (3, 5), (8, 9), (20, 30), (-3, -1)]
            ),
            [(0, 2), (5, 6), (9, 10)]
        );
        assert_eq!(uncovered((0, 10), &[(0, 4)]), [(4, 10)]);
        assert_eq!(uncovered((0, 10), &[(4, 12)]), [(0, 4)]);
        // An empty period covers nothing.
        assert_eq!(uncovered((0, 10), &[(5, 5)]), [(0, 10)]);
    }
}
