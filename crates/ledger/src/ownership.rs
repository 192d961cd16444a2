//! Ownership and environment: ordered rules, first match wins, each decision with its reason.
//!
//! The config's `[[ownership.rules]]` match on any attribute a source gives a GPU (its labels,
//! which carry Kubernetes node labels, cloud tags and pushed labels; host, cluster, cloud,
//! region, instance type, model, source) with `*`/`?` patterns, and set a team, an environment
//! or both, either as a fixed name or taken from an attribute. Explicit assignments (a CSV of
//! GPU UUID or host → team, env) come first; the built-in label rules (`team`, then `env` /
//! `environment` labels) come last, so a fleet without rules behaves as before. What no rule
//! places is `unowned` / `unknown` (BRIEF section 4). Team and environment are decided apart:
//! the first rule that sets each wins.

use std::collections::BTreeMap;

use gpuledger_model::{UNKNOWN, UNOWNED};

use crate::merge::Seen;
use crate::rates::glob_match;

/// Who owns a GPU, in which environment, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub team: String,
    pub env: String,
    pub reason: String,
}

/// A GPU attribute a rule can match or take a value from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attr {
    /// `label.<key>`: a label of the GPU (node labels, cloud tags, pushed labels).
    Label(String),
    Host,
    Cluster,
    Cloud,
    Region,
    InstanceType,
    Model,
    /// The GPU's primary source (the first to report it).
    Source,
    /// `uuid`.
    Uuid,
}

impl Attr {
    /// Read an attribute name as written in the config.
    pub fn parse(s: &str) -> Result<Attr, String> {
        Ok(match s.trim() {
            "host" => Attr::Host,
            "cluster" => Attr::Cluster,
            "cloud" => Attr::Cloud,
            "region" => Attr::Region,
            "instance_type" => Attr::InstanceType,
            "model" => Attr::Model,
            "source" => Attr::Source,
            "uuid" => Attr::Uuid,
            other => match other.strip_prefix("label.") {
                Some(k) if !k.is_empty() => Attr::Label(k.to_string()),
                _ => {
                    return Err(format!(
                        "`{other}` is no GPU attribute; use label.<key>, host, cluster, cloud, \
                         region, instance_type, model, source or uuid"
                    ))
                }
            },
        })
    }

    /// The key of this attribute in [`crate::GpuRecord::seen`].
    fn seen_key(&self) -> Option<String> {
        Some(match self {
            Attr::Label(k) => format!("label.{k}"),
            Attr::Host => "host".into(),
            Attr::Cluster => "cluster".into(),
            Attr::Cloud => "cloud".into(),
            Attr::Region => "region".into(),
            Attr::InstanceType => "instance_type".into(),
            Attr::Model => "model".into(),
            Attr::Source | Attr::Uuid => return None,
        })
    }

    fn name(&self) -> String {
        match self {
            Attr::Label(k) => format!("label `{k}`"),
            Attr::Host => "host".into(),
            Attr::Cluster => "cluster".into(),
            Attr::Cloud => "cloud".into(),
            Attr::Region => "region".into(),
            Attr::InstanceType => "instance type".into(),
            Attr::Model => "model".into(),
            Attr::Source => "source".into(),
            Attr::Uuid => "uuid".into(),
        }
    }
}

/// What ownership rules read of a GPU.
#[derive(Debug, Clone, Copy)]
pub struct GpuFacts<'a> {
    pub uuid: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub host: Option<&'a str>,
    pub cluster: Option<&'a str>,
    pub cloud: Option<&'a str>,
    pub region: Option<&'a str>,
    pub instance_type: Option<&'a str>,
    pub model: &'a str,
    pub source: &'a str,
    /// Which source gave each attribute its value, and when it last reported it.
    pub seen: Option<&'a BTreeMap<String, Seen>>,
}

