//! Ownership and environment, first version: a GPU's `team` and `env` labels decide, and the
//! reason says which label decided and which source first reported the GPU (each label's own
//! source and time are in the GPU's provenance). Everything else is `unowned` /
//! `unknown` (BRIEF section 4). A later rules engine replaces this function, not its callers.

use std::collections::BTreeMap;

use gpuledger_model::{UNKNOWN, UNOWNED};

/// The environments the first version recognises; other values are kept as given.
pub const ENV_LABELS: [&str; 2] = ["env", "environment"];

/// Who owns a GPU, in which environment, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub team: String,
    pub env: String,
    pub reason: String,
}

/// Decide owner and environment from a GPU's merged labels.
pub fn derive_ownership(labels: &BTreeMap<String, String>, source: &str) -> Ownership {
    let team = labels
        .get("team")
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty());
    let env = ENV_LABELS.iter().find_map(|k| {
        labels
            .get(*k)
            .map(|v| (*k, v.trim().to_ascii_lowercase()))
            .filter(|(_, v)| !v.is_empty())
    });
    let owner_part = match &team {
        Some(t) => format!("owner: {t} — label `team={t}` on the GPU record"),
        None => format!("owner: {UNOWNED} — no `team` label and no rule places it"),
    };
    let env_part = match &env {
        Some((k, v)) => format!("env: {v} — label `{k}={v}`"),
        None => format!("env: {UNKNOWN} — no `env` label"),
    };
    Ownership {
        team: team.unwrap_or_else(|| UNOWNED.to_string()),
        env: env.map(|(_, v)| v).unwrap_or_else(|| UNKNOWN.to_string()),
        reason: format!("{owner_part}; {env_part}; GPU first reported by source {source}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn labels_decide_with_a_reason() {
        let o = derive_ownership(&labels(&[("team", "NLP"), ("env", "prod")]), "rdu-agent");
        assert_eq!((o.team.as_str(), o.env.as_str()), ("nlp", "prod"));
        assert_eq!(
            o.reason,
            "owner: nlp — label `team=nlp` on the GPU record; env: prod — label `env=prod`; \
             GPU first reported by source rdu-agent"
        );
    }

    #[test]
    fn missing_labels_are_named_buckets() {
        let o = derive_ownership(&labels(&[("team", " ")]), "s");
        assert_eq!((o.team.as_str(), o.env.as_str()), (UNOWNED, UNKNOWN));
        assert!(o.reason.contains("no `team` label"));
    }
}
