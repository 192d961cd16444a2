//! `gpuledger token`: mint, list, rotate and revoke the tokens pushers, agents and viewers
//! use. A token is shown once, when minted, and stored only as a hash.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Subcommand;
use gpuledger_store::{Role, Store, TokenRow};

use crate::{database_url, load_config, redacted, DbArgs};

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Mint a token; it is printed once, as the last line, and stored only as a hash.
    Create {
        /// The source the token writes for (its name on the sources page).
        #[arg(long)]
        source: String,
        /// Restrict writes to GPUs of this team (repeat for more).
        #[arg(long = "team")]
        teams: Vec<String>,
        /// A read-only token, for installs that require tokens to read.
        #[arg(long)]
        viewer: bool,
        /// Expire after this long (`90d`, `12h`, `30m`); never by default.
        #[arg(long, value_parser = parse_duration)]
        expires_in: Option<i64>,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Every token minted: id, role, source, teams, state, expiry and last use (never the
    /// token itself).
    List {
        /// One JSON object per token instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Mint a replacement with the same role, source, teams and expiry, and revoke the old
    /// token; the new one is printed once, as the last line.
    Rotate {
        /// The token's id (from `token list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Revoke a token: its next request gets 401. The row stays in `token list`.
    Revoke {
        /// The token's id (from `token list`).
        id: i64,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// `90d`, `12h`, `30m` or `45s` as seconds.
fn parse_duration(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = n
        .parse()
        .map_err(|_| format!("`{s}`: expected a number and a unit, like 90d, 12h or 30m"))?;
    let per = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err(format!("`{s}`: the unit must be d, h, m or s")),
    };
    if n <= 0 {
        return Err(format!("`{s}`: must be more than zero"));
    }
    n.checked_mul(per).ok_or_else(|| format!("`{s}`: too long"))
}

async fn open(db: DbArgs) -> anyhow::Result<Store> {
    let cfg = load_config(db.config.as_ref())?;
    let url = database_url(db.database_url, &cfg);
    Store::open_for_tool(&url, cfg.settings)
        .await
        .with_context(|| format!("opening database {}", redacted(&url)))
}

fn when(t: Option<i64>) -> String {
    t.and_then(|t| DateTime::<Utc>::from_timestamp(t, 0))
        .map(|t| t.format("%Y-%m-%dT%H:%MZ").to_string())
        .unwrap_or_else(|| "-".into())
}

fn scope(t: &TokenRow) -> String {
    if t.role == "viewer" {
        "read-only".to_string()
    } else if t.teams.is_empty() {
        format!("writes for source `{}`, any team", t.source)
    } else {
        format!(
            "writes for source `{}`, teams: {}",
            t.source,
            t.teams.join(", ")
        )
    }
}

pub async fn run(command: TokenCommand) -> anyhow::Result<()> {
    let now = Utc::now().timestamp();
    match command {
        TokenCommand::Create {
            source,
            teams,
            viewer,
            expires_in,
            db,
        } => {
            let store = open(db).await?;
            let role = if viewer { Role::Viewer } else { Role::Ingest };
            let expires_at = expires_in.map(|s| now + s);
            let token = store
                .create_token_expiring(role, &source, &teams, expires_at)
                .await?;
            let row = store
                .list_tokens()
                .await?
                .pop()
                .context("the new token was not stored")?;
            let until = expires_at
                .map(|e| format!(", expires {}", when(Some(e))))
                .unwrap_or_default();
            println!(
                "token {} created ({}{until}); it is shown only now:",
                row.id,
                scope(&row)
            );
            println!("{token}");
        }
        TokenCommand::List { json, db } => {
            let rows = open(db).await?.list_tokens().await?;
            if json {
                for r in &rows {
                    let mut v = serde_json::to_value(r)?;
                    v["state"] = r.state(now).into();
                    println!("{v}");
                }
            } else {
                println!(
                    "{:>4}  {:<7} {:<20} {:<16} {:<8} {:<17} {:<17} last used",
                    "id", "role", "source", "teams", "state", "created", "expires"
                );
                for r in &rows {
                    let teams = if r.teams.is_empty() {
                        "any".to_string()
                    } else {
                        r.teams.join(",")
                    };
                    println!(
                        "{:>4}  {:<7} {:<20} {:<16} {:<8} {:<17} {:<17} {}",
                        r.id,
                        r.role,
                        r.source,
                        teams,
                        r.state(now),
                        when(Some(r.created_at)),
                        when(r.expires_at),
                        r.last_used_at
                            .map(|t| when(Some(t)))
                            .unwrap_or_else(|| "never".into())
                    );
                }
            }
        }
        TokenCommand::Rotate { id, db } => {
            let (token, row) = open(db).await?.rotate_token(id, now).await?;
            println!(
                "token {id} revoked; token {} replaces it ({}); it is shown only now:",
                row.id,
                scope(&row)
            );
            println!("{token}");
        }
        TokenCommand::Revoke { id, db } => {
            let row = open(db).await?.revoke_token(id, now).await?;
            println!(
                "token {id} ({}) revoked at {}; its next request gets 401",
                scope(&row),
                when(row.revoked_at)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_take_a_unit() {
        use super::parse_duration as p;
        assert_eq!(p("90d"), Ok(90 * 86_400));
        assert_eq!(p("12h"), Ok(43_200));
        assert_eq!(p("30m"), Ok(1_800));
        assert!(p("90").unwrap_err().contains("unit must be d, h, m or s"));
        assert!(p("d").unwrap_err().contains("expected a number"));
        assert!(p("0d").unwrap_err().contains("more than zero"));
        assert!(p("99999999999999999d").is_err());
    }
}
