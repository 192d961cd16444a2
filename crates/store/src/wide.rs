//! Wide reads: a query of thousands of rows (one per GPU, per workload and GPU) read as one
//! JSON array in one row, built by the database, instead of row by row through the driver.
//!
//! Through sqlx's Any driver every row of a SQLite result is built on the connection's worker
//! thread, sent over a channel and copied into an `AnyRow` on the reading thread, column by
//! column. For 10,000 rows of 20 columns that costs three to five times what SQLite takes to
//! run the query (`docs/benchmarks.md`, `docs/architecture.md`); building the array in SQLite costs next to nothing.
//!
//! The values are the same: integers and text go as JSON numbers and strings; a REAL goes as
//! text that reads back to the same `f64` with Rust's own parser: from SQLite
//! `printf('%!.17g')` (SQLite's JSON would round it to 15 digits), from PostgreSQL its shortest
//! exact text (every connection sets `extra_float_digits = 3`, see `Store::open`). Not as a
//! JSON number: `serde_json` reads some (a value near 1e-300) one bit off.

use serde::de::{DeserializeOwned, Deserializer, Error as _, Visitor};

use crate::{Backend, Result, Store, StoreError};

/// A column of a wide read: its name in the inner query and whether it is a REAL.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Col<'a> {
    /// An integer or a text column (or NULL).
    Plain(&'a str),
    /// A REAL column (or NULL).
    Real(&'a str),
}

impl Store {
    /// The query that reads `inner`'s `columns`, in that order, as one JSON array of arrays
    /// ordered by `order` (columns of `j`, the inner query; empty where the reader needs no
    /// order).
    pub(crate) fn wide_sql(&self, inner: &str, columns: &[Col], order: &str) -> String {
        let values: Vec<String> = columns
            .iter()
            .map(|c| match (self.backend, c) {
                (Backend::Sqlite, Col::Real(name)) => {
                    format!(
                        "CASE WHEN j.{name} IS NULL THEN NULL ELSE printf('%!.17g', j.{name}) END"
                    )
                }
                (Backend::Postgres, Col::Real(name)) => format!("CAST(j.{name} AS TEXT)"),
                (_, Col::Plain(name)) => format!("j.{name}"),
            })
            .collect();
        let values = values.join(", ");
        let order = if order.is_empty() {
            String::new()
        } else {
            format!(" ORDER BY {order}")
        };
        match self.backend {
            Backend::Sqlite => {
                format!("SELECT json_group_array(json_array({values}){order}) FROM ({inner}) j")
            }
            Backend::Postgres => format!(
                "SELECT CAST(json_agg(json_build_array({values}){order}) AS TEXT) \
                 FROM ({inner}) j"
            ),
        }
    }

    /// The rows of a [`Store::wide_sql`] query's answer, each deserialized from its array.
    pub(crate) fn wide_rows<T: DeserializeOwned>(json: Option<String>) -> Result<Vec<T>> {
        match json {
            // PostgreSQL's `json_agg` of no rows is NULL.
            None => Ok(Vec::new()),
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| StoreError::Invalid(format!("a wide read's rows: {e}"))),
        }
    }
}

/// A REAL column of a wide read: the exact text the database wrote of it (or a JSON number).
pub(crate) fn real<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    opt_real(d)?.ok_or_else(|| D::Error::custom("a REAL column is NULL"))
}

/// A nullable REAL column of a wide read (see [`real`]).
pub(crate) fn opt_real<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<f64>, D::Error> {
    struct RealVisitor;
    impl<'de> Visitor<'de> for RealVisitor {
        type Value = Option<f64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number, the text of one, or null")
        }
        fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
            v.parse()
                .map(Some)
                .map_err(|_| E::custom(format!("`{v}` is not a number")))
        }
    }
    d.deserialize_any(RealVisitor)
}

#[cfg(test)]
mod tests {
    use gpuledger_ledger::Settings;
    use serde::Deserialize;

