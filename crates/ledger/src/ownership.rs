//! Ownership and environment: ordered rules, first match wins, each decision with its reason.
//!
//! The config's `[[ownership.rules]]` match on any attribute a source gives a GPU (its labels,
//! which carry Kubernetes node labels, cloud tags and pushed labels; host, cluster, cloud,
//! account, region, instance type, model, source) and on what the sources say of the workloads
//! holding it (Kubernetes namespace, pod and namespace labels and annotations, Slurm account and
//! partition), with `*`/`?` patterns, and set a team, an environment or both, either as a fixed
//! name or taken from an attribute. Explicit assignments (a CSV of GPU UUID or host → team, env)
//! come first; the built-in label rules (`team`, then `env` / `environment` labels) come last,
//! so a fleet without rules behaves as before. What no rule places is `unowned` / `unknown`
//! (BRIEF section 4). Team and environment are decided apart: the first rule that sets each
//! wins. A rule on workload attributes is tried on each holder in turn; when holders would
//! place the GPU differently, the first holder wins and the others are named in the reason.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpuledger_model::{WorkloadContext, UNKNOWN, UNOWNED};
use serde::{Deserialize, Serialize};

use crate::facts::Seen;
pub use crate::facts::{Attr, ATTRIBUTE_NAMES};
use gpuledger_model::glob_match;

/// Who owns a GPU, in which environment, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub team: String,
    pub env: String,
    pub reason: String,
}

/// A workload holding a GPU (or one of its MIG instances), as ownership rules see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// `namespace/pod`, a Slurm job ID, ...
    pub workload: String,
    /// `pod`, `slurm_job`, ...
    pub kind: String,
    pub source: String,
    pub start: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<DateTime<Utc>>,
    #[serde(default)]
    pub context: WorkloadContext,
}

/// The workloads holding a GPU at `t` (unix seconds), from `allocations` (every allocation
/// of the GPU and its MIG instances, as holders): those running then, oldest first, one per
/// workload (the same pod on two MIG instances or from two sources holds once); when none
/// is, the last one to have started by `t`, so a GPU stays with its last holder between jobs.
/// `t = i64::MAX` gives the holders now.
pub fn holders_at(allocations: &[Holder], t: i64) -> Vec<Holder> {
    let mut sorted: Vec<&Holder> = allocations
        .iter()
        .filter(|h| h.start.timestamp() <= t)
        .collect();
    sorted.sort_by(|a, b| (a.start, &a.workload).cmp(&(b.start, &b.workload)));
    let mut out: Vec<Holder> = Vec::new();
    for h in &sorted {
        let running = h.end.is_none_or(|e| e.timestamp() > t);
        if running && !out.iter().any(|o| o.workload == h.workload) {
            out.push((*h).clone());
        }
    }
    if out.is_empty() {
        if let Some(last) = sorted
            .iter()
            .max_by(|a, b| (a.start, a.end, &a.workload).cmp(&(b.start, b.end, &b.workload)))
        {
            out.push((*last).clone());
        }
    }
    out
}

impl Holder {
    fn get(&self, a: &Attr) -> Option<&str> {
        let c = &self.context;
        match a {
            Attr::Namespace => c.namespace.as_deref(),
            Attr::PodLabel(k) => c.pod_labels.get(k).map(String::as_str),
            Attr::PodAnnotation(k) => c.pod_annotations.get(k).map(String::as_str),
            Attr::NamespaceLabel(k) => c.namespace_labels.get(k).map(String::as_str),
            Attr::NamespaceAnnotation(k) => c.namespace_annotations.get(k).map(String::as_str),
            Attr::SlurmAccount => c.slurm_account.as_deref(),
            Attr::SlurmPartition => c.slurm_partition.as_deref(),
            _ => None,
        }
    }