impl GpuFacts<'_> {
    /// `label `team` `nlp` (from source rdu-k8s, seen 2026-12-02 11:02 UTC)`: an attribute's
    /// value with where it came from, when known.
    fn evidence(&self, a: &Attr, v: &str) -> (String, Option<String>) {
        (format!("{} `{v}`", a.name()), self.provenance(a, v))
    }

    /// ` (from source rdu-k8s, seen 2026-12-02 11:02 UTC)`, when the store knows it.
    fn provenance(&self, a: &Attr, v: &str) -> Option<String> {
        let s = self.seen?.get(&a.seen_key()?)?;
        (s.value.trim() == v).then(|| {
            format!(
                " (from source {}, seen {})",
                s.source,
                s.at.format("%Y-%m-%d %H:%M UTC")
            )
        })
    }

    fn get(&self, a: &Attr) -> Option<&str> {
        match a {
            Attr::Label(k) => self.labels.get(k).map(String::as_str),
            Attr::Host => self.host,
            Attr::Cluster => self.cluster,
            Attr::Cloud => self.cloud,
            Attr::Region => self.region,
            Attr::InstanceType => self.instance_type,
            Attr::Model => Some(self.model),
            Attr::Source => Some(self.source),
            Attr::Uuid => Some(self.uuid),
        }
        .map(str::trim)
        .filter(|v| !v.is_empty())
    }
}

/// What a rule sets a team or environment to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// A fixed name.
    Name(String),
    /// The value of an attribute (`team_from = "label.squad"`), lower-cased.
    From(Attr),
}

/// One ordered rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: Option<String>,
    /// Every condition must hold: the attribute is present and matches the pattern.
    pub when: Vec<(Attr, String)>,
    pub team: Option<Setting>,
    pub env: Option<Setting>,
}

/// One line of the assignments file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// A GPU UUID (`GPU-…`/`MIG-…`) or a host name pattern.
    pub target: String,
    pub team: Option<String>,
    pub env: Option<String>,
    /// Where it was written (`assignments.csv:4`).
    pub at: String,
}

/// The configured rules and assignments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnershipRules {
    pub assignments: Vec<Assignment>,
    pub rules: Vec<Rule>,
}

/// The built-in label rules, after the configured ones.
fn label_rules() -> [(Attr, bool); 3] {
    [
        (Attr::Label("team".into()), true),
        (Attr::Label("env".into()), false),
        (Attr::Label("environment".into()), false),
    ]
}

fn clean(v: &str) -> Option<String> {
    let v = v.trim().to_ascii_lowercase();
    (!v.is_empty()).then_some(v)
}

impl OwnershipRules {
    /// Decide owner and environment of a GPU.
    pub fn decide(&self, g: &GpuFacts) -> Ownership {
        let mut team: Option<(String, String)> = None;
        let mut env: Option<(String, String)> = None;
        for a in &self.assignments {
            let hit = if a.target.starts_with("GPU-") || a.target.starts_with("MIG-") {
                a.target == g.uuid
            } else {
                g.host.is_some_and(|h| glob_match(&a.target, h))
            };
            if !hit {
                continue;
            }
            let why = format!("assignment {} (`{}`)", a.at, a.target);
            if team.is_none() {
                team = a.team.as_deref().and_then(clean).map(|t| (t, why.clone()));
            }
            if env.is_none() {
                env = a.env.as_deref().and_then(clean).map(|e| (e, why.clone()));
            }
        }
        for (i, r) in self.rules.iter().enumerate() {
            if team.is_some() && env.is_some() {
                break;
            }
            let mut matched = Vec::new();
            let all = r.when.iter().all(|(attr, pattern)| match g.get(attr) {
                Some(v) if glob_match(pattern, v) => {
                    matched.push(g.evidence(attr, v));
                    true
                }
                _ => false,
            });
            if !all {
                continue;
            }
            let label = match &r.name {
                Some(n) => format!("rule {} `{n}`", i + 1),
                None => format!("rule {}", i + 1),
            };
            let pick = |s: &Option<Setting>,
                        matched: &[(String, Option<String>)]|
             -> Option<(String, String)> {
                let (value, from) = match s.as_ref()? {
                    Setting::Name(n) => (clean(n)?, None),
                    Setting::From(a) => {
                        let v = g.get(a)?;
                        (clean(v)?, Some(g.evidence(a, v)))
                    }
                };
                let mut why: Vec<(String, Option<String>)> = matched.to_vec();
                why.extend(from.filter(|f| !matched.contains(f)));
                let why = join_evidence(&why);
                let why = if why.is_empty() {
                    label.clone()
                } else {
                    format!("{label}: {}", why.join(", "))
                };
                Some((value, why))
            };
            if team.is_none() {
                team = pick(&r.team, &matched);
            }
            if env.is_none() {
                env = pick(&r.env, &matched);
            }
        }
        for (attr, is_team) in label_rules() {
            let slot = if is_team { &mut team } else { &mut env };
            if slot.is_some() {
                continue;
            }
            if let Some(raw) = g.get(&attr) {
                let Some(v) = clean(raw) else { continue };
                let Attr::Label(k) = &attr else { continue };
                let from = g.provenance(&attr, raw);
                *slot = Some((
                    v.clone(),
                    format!(
                        "label `{k}={v}`{}",
                        from.unwrap_or_else(|| " on the GPU record".into())
                    ),
                ));
            }
        }
        let owner_part = match &team {
            Some((t, why)) => format!("owner: {t} — {why}"),
            None => format!("owner: {UNOWNED} — no `team` label and no rule places it"),
        };
        let env_part = match &env {
            Some((e, why)) => format!("env: {e} — {why}"),
            None => format!("env: {UNKNOWN} — no `env` label and no rule sets it"),
        };
        Ownership {
            team: team.map(|t| t.0).unwrap_or_else(|| UNOWNED.to_string()),
            env: env.map(|e| e.0).unwrap_or_else(|| UNKNOWN.to_string()),
            reason: format!(
                "{owner_part}; {env_part}; GPU first reported by source {}",
                g.source
            ),
        }
    }
}

