//! PostgreSQL's time partitions of raw samples (by day) and hour rollups (by week): created
//! ahead for the retention periods, dropped whole past retention. SQLite keeps one table each.

use sqlx::Row;

use crate::{Backend, Result, Store};

/// A partitioned table: its time column and the width of one partition in seconds.
struct Partitioned {
    table: &'static str,
    column: &'static str,
    width: i64,
}

const SAMPLES: Partitioned = Partitioned {
    table: "samples",
    column: "ts",
    width: gpuledger_model::DAY_SECS,
};
const HOURS: Partitioned = Partitioned {
    table: "gpu_hours",
    column: "hour",
    width: 7 * gpuledger_model::DAY_SECS,
};

/// The statistics target of a partition's time column, as migration 25 sets on the tables:
/// the smallest and largest value as a histogram, so the planner looks up the real largest
/// value past the last analysis instead of taking a new hour for one row (a partition made
/// with `LIKE` gets the default target, not its table's).
const TIME_STATISTICS: i32 = 1;

/// Partitions made ahead of the clock, so the next days' samples never land in the default
/// (the server makes them hourly).
const AHEAD_SECS: i64 = 2 * gpuledger_model::DAY_SECS;

/// The start of the range a partition's name gives (`samples_p1764633600`).
fn start_of(table: &str, name: &str) -> Option<i64> {
    name.strip_prefix(table)?.strip_prefix("_p")?.parse().ok()
}

impl Store {
    /// The starts of `p`'s range partitions, ascending.
    async fn partition_starts(&self, p: &Partitioned) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT CAST(c.relname AS TEXT) AS name FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)",
        )
        .bind(p.table)
        .fetch_all(&self.pool)
        .await?;
        let mut starts: Vec<i64> = rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>("name").ok())
            .filter_map(|n| start_of(p.table, &n))
            .collect();
        starts.sort_unstable();
        Ok(starts)
    }

    /// Create `p`'s partitions covering `[from, to)` that are missing. Rows the default
    /// partition holds for a new partition's range move into it in the same transaction.
    async fn create_partitions(&self, p: &Partitioned, from: i64, to: i64) -> Result<usize> {
        let have = self.partition_starts(p).await?;
        let mut made = 0;
        let mut start = from.div_euclid(p.width) * p.width;
        while start < to {
            if have.binary_search(&start).is_err() {
                let (t, c, end) = (p.table, p.column, start + p.width);
                let name = format!("{t}_p{start}");
                let mut tx = self.pool.begin().await?;
                // Two servers on one database may both get here: the lock makes the second
                // wait, and it then finds the partition made.
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(format!("gpuledger partition {name}"))
                    .execute(&mut *tx)
                    .await?;
                let exists: Option<String> =
                    sqlx::query_scalar("SELECT CAST(to_regclass($1) AS TEXT)")
                        .bind(&name)
                        .fetch_one(&mut *tx)
                        .await?;
                if exists.is_none() {
                    for sql in [
                        format!("CREATE TABLE {name} (LIKE {t} INCLUDING DEFAULTS)"),
                        format!(
                            "ALTER TABLE {name} ALTER COLUMN {c} SET STATISTICS {TIME_STATISTICS}"
                        ),
                        format!(
                            "WITH moved AS (DELETE FROM {t}_default WHERE {c} >= {start} \
                             AND {c} < {end} RETURNING *) INSERT INTO {name} SELECT * FROM moved"
                        ),
                        format!(
                            "ALTER TABLE {t} ATTACH PARTITION {name} \
                             FOR VALUES FROM ({start}) TO ({end})"
                        ),
                    ] {
                        sqlx::query(&sql).execute(&mut *tx).await?;
                    }
                    made += 1;
                }
                tx.commit().await?;
            }
            start += p.width;
        }
        Ok(made)
    }

    /// Make the partitions that samples accepted around `now_secs` need, from the raw-sample
    /// retention's cutoff to two days ahead (PostgreSQL; nothing on SQLite): hour rollups are
    /// only made from accepted samples, so older hours keep the partitions they have. Returns
    /// how many were created.
    pub async fn ensure_partitions(&self, now_secs: i64) -> Result<usize> {
        if self.backend != Backend::Postgres {
            return Ok(0);
        }
        let from = self.raw_cutoff(now_secs) - gpuledger_model::HOUR_SECS;
        let to = now_secs + AHEAD_SECS;
        Ok(self.create_partitions(&SAMPLES, from, to).await?
            + self.create_partitions(&HOURS, from, to).await?)
    }

    /// Drop `p`'s partitions that end at or before `cutoff`; returns the rows they held.
    pub(crate) async fn drop_partitions_before(&self, p: &str, cutoff: i64) -> Result<u64> {
        let p = if p == SAMPLES.table { &SAMPLES } else { &HOURS };
        let mut rows = 0u64;
        for start in self.partition_starts(p).await? {
            if start + p.width > cutoff {
                break;
            }
            let name = format!("{}_p{start}", p.table);
            let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {name}"))
                .fetch_one(&self.pool)
                .await?;
            sqlx::query(&format!("DROP TABLE IF EXISTS {name}"))
                .execute(&self.pool)
                .await?;
            rows += n.max(0) as u64;
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_partition_name_gives_its_start() {
        assert_eq!(
            super::start_of("samples", "samples_p1764633600"),
            Some(1_764_633_600)
        );
        assert_eq!(super::start_of("samples", "samples_default"), None);
        assert_eq!(super::start_of("gpu_hours", "samples_p1"), None);
    }
}