    /// ` (held by pod nlp-prod/llm-0 on rdu-ocp-1, from source rdu-k8s, since …)`.
    fn provenance(&self, cluster: Option<&str>) -> String {
        let kind = match self.kind.as_str() {
            "slurm_job" => "Slurm job",
            k => k,
        };
        let on = cluster.map(|c| format!(" on {c}")).unwrap_or_default();
        let until = match self.end {
            Some(e) => format!(" to {}", e.format("%Y-%m-%d %H:%M UTC")),
            None => String::new(),
        };
        format!(
            " (held by {kind} {}{on}, from source {}, {}{until})",
            self.workload,
            self.source,
            self.start.format(if self.end.is_some() {
                "from %Y-%m-%d %H:%M UTC"
            } else {
                "since %Y-%m-%d %H:%M UTC"
            }),
        )
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
    pub account: Option<&'a str>,
    /// Which source gave each attribute its value, and when it last reported it.
    pub seen: Option<&'a BTreeMap<String, Seen>>,
    /// The workloads holding the GPU now (or, when none does, the last one that did), oldest
    /// first: what rules on workload attributes read.
    pub holders: &'a [Holder],
}

impl GpuFacts<'_> {
    /// `label `team` `nlp``, and where the value came from when known: ` (from source rdu-k8s,
    /// seen 2026-12-02 11:02 UTC)` for a GPU attribute, ` (held by pod …)` for a workload's.
    fn evidence(&self, a: &Attr, v: &str, h: Option<&Holder>) -> (String, Option<String>) {
        let what = match (a, h) {
            (Attr::NamespaceLabel(_) | Attr::NamespaceAnnotation(_), Some(h)) => {
                match (&h.context.namespace, self.cluster) {
                    (Some(ns), Some(c)) => format!("{} `{v}` on {c}/{ns}", a.name()),
                    (Some(ns), None) => format!("{} `{v}` on {ns}", a.name()),
                    _ => format!("{} `{v}`", a.name()),
                }
            }
            _ => format!("{} `{v}`", a.name()),
        };
        let from = match h {
            Some(h) if a.of_workload() => Some(h.provenance(self.cluster)),
            _ => self.provenance(a, v),
        };
        (what, from)
    }

    /// ` (from source rdu-k8s, seen 2026-12-02 11:02 UTC)`, when the store knows it.
    /// `, sheet `inventory.csv` row 4` when label `key` came from an inventory sheet: the
    /// source that gave it also gave the `sheet` and `sheet_row` labels.
    fn sheet_row(&self, key: &str) -> Option<String> {
        let seen = self.seen?;
        let by = |k: &str| {
            seen.get(&Attr::Label(k.to_string()).seen_key()?)
                .map(|s| &s.source)
        };
        let (sheet, row) = (self.labels.get("sheet")?, self.labels.get("sheet_row")?);
        (by(key)? == by("sheet_row")?).then(|| format!(", sheet `{sheet}` row {row}"))
    }

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