/// `cluster `rdu-1`, host `dgx-2` (from source agent, seen …)`: where every value came from
/// the same report, it is said once at the end; otherwise after each value.
fn join_evidence(items: &[(String, Option<String>)]) -> Vec<String> {
    let shared = items
        .first()
        .and_then(|f| f.1.as_ref())
        .filter(|p| items.iter().all(|i| i.1.as_ref() == Some(*p)));
    match shared {
        Some(p) if items.len() > 1 => {
            let mut out: Vec<String> = items.iter().map(|i| i.0.clone()).collect();
            if let Some(last) = out.last_mut() {
                last.push_str(p);
            }
            out
        }
        _ => items
            .iter()
            .map(|(t, p)| format!("{t}{}", p.as_deref().unwrap_or_default()))
            .collect(),
    }
}

/// Read an assignments file: a header `target,team,env` (or `uuid`/`host` for `target`), then
/// one line per GPU or host. Bad lines are named and skipped; the rest is kept.
pub fn parse_assignments(name: &str, text: &str) -> (Vec<Assignment>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(text.as_bytes());
    let header: Vec<String> = match reader.headers() {
        Ok(h) => h.iter().map(|s| s.to_ascii_lowercase()).collect(),
        Err(e) => return (out, vec![format!("{name}: cannot read the header: {e}")]),
    };
    let col = |names: &[&str]| header.iter().position(|h| names.contains(&h.as_str()));
    let (Some(target), team, env) = (
        col(&["target", "uuid", "host", "gpu", "gpu_or_host"]),
        col(&["team"]),
        col(&["env", "environment"]),
    ) else {
        return (
            out,
            vec![format!(
                "{name}:1: the header needs a `target` column (a GPU UUID or a host), and `team` \
                 and/or `env`; got `{}`",
                header.join(",")
            )],
        );
    };
    for (i, row) in reader.records().enumerate() {
        let line = i + 2;
        let row = match row {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{name}:{line}: {e}"));
                continue;
            }
        };
        let get = |c: Option<usize>| {
            c.and_then(|c| row.get(c))
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(String::from)
        };
        let Some(t) = get(Some(target)) else {
            problems.push(format!(
                "{name}:{line}: target: empty; write a GPU UUID or a host"
            ));
            continue;
        };
        let (team, env) = (get(team), get(env));
        if team.is_none() && env.is_none() {
            problems.push(format!("{name}:{line}: `{t}` sets neither team nor env"));
            continue;
        }
        out.push(Assignment {
            target: t,
            team,
            env,
            at: format!("{name}:{line}"),
        });
    }
    (out, problems)
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

    fn facts<'a>(labels: &'a BTreeMap<String, String>, host: &'a str) -> GpuFacts<'a> {
        GpuFacts {
            uuid: "GPU-1",
            labels,
            host: Some(host),
            cluster: Some("rdu-ocp-1"),
            cloud: Some("aws"),
            region: None,
            instance_type: Some("p5.48xlarge"),
            model: "NVIDIA H100 80GB HBM3",
            source: "rdu-k8s",
            seen: None,
        }
    }

    /// The built-in label rules alone.
    fn derive_ownership(labels: &BTreeMap<String, String>, source: &str) -> Ownership {
        OwnershipRules::default().decide(&GpuFacts {
            source,
            host: None,
            cluster: None,
            ..facts(labels, "")
        })
    }

    #[test]
    fn labels_decide_with_a_reason() {
        let o = derive_ownership(&labels(&[("team", "NLP"), ("env", "prod")]), "rdu-agent");
        assert_eq!((o.team.as_str(), o.env.as_str()), ("nlp", "prod"));
        assert_eq!(
            o.reason,
            "owner: nlp — label `team=nlp` on the GPU record; env: prod — label `env=prod` on \
             the GPU record; GPU first reported by source rdu-agent"
        );
    }

    #[test]
    fn missing_labels_are_named_buckets() {
        let o = derive_ownership(&labels(&[("team", " ")]), "s");
        assert_eq!((o.team.as_str(), o.env.as_str()), (UNOWNED, UNKNOWN));
        assert!(o.reason.contains("no `team` label"));
    }

    #[test]
    fn first_matching_rule_wins_and_says_why() {
        let rules = OwnershipRules {
            assignments: vec![],
            rules: vec![
                Rule {
                    name: Some("research cluster".into()),
                    when: vec![
                        (Attr::Cluster, "rdu-*".into()),
                        (Attr::Host, "dgx-*".into()),
                    ],
                    team: Some(Setting::Name("research".into())),
                    env: None,
                },
                Rule {
                    name: None,
                    when: vec![(Attr::Label("squad".into()), "*".into())],
                    team: Some(Setting::From(Attr::Label("squad".into()))),
                    env: Some(Setting::Name("prod".into())),
                },
            ],
        };
        let l = labels(&[("squad", "Vision"), ("team", "nlp")]);
        let o = rules.decide(&facts(&l, "dgx-3"));
        assert_eq!((o.team.as_str(), o.env.as_str()), ("research", "prod"));
        assert!(
            o.reason.starts_with(
                "owner: research — rule 1 `research cluster`: cluster `rdu-ocp-1`, host `dgx-3`; \
                 env: prod — rule 2: label `squad` `Vision`"
            ),
            "{}",
            o.reason
        );
        let o = rules.decide(&facts(&l, "node-9"));
        assert_eq!(o.team, "vision", "rule 2 takes the label's value");
        assert!(
            o.reason
                .starts_with("owner: vision — rule 2: label `squad` `Vision`;"),
            "{}",
            o.reason
        );
        // Nothing matches: the label rules still apply.
        let l = labels(&[("team", "nlp")]);
        let o = rules.decide(&facts(&l, "node-9"));
        assert_eq!((o.team.as_str(), o.env.as_str()), ("nlp", UNKNOWN));
    }

    #[test]
    fn assignments_come_first_and_bad_lines_are_named() {
        let (a, problems) = parse_assignments(
            "assignments.csv",
            "target,team,env\nGPU-1,infra,\ndgx-*,,lab\n,x,y\nnode-2,,\n",
        );
        assert_eq!(a.len(), 2);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("assignments.csv:4: target: empty"));
        assert!(problems[1].contains("`node-2` sets neither team nor env"));
        let rules = OwnershipRules {
            assignments: a,
            rules: vec![],
        };
        let l = labels(&[("team", "nlp"), ("env", "prod")]);
        let o = rules.decide(&facts(&l, "dgx-1"));
        assert_eq!((o.team.as_str(), o.env.as_str()), ("infra", "lab"));
        assert!(o.reason.starts_with(
            "owner: infra — assignment assignments.csv:2 (`GPU-1`); env: lab — assignment \
             assignments.csv:3 (`dgx-*`)"
        ));
        let (_, p) = parse_assignments("a.csv", "who,what\nx,y\n");
        assert!(p[0].contains("needs a `target` column"), "{p:?}");
    }

    #[test]
    fn attributes_are_named_or_refused() {
        assert_eq!(Attr::parse("label.team"), Ok(Attr::Label("team".into())));
        assert_eq!(Attr::parse("instance_type"), Ok(Attr::InstanceType));
        assert!(Attr::parse("label.")
            .unwrap_err()
            .contains("no GPU attribute"));
        assert!(Attr::parse("namespace").is_err());
    }
}
