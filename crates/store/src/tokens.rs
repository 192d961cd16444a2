//! Tokens: minted once, shown once, stored only as a SHA-256 hash.
//!
//! An ingest token writes for one source (and, when scoped, only for some teams); a viewer token
//! only reads, for installs that require tokens for reading.

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::audit::{AuditCounts, AuditKey};
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

/// A stored token as `token list` shows it (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenRow {
    pub id: i64,
    pub role: &'static str,
    pub source: String,
    /// The teams a scoped token is limited to; empty: any team.
    pub teams: Vec<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// When the server last accepted it (to the minute); `None`: never used.
    pub last_used_at: Option<i64>,
}

impl TokenRow {
    /// `active`, `revoked` or `expired` at `now`.
    pub fn state(&self, now: i64) -> &'static str {
        if self.revoked_at.is_some() {
            "revoked"
        } else if self.expires_at.is_some_and(|e| e <= now) {
            "expired"
        } else {
            "active"
        }
    }
}

/// How often a token's last use is written: at most once a minute per token.
const LAST_USED_EVERY_SECS: i64 = 60;

type TokenSql = (
    i64,
    String,
    String,
    Option<String>,
    i64,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

fn token_row(r: TokenSql) -> TokenRow {
    let (id, role, source, teams, created_at, expires_at, revoked_at, last_used_at) = r;
    TokenRow {
        id,
        role: if role == "viewer" { "viewer" } else { "ingest" },
        source,
        teams: teams
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default(),
        created_at,
        expires_at,
        revoked_at,
        last_used_at,
    }
}

const TOKEN_COLUMNS: &str =
    "id, role, source, teams, created_at, expires_at, revoked_at, last_used_at";

impl Store {
    /// Mint a token; the returned text is the only copy of it.
    pub async fn create_token(&self, role: Role, source: &str, teams: &[String]) -> Result<String> {
        self.create_token_expiring(role, source, teams, None).await
    }

    /// [`Store::create_token`] with an expiry (unix seconds); after it the token gets 401.
    pub async fn create_token_expiring(
        &self,
        role: Role,
        source: &str,
        teams: &[String],
        expires_at: Option<i64>,
    ) -> Result<String> {
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
            "INSERT INTO tokens (hash, role, source, teams, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        ))
        .bind(hash(&token))
        .bind(role.as_str())
        .bind(source.to_string())
        .bind(teams_json)
        .bind(chrono::Utc::now().timestamp())
        .bind(expires_at)
        .execute(self.pool())
        .await?;
        let grant = if teams.is_empty() {
            role.as_str().to_string()
        } else {
            format!("{} teams={}", role.as_str(), teams.join(","))
        };
        self.audit_admin(source, "token.create", &grant).await?;
        Ok(token)
    }

    /// Count a token administration in the audit log: who ran it (the operating-system user
    /// of the command, as far as the environment says) and on which token.
    async fn audit_admin(&self, source: &str, action: &str, what: &str) -> Result<()> {
        let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME"));
        let actor = match user {
            Ok(u) if !u.is_empty() => format!("cli {u}"),
            _ => "cli".to_string(),
        };
        let key = AuditKey::new(chrono::Utc::now().timestamp(), source, &actor, action, what);
        self.audit(&[(
            key,
            AuditCounts {
                requests: 1,
                ..Default::default()
            },
        )])
        .await
    }

    /// Every token ever minted, oldest first, with its state and last use.
    pub async fn list_tokens(&self) -> Result<Vec<TokenRow>> {
        let rows: Vec<TokenSql> =
            sqlx::query_as(&format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY id"))
                .fetch_all(self.pool())
                .await?;
        Ok(rows.into_iter().map(token_row).collect())
    }

    async fn token_by_id(&self, id: i64) -> Result<TokenRow> {
        let row: Option<TokenSql> =
            sqlx::query_as(&self.sql(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = $1")))
                .bind(id)
                .fetch_optional(self.pool())
                .await?;
        row.map(token_row)
            .ok_or_else(|| StoreError::Invalid(format!("no token with id {id} (see `token list`)")))
    }

    /// Revoke token `id` at `now`: its next request gets 401. Revoking twice keeps the first
    /// time.
    pub async fn revoke_token(&self, id: i64, now: i64) -> Result<TokenRow> {
        let row = self.token_by_id(id).await?;
        let done = sqlx::query(
            &self.sql("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL"),
        )
        .bind(now)
        .bind(id)
        .execute(self.pool())
        .await?
        .rows_affected();
        if done > 0 {
            self.audit_admin(&row.source, "token.revoke", &format!("token {id}"))
                .await?;
        }
        self.token_by_id(id).await
    }

    /// Replace token `id` by a new one with the same role, source, teams and remaining
    /// lifetime, and revoke the old one; returns the new token (its only copy) and its row.
    pub async fn rotate_token(&self, id: i64, now: i64) -> Result<(String, TokenRow)> {
        let old = self.token_by_id(id).await?;
        if old.state(now) != "active" {
            return Err(StoreError::Invalid(format!(
                "token {id} is {}; mint a new one with `token create`",
                old.state(now)
            )));
        }
        let role = if old.role == "viewer" {
            Role::Viewer
        } else {
            Role::Ingest
        };
        let token = self
            .create_token_expiring(role, &old.source, &old.teams, old.expires_at)
            .await?;
        self.revoke_token(id, now).await?;
        let new: TokenSql = sqlx::query_as(&self.sql(&format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = $1"
        )))
        .bind(hash(&token))
        .fetch_one(self.pool())
        .await?;
        Ok((token, token_row(new)))
    }

    /// The token's grant, or `None` when it is unknown, revoked or expired. Notes its use (at
    /// most once a minute per token).
    pub async fn verify_token(&self, token: &str) -> Result<Option<TokenInfo>> {
        let now = chrono::Utc::now().timestamp();
        type Grant = (i64, String, String, Option<String>, Option<i64>);
        let row: Option<Grant> = sqlx::query_as(&self.sql(
            "SELECT id, role, source, teams, last_used_at FROM tokens WHERE hash = $1 \
                 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $2)",
        ))
        .bind(hash(token.trim()))
        .bind(now)
        .fetch_optional(self.pool())
        .await?;
        let Some((id, role, source, teams, last_used)) = row else {
            return Ok(None);
        };
        if last_used.is_none_or(|t| now - t >= LAST_USED_EVERY_SECS) {
            sqlx::query(&self.sql("UPDATE tokens SET last_used_at = $1 WHERE id = $2"))
                .bind(now)
                .bind(id)
                .execute(self.pool())
                .await?;
        }
        Ok(Some(TokenInfo {
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