    /// An attribute's value: a GPU attribute from the GPU, a workload attribute from `holder`.
    fn get<'h>(&'h self, a: &Attr, holder: Option<&'h Holder>) -> Option<&'h str> {
        match a {
            Attr::Label(k) => self.labels.get(k).map(String::as_str),
            Attr::Host => self.host,
            Attr::Cluster => self.cluster,
            Attr::Cloud => self.cloud,
            Attr::Account => self.account,
            Attr::Region => self.region,
            Attr::InstanceType => self.instance_type,
            Attr::Model => Some(self.model),
            Attr::Source => Some(self.source),
            Attr::Uuid => Some(self.uuid),
            w => holder.and_then(|h| h.get(w)),
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

impl Rule {
    /// Whether the rule reads anything of a workload holding the GPU.
    pub fn reads_workloads(&self) -> bool {
        self.when.iter().any(|(a, _)| a.of_workload())
            || [&self.team, &self.env]
                .into_iter()
                .any(|s| matches!(s, Some(Setting::From(a)) if a.of_workload()))
    }
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

impl OwnershipRules {
    /// Whether any rule reads workload attributes (then a GPU's holders can change its owner).
    pub fn reads_workloads(&self) -> bool {
        self.rules.iter().any(Rule::reads_workloads)
    }
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
            let label = match &r.name {
                Some(n) => format!("rule {} `{n}`", i + 1),
                None => format!("rule {}", i + 1),
            };
            // A rule on workload attributes is tried on each holder; any other rule once.
            let candidates: Vec<Option<&Holder>> = if r.reads_workloads() {
                g.holders.iter().map(Some).collect()
            } else {
                vec![None]
            };
            let mut team_hits: Vec<(String, String, Option<&Holder>)> = Vec::new();
            let mut env_hits: Vec<(String, String, Option<&Holder>)> = Vec::new();
            for h in candidates {
                let mut matched = Vec::new();
                let all = r.when.iter().all(|(attr, pattern)| match g.get(attr, h) {
                    Some(v) if glob_match(pattern, v) => {
                        matched.push(g.evidence(attr, v, h));
                        true
                    }
                    _ => false,
                });
                if !all {
                    continue;
                }
                let pick = |s: &Option<Setting>| -> Option<(String, String, Option<&Holder>)> {
                    let (value, from) = match s.as_ref()? {
                        Setting::Name(n) => (clean(n)?, None),
                        Setting::From(a) => {
                            let v = g.get(a, h)?;
                            (clean(v)?, Some(g.evidence(a, v, h)))
                        }
                    };
                    let mut why: Vec<(String, Option<String>)> = matched.clone();
                    why.extend(from.filter(|f| !matched.contains(f)));
                    let why = join_evidence(&why);
                    let why = if why.is_empty() {
                        label.clone()
                    } else {
                        format!("{label}: {}", why.join(", "))
                    };
                    Some((value, why, h))
                };
                team_hits.extend(pick(&r.team));
                env_hits.extend(pick(&r.env));
            }
            if team.is_none() {
                team = first_hit(team_hits);
            }
            if env.is_none() {
                env = first_hit(env_hits);
            }
        }
        for (attr, is_team) in label_rules() {
            let slot = if is_team { &mut team } else { &mut env };
            if slot.is_some() {
                continue;
            }
            if let Some(raw) = g.get(&attr, None) {
                let Some(v) = clean(raw) else { continue };
                let Attr::Label(k) = &attr else { continue };
                let from = g.provenance(&attr, raw);
                *slot = Some((
                    v.clone(),
                    format!(
                        "label `{k}={v}`{}{}",
                        from.unwrap_or_else(|| " on the GPU record".into()),
                        g.sheet_row(k).unwrap_or_default()
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

/// The first holder's placement; holders that the same rule would place elsewhere are named,
/// so a conflict between workloads is shown, not hidden.
fn first_hit(hits: Vec<(String, String, Option<&Holder>)>) -> Option<(String, String)> {
    let mut hits = hits.into_iter();
    let (value, mut why, _) = hits.next()?;
    let others: Vec<String> = hits
        .filter(|(v, ..)| *v != value)
        .filter_map(|(v, _, h)| {
            h.map(|h| format!("{} {} would place it in {v}", h.kind, h.workload))
        })
        .collect();
    if !others.is_empty() {
        why.push_str(&format!(
            " (conflict: {}; the earliest holder wins)",
            others.join(", ")
        ));
    }
    Some((value, why))
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
            account: Some("123456789012"),
            seen: None,
            holders: &[],
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

    /// A team from an inventory sheet names the sheet and row; a team another source gave
    /// does not, even on a GPU the sheet also lists.
    #[test]
    fn a_sheet_team_names_its_file_and_row() {
        use chrono::TimeZone;
        let l = labels(&[("team", "vision"), ("sheet", "inv.csv"), ("sheet_row", "4")]);
        let at = chrono::Utc.with_ymd_and_hms(2026, 12, 2, 8, 0, 0).unwrap();
        let seen_from = |team_source: &str| -> BTreeMap<String, Seen> {
            [
                ("team", "vision", team_source),
                ("sheet", "inv.csv", "sheet:inv.csv"),
                ("sheet_row", "4", "sheet:inv.csv"),
            ]
            .into_iter()
            .map(|(k, v, src)| {
                (
                    format!("label.{k}"),
                    Seen {
                        value: v.into(),
                        source: src.into(),
                        at,
                    },
                )
            })
            .collect()
        };
        let decide = |seen: &BTreeMap<String, Seen>| {
            OwnershipRules::default().decide(&GpuFacts {
                seen: Some(seen),
                ..facts(&l, "dgx-1")
            })
        };
        let o = decide(&seen_from("sheet:inv.csv"));
        assert!(
            o.reason.starts_with(
                "owner: vision — label `team=vision` (from source sheet:inv.csv, seen 2026-12-02 \
                 08:00 UTC), sheet `inv.csv` row 4;"
            ),
            "{}",
            o.reason
        );
        let o = decide(&seen_from("agent-b01"));
        assert!(!o.reason.contains("row 4"), "{}", o.reason);
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
            .contains("no attribute a rule can read"));
        assert_eq!(Attr::parse("namespace"), Ok(Attr::Namespace));
        assert_eq!(
            Attr::parse("namespace.label.team"),
            Ok(Attr::NamespaceLabel("team".into()))
        );
        assert_eq!(Attr::parse("slurm.partition"), Ok(Attr::SlurmPartition));
        assert!(Attr::parse("pod.label.").is_err());
        assert!(Attr::parse("kubernetes_namespace")
            .unwrap_err()
            .contains("`kubernetes_namespace` is no attribute a rule can read; use label.<key>"));
    }

    fn holder(workload: &str, start: &str, ctx: WorkloadContext) -> Holder {
        Holder {
            workload: workload.into(),
            kind: "pod".into(),
            source: "rdu-k8s".into(),
            start: start.parse().unwrap(),
            end: None,
            context: ctx,
        }
    }

    fn ns(name: &str, labels: &[(&str, &str)]) -> WorkloadContext {
        WorkloadContext {
            namespace: Some(name.into()),
            namespace_labels: super::tests::labels(labels),
            ..Default::default()
        }
    }

    /// A rule on the namespace's label places the GPU by the pod holding it, and says which
    /// namespace on which cluster, from which source, since when.
    #[test]
    fn workload_rules_place_a_gpu_by_its_holder() {
        let rules = OwnershipRules {
            assignments: vec![],
            rules: vec![
                Rule {
                    name: Some("slurm".into()),
                    when: vec![(Attr::SlurmPartition, "a100*".into())],
                    team: Some(Setting::From(Attr::SlurmAccount)),
                    env: Some(Setting::Name("research".into())),
                },
                Rule {
                    name: Some("namespace team".into()),
                    when: vec![(Attr::Namespace, "*-prod".into())],
                    team: Some(Setting::From(Attr::NamespaceLabel("team".into()))),
                    env: Some(Setting::Name("prod".into())),
                },
            ],
        };
        assert!(rules.reads_workloads());
        let none = labels(&[]);
        let held = [holder(
            "nlp-prod/llm-ft-0",
            "2026-12-02T08:00:00Z",
            ns("nlp-prod", &[("team", "NLP")]),
        )];
        let o = rules.decide(&GpuFacts {
            holders: &held,
            ..facts(&none, "node-1")
        });
        assert_eq!((o.team.as_str(), o.env.as_str()), ("nlp", "prod"));
        assert!(
            o.reason.starts_with(
                "owner: nlp — rule 2 `namespace team`: namespace `nlp-prod`, namespace label \
                 `team` `NLP` on rdu-ocp-1/nlp-prod (held by pod nlp-prod/llm-ft-0 on \
                 rdu-ocp-1, from source rdu-k8s, since 2026-12-02 08:00 UTC); env: prod"
            ),
            "{}",
            o.reason
        );
        // No holder: the workload rules cannot apply, and the GPU is unowned.
        let o = rules.decide(&facts(&none, "node-1"));
        assert_eq!(o.team, UNOWNED);

        // Time-slicing: two pods of different namespaces. The earliest wins; the other is named.
        let held = [
            holder(
                "nlp-prod/a",
                "2026-12-02T08:00:00Z",
                ns("nlp-prod", &[("team", "nlp")]),
            ),
            holder(
                "vision-prod/b",
                "2026-12-02T09:00:00Z",
                ns("vision-prod", &[("team", "vision")]),
            ),
        ];
        let o = rules.decide(&GpuFacts {
            holders: &held,
            ..facts(&none, "node-1")
        });
        assert_eq!(o.team, "nlp");
        assert!(
            o.reason.contains(
                "(conflict: pod vision-prod/b would place it in vision; the earliest holder wins)"
            ),
            "{}",
            o.reason
        );

        // A Slurm job's account and partition.
        let job = [Holder {
            kind: "slurm_job".into(),
            ..holder(
                "rdu-slurm/81234",
                "2026-12-01T22:00:00Z",
                WorkloadContext {
                    slurm_account: Some("speech".into()),
                    slurm_partition: Some("a100-long".into()),
                    ..Default::default()
                },
            )
        }];
        let o = rules.decide(&GpuFacts {
            holders: &job,
            ..facts(&none, "node-1")
        });
        assert_eq!((o.team.as_str(), o.env.as_str()), ("speech", "research"));
        assert!(
            o.reason.starts_with(
                "owner: speech — rule 1 `slurm`: Slurm partition `a100-long`, Slurm account \
                 `speech` (held by Slurm job rdu-slurm/81234 on rdu-ocp-1, from source rdu-k8s, \
                 since 2026-12-01 22:00 UTC)"
            ),
            "{}",
            o.reason
        );
    }

    #[test]
    fn holders_are_the_running_workloads_else_the_last_one() {
        let t = |s: &str| s.parse::<DateTime<Utc>>().unwrap().timestamp();
        let a = Holder {
            end: Some("2026-12-02T12:00:00Z".parse().unwrap()),
            ..holder("ns/a", "2026-12-02T08:00:00Z", WorkloadContext::default())
        };
        let b = holder("ns/b", "2026-12-02T09:00:00Z", WorkloadContext::default());
        let a_again = Holder {
            source: "other".into(),
            ..a.clone()
        };
        let all = [b.clone(), a.clone(), a_again];
        let names = |v: Vec<Holder>| v.into_iter().map(|h| h.workload).collect::<Vec<_>>();
        assert_eq!(
            names(holders_at(&all, t("2026-12-02T07:00:00Z"))),
            Vec::<String>::new()
        );
        assert_eq!(names(holders_at(&all, t("2026-12-02T08:30:00Z"))), ["ns/a"]);
        assert_eq!(
            names(holders_at(&all, t("2026-12-02T10:00:00Z"))),
            ["ns/a", "ns/b"],
            "oldest first, once each"
        );
        assert_eq!(names(holders_at(&all, t("2026-12-02T12:00:00Z"))), ["ns/b"]);
        assert_eq!(names(holders_at(&all, i64::MAX)), ["ns/b"]);
        // Nobody running: the last to start stays.
        assert_eq!(names(holders_at(&[a], i64::MAX)), ["ns/a"]);
    }

    #[test]
    fn the_cloud_account_is_a_gpu_attribute() {
        let rules = OwnershipRules {
            assignments: vec![],
            rules: vec![Rule {
                name: None,
                when: vec![(Attr::Account, "1234*".into())],
                team: Some(Setting::Name("platform".into())),
                env: None,
            }],
        };
        assert!(!rules.reads_workloads());
        let none = labels(&[]);
        let o = rules.decide(&facts(&none, "n"));
        assert!(
            o.reason
                .starts_with("owner: platform — rule 1: account `123456789012`;"),
            "{}",
            o.reason
        );
    }
}
