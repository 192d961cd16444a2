//! Online backup of a SQLite database: a consistent copy taken while the server runs.
//! PostgreSQL is backed up with its own tools (`pg_dump`; see docs/deploy.md).

use crate::{Backend, Result, Store, StoreError};

impl Store {
    /// Write a consistent copy of the whole SQLite database to `dest` (a new file), while
    /// pushes and reads go on, then check the copy's integrity. Returns the copy's size.
    pub async fn backup_to(&self, dest: &std::path::Path) -> Result<u64> {
        if self.backend != Backend::Sqlite {
            return Err(StoreError::Invalid(
                "this database is PostgreSQL: back it up with pg_dump (docs/deploy.md, \
                 Backup and restore)"
                    .into(),
            ));
        }
        if dest.exists() {
            return Err(StoreError::Invalid(format!(
                "{} exists; a backup is written to a new file",
                dest.display()
            )));
        }
        let path = dest
            .to_str()
            .ok_or_else(|| StoreError::Invalid(format!("{}: not a UTF-8 path", dest.display())))?;
        // One read transaction copies every page as of its start; WAL lets writers go on.
        sqlx::query(&self.sql("VACUUM INTO $1"))
            .bind(path.to_string())
            .execute(self.pool())
            .await?;
        let copy = Store::open_for_tool(path, (*self.settings).clone()).await?;
        let check: String = sqlx::query_scalar("PRAGMA quick_check")
            .fetch_one(copy.pool())
            .await?;
        copy.pool().close().await;
        if check != "ok" {
            return Err(StoreError::Invalid(format!(
                "the copy at {} failed its integrity check: {check}",
                dest.display()
            )));
        }
        Ok(std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0))
    }
}
