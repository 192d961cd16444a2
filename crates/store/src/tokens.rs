//! Tokens: minted once, shown once, stored only as a SHA-256 hash.
//!
//! An ingest token writes for one source (and, when scoped, only for some teams); a viewer token
//! only reads, for installs that require tokens for reading.

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::{Principal, Result, Store, StoreError};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Ingest,
    Viewer,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Ingest => "ingest",
            Role::Viewer => "viewer",
        }
    }
}

/// A verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub role: Role,
    pub source: String,
    pub teams: Option<Vec<String>>,
}

impl TokenInfo {
    /// The writer this token acts as; `kind` is how its source shows on the sources page.
    pub fn principal(&self, kind: &str) -> Principal {
        Principal {
            source: self.source.clone(),
            teams: self.teams.clone(),
            kind: kind.to_string(),
        }
    }
}

fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl Store {
    /// Mint a token; the returned text is the only copy of it.
    pub async fn create_token(&self, role: Role, source: &str, teams: &[String]) -> Result<String> {
        if source.trim().is_empty()
            || !source
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            return Err(StoreError::Invalid(format!(
                "source name `{source}` must be non-empty and use only letters, digits, `-`, `_`, `.`, `:`"
            )));
        }
        let mut raw = [0u8; 24];
        rand::rng().fill_bytes(&mut raw);
        let token = format!("glt_{}", hex::encode(raw));
        let teams: Vec<String> = teams
            .iter()
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        let teams_json =
            (!teams.is_empty()).then(|| serde_json::to_string(&teams).unwrap_or_default());
        sqlx::query(&self.sql(
            "INSERT INTO tokens (hash, role, source, teams, created_at) VALUES ($1, $2, $3, $4, $5)",
        ))
        .bind(hash(&token))
        .bind(role.as_str())
        .bind(source.to_string())
        .bind(teams_json)
        .bind(chrono::Utc::now().timestamp())
        .execute(self.pool())
        .await?;
        Ok(token)
    }

    /// The token's grant, or `None` when it is unknown.
    pub async fn verify_token(&self, token: &str) -> Result<Option<TokenInfo>> {
        let row: Option<(String, String, Option<String>)> =
            sqlx::query_as(&self.sql("SELECT role, source, teams FROM tokens WHERE hash = $1"))
                .bind(hash(token.trim()))
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(|(role, source, teams)| TokenInfo {
            role: if role == "viewer" {
                Role::Viewer
            } else {
                Role::Ingest
            },
            source,
            teams: teams.and_then(|t| serde_json::from_str(&t).ok()),
        }))
    }
}