    use super::*;

    /// REALs that 15 digits would not give back, and the edges of the range, with NULL.
    const VALUES: &str =
        "SELECT 1 AS k, CAST(0.1 AS DOUBLE PRECISION) + CAST(0.2 AS DOUBLE PRECISION) AS r \
         UNION ALL SELECT 2, CAST(1e-300 AS DOUBLE PRECISION) / 3 \
         UNION ALL SELECT 3, CAST(123456789.12345678 AS DOUBLE PRECISION) \
         UNION ALL SELECT 4, CAST(NULL AS DOUBLE PRECISION) \
         UNION ALL SELECT 5, CAST(-2.5e17 AS DOUBLE PRECISION) / 3 \
         UNION ALL SELECT 6, CAST(1.7976931348623157e308 AS DOUBLE PRECISION) \
         UNION ALL SELECT 7, CAST(2 AS DOUBLE PRECISION) / 3";

    #[derive(Deserialize)]
    struct Row(i64, #[serde(deserialize_with = "opt_real")] Option<f64>);

    /// A wide read gives every value bit for bit what the driver reads row by row.
    async fn same_as_the_driver(store: &Store) {
        let plain: Vec<(i64, Option<f64>)> =
            sqlx::query_as(&format!("SELECT k, r FROM ({VALUES}) v ORDER BY k"))
                .fetch_all(store.pool())
                .await
                .unwrap();
        let sql = store.wide_sql(VALUES, &[Col::Plain("k"), Col::Real("r")], "j.k");
        let json: Option<String> = sqlx::query_scalar(&sql)
            .fetch_one(store.pool())
            .await
            .unwrap();
        let wide: Vec<(i64, Option<f64>)> = Store::wide_rows::<Row>(json)
            .unwrap()
            .into_iter()
            .map(|r| (r.0, r.1))
            .collect();
        assert_eq!(plain.len(), 7);
        let bits = |v: &[(i64, Option<f64>)]| -> Vec<(i64, Option<u64>)> {
            v.iter().map(|(k, r)| (*k, r.map(f64::to_bits))).collect()
        };
        assert_eq!(bits(&wide), bits(&plain));
        // No rows: an empty list on both backends (PostgreSQL's aggregate of none is NULL).
        let none = store.wide_sql(
            &format!("{VALUES} LIMIT 0"),
            &[Col::Plain("k"), Col::Real("r")],
            "",
        );
        let json: Option<String> = sqlx::query_scalar(&format!("SELECT * FROM ({none}) n"))
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert!(Store::wide_rows::<Row>(json).unwrap().is_empty());
    }

    #[tokio::test]
    async fn wide_reads_keep_every_real_exact_on_sqlite() {
        let dir = std::env::temp_dir().join(format!("gpuledger-wide-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}/wide.db", dir.display());
        let store = Store::open(&url, Settings::default()).await.unwrap();
        same_as_the_driver(&store).await;
        store.pool().close().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Needs `GPULEDGER_TEST_PG_URL`; fails without it when `GPULEDGER_REQUIRE_POSTGRES` is set.
    #[tokio::test]
    async fn wide_reads_keep_every_real_exact_on_postgres() {
        let Ok(url) = std::env::var("GPULEDGER_TEST_PG_URL") else {
            assert!(
                std::env::var_os("GPULEDGER_REQUIRE_POSTGRES").is_none(),
                "GPULEDGER_REQUIRE_POSTGRES is set but GPULEDGER_TEST_PG_URL is not"
            );
            eprintln!("skipped: set GPULEDGER_TEST_PG_URL to run it");
            return;
        };
        let schema = format!("t_wide_{}", std::process::id());
        Store::drop_schema(&url, &schema).await.unwrap();
        let store = Store::open_in_schema(&url, Some(&schema), Settings::default())
            .await
            .unwrap();
        same_as_the_driver(&store).await;
        Store::drop_schema(&url, &schema).await.unwrap();
    }
}
