//! The store test suite. Every test runs twice: on SQLite (a fresh file) and on PostgreSQL (a
//! fresh schema in the database named by `GPULEDGER_TEST_PG_URL`; the README's test command sets
//! it to the local server). Without that variable the PostgreSQL half says it was skipped.
//!
//! Map: `scenario_*` pins the figures of BRIEF section 4 on a fleet computed by hand; `ingest_*`
//! the push contract (idempotency, scopes, sources); `rollup_*` late data and retention;
//! `placeholder_*` identity merge.

use chrono::{DateTime, Duration, Utc};
use gpuledger_ledger::{validate_body, validate_collected, GroupBy, Settings};
use gpuledger_model::{HostGpus, SourceStatus, SummaryGroup};
use gpuledger_store::{Filters, KeptKind, Principal, Store, Window};

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn now() -> DateTime<Utc> {
    t("2026-12-02T12:00:00Z")
}

async fn sqlite() -> (Store, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    let url = format!("sqlite://{}/test.db", dir.0.display());
    (Store::open(&url, Settings::default()).await.unwrap(), dir)
}

/// `GPULEDGER_TEST_PG_URL`; unset, the PostgreSQL half of `name` is skipped, or fails when
/// `GPULEDGER_REQUIRE_POSTGRES` is set. A URL that is set but unreachable always fails.
fn pg_url(name: &str) -> Option<String> {
    let url = std::env::var("GPULEDGER_TEST_PG_URL").ok();
    if url.is_none() && std::env::var_os("GPULEDGER_REQUIRE_POSTGRES").is_some() {
        panic!("GPULEDGER_REQUIRE_POSTGRES is set but GPULEDGER_TEST_PG_URL is not (PostgreSQL half of `{name}`)");
    }
    if url.is_none() {
        eprintln!("skipped: PostgreSQL half of `{name}` (set GPULEDGER_TEST_PG_URL to run it)");
    }
    url
}

async fn postgres(name: &str) -> Option<Store> {
    let url = pg_url(name)?;
    let schema = format!("t_{}_{}", name, std::process::id());
    Store::drop_schema(&url, &schema)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} (GPULEDGER_TEST_PG_URL): {e}"));
    Some(
        Store::open_in_schema(&url, Some(&schema), Settings::default())
            .await
            .unwrap(),
    )
}

/// A throwaway directory removed on drop (kept tiny to avoid a dependency).
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "gpuledger-store-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                let (store, _dir) = super::sqlite().await;
                super::$name(store).await;
            }
            #[tokio::test]
            async fn postgres() {
                if let Some(store) = super::postgres(stringify!($name)).await {
                    super::$name(store).await;
                }
            }
        }
    )*};
}

/// Like [`both!`], for tests that open (and reopen) stores with settings of their own: each
/// gets a function that opens a store over the same database with the settings given.
macro_rules! both_reopening {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test]
            async fn sqlite() {
                let dir = tempdir::Dir::new();
                let url = format!("sqlite://{}/r.db", dir.0.display());
                super::$name(move |s| {
                    let url = url.clone();
                    Box::pin(async move { Store::open(&url, s).await.unwrap() })
                })
                .await;
            }

            #[tokio::test]
            async fn postgres() {
                let Some(url) = pg_url(stringify!($name)) else {
                    return;
                };
                let schema = format!("t_{}_{}", stringify!($name), std::process::id());
                Store::drop_schema(&url, &schema)
                    .await
                    .unwrap_or_else(|e| panic!("PostgreSQL at {url} (GPULEDGER_TEST_PG_URL): {e}"));
                super::$name(move |s| {
                    let (url, schema) = (url.clone(), schema.clone());
                    Box::pin(async move {
                        Store::open_in_schema(&url, Some(&schema), s).await.unwrap()
                    })
                })
                .await;
            }
        }
    )*};
}

both_reopening!(
    owner_history_keeps_the_past_and_reattribute_rewrites_it,
    workload_rules_follow_the_pods_holding_a_gpu,
);

both!(
    scenario_summary_matches_hand_computation,
    ingest_resend_changes_nothing,
    ingest_an_allocation_named_twice_in_a_body_keeps_the_later,
    ingest_scopes_refuse_other_teams,
    ingest_other_source_cannot_overwrite,
    ingest_unknown_gpu_samples_are_rejected_and_rest_kept,
    rollup_late_sample_rerolls_its_hour,
    rollup_retention_refuses_and_prunes_old_samples,
    placeholder_replaced_by_real_gpu_on_same_host,
    placeholder_pool_allocations_move_to_exact_gpus,
    placeholder_host_alias_files_gpus_under_the_node,
    ingest_sources_disagreeing_on_a_team_are_kept_and_shown,
    used_by_splits_shared_hours_and_sums_to_the_cost,
    sources_report_freshness,
    gpus_list_filters_and_detail,
    billing_import_is_kept_and_shown_beside_the_estimate,
    one_cloud_instance_is_one_host_whichever_source_names_it,
    a_stopped_instance_stops_counting_when_the_cloud_says,
    an_authoritative_sheet_ends_what_it_no_longer_lists,
    a_mixed_vendor_fleet_is_one_ledger,
    pool_slots_land_on_gpus_in_pci_order,
    a_schedulers_average_fills_only_the_hours_no_sample_measured,
);

fn who(source: &str, teams: Option<&[&str]>) -> Principal {
    Principal {
        source: source.into(),
        teams: teams.map(|t| t.iter().map(|s| s.to_string()).collect()),
        kind: "push".into(),
    }
}

async fn push(store: &Store, p: &Principal, json: &str) -> gpuledger_store::IngestOutcome {
    push_at(store, p, json, now()).await
}

async fn push_at(
    store: &Store,
    p: &Principal,
    json: &str,
    at: DateTime<Utc>,
) -> gpuledger_store::IngestOutcome {
    let map = gpuledger_ledger::decode_body(json.as_bytes(), None, Default::default()).unwrap();
    store
        .ingest(p, validate_body(map, at, 300), at)
        .await
        .unwrap()
}

const A: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000001";
const B: &str = "GPU-bbbbbbbb-0000-0000-0000-000000000002";
const C: &str = "GPU-cccccccc-0000-0000-0000-000000000003";
const A_MIG: &str = "MIG-aaaaaaaa-0000-0000-0000-0000000000a1";

/// The hand-computed fleet (see `docs/definitions.md` for the same figures worked out):
/// - A (nlp/prod, H100 at $12.29/h): present 00:00–05:59 on 2026-12-01 (6 h; the stale window
///   of 2 h extends each observation). Hour 00 = mean(50, 70) = 60 busy; hour 01 = 2 idle;
///   hour 02 = mean(3, 0.01×100) = 2 idle; hours 03–05 have no activity: unknown. Allocation
///   01:15–02:10 covers hours 01 and 02, both idle: 2 allocated, 2 allocated-idle.
/// - B (vision/dev, T4 at $0.35/h): present 10:00–14:59 (5 h). Hour 10 = 100 busy; hour 11 =
///   4.9 idle; hour 12 = 0.05×100 = 5.0, not below 5 %: busy; 13–14 unknown. An open
///   allocation from 11:00 covers 11–14: 4 allocated, 1 allocated-idle.
/// - C (nlp, no env, unknown model: no rate) present 20:00–21:59 (2 h), unknown, unpriced.
/// - A MIG instance of A, never counted as a GPU.
const SCENARIO: &str = r#"{
  "gpus": [
    {"uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "model": "NVIDIA H100 80GB HBM3",
     "memory_mib": 81559, "host": "node-a", "cluster": "c1", "cloud": "aws", "region": "us-east-1",
     "labels": {"team": "nlp", "env": "prod"}, "observed_at": "2026-12-01T00:00:00Z"},
    {"uuid": "MIG-aaaaaaaa-0000-0000-0000-0000000000a1", "model": "NVIDIA H100 80GB HBM3",
     "host": "node-a", "mig_parent_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001",
     "mig_profile": "1g.10gb", "labels": {"team": "nlp"}, "observed_at": "2026-12-01T00:00:00Z"},
    {"uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000002", "model": "Tesla T4", "host": "node-b",
     "cluster": "c2", "cloud": "gcp", "labels": {"team": "vision", "env": "dev"},
     "observed_at": "2026-12-01T10:00:00Z"},
    {"uuid": "GPU-cccccccc-0000-0000-0000-000000000003", "model": "Mystery GPU", "host": "node-c",
     "cluster": "c1", "cloud": "onprem", "labels": {"team": "nlp"},
     "observed_at": "2026-12-01T20:00:00Z"}
  ],
  "samples": [
    {"gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "ts": "2026-12-01T00:10:00Z", "util_pct": 50},
    {"gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "ts": "2026-12-01T00:40:00Z", "util_pct": 70},
    {"gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "ts": "2026-12-01T01:30:00Z", "util_pct": 2},
    {"gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "ts": "2026-12-01T02:10:00Z", "util_pct": 3},
    {"gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "ts": "2026-12-01T02:50:00Z", "util_pct": 80, "sm_active": 0.01},
    {"gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "ts": "2026-12-01T03:30:00Z", "power_w": 70},
    {"gpu_uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000002", "ts": "2026-12-01T10:30:00Z", "util_pct": 100},
    {"gpu_uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000002", "ts": "2026-12-01T11:30:00Z", "util_pct": 4.9},
    {"gpu_uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000002", "ts": "2026-12-01T12:30:00Z", "sm_active": 0.05}
  ],
  "allocations": [
    {"gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "start": "2026-12-01T01:15:00Z",
     "end": "2026-12-01T02:10:00Z", "workload": "nlp-prod/ft-0", "kind": "pod", "user": "alice", "team": "nlp"},
    {"gpu_uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000002", "start": "2026-12-01T11:00:00Z",
     "end": null, "workload": "12345", "kind": "slurm_job", "user": "bob", "team": "vision"}
  ]
}"#;

fn group<'a>(groups: &'a [SummaryGroup], key: &str) -> &'a SummaryGroup {
    groups
        .iter()
        .find(|g| g.key == key)
        .unwrap_or_else(|| panic!("no group {key}"))
}

fn day() -> Window {
    Window {
        from: t("2026-12-01T00:00:00Z").timestamp(),
        to: t("2026-12-02T00:00:00Z").timestamp(),
    }
}

async fn scenario_summary_matches_hand_computation(store: Store) {
    let out = push(&store, &who("hand", None), SCENARIO).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert_eq!(
        (
            out.accepted.gpus,
            out.accepted.samples,
            out.accepted.allocations
        ),
        (4, 9, 2)
    );

    // One whole day (read from day rollups) and a window whose edges are partial days (read
    // from hour rollups around a whole day) must give the same figures.
    let wide = Window {
        from: t("2026-11-30T12:00:00Z").timestamp(),
        to: t("2026-12-02T06:00:00Z").timestamp(),
    };
    for window in [day(), wide] {
        let s = store
            .summary(window, &Filters::default(), GroupBy::Team, now())
            .await
            .unwrap();
        let nlp = group(&s.groups, "nlp");
        assert_eq!(
            (
                nlp.gpus,
                nlp.gpu_hours,
                nlp.busy_hours,
                nlp.idle_hours,
                nlp.unknown_hours
            ),
            (2, 8, 1, 2, 5)
        );
        assert_eq!((nlp.allocated_hours, nlp.allocated_idle_hours), (2, 2));
        assert_eq!(nlp.avg_activity_pct, Some(21.33));
        assert_eq!((nlp.cost_usd, nlp.idle_cost_usd), (73.74, 24.58));
        assert_eq!(
            (nlp.allocated_idle_cost_usd, nlp.unpriced_gpu_hours),
            (24.58, 2)
        );
        let vision = group(&s.groups, "vision");
        assert_eq!(
            (
                vision.gpus,
                vision.gpu_hours,
                vision.busy_hours,
                vision.idle_hours,
                vision.unknown_hours
            ),
            (1, 5, 2, 1, 2)
        );
        assert_eq!(
            (vision.allocated_hours, vision.allocated_idle_hours),
            (4, 1)
        );
        assert_eq!(vision.avg_activity_pct, Some(36.63));
        assert_eq!((vision.cost_usd, vision.idle_cost_usd), (1.75, 0.35));
        let tot = &s.total;
        assert_eq!(
            (tot.gpus, tot.gpu_hours, tot.busy_hours, tot.idle_hours),
            (3, 13, 3, 3)
        );
        assert_eq!(
            (
                tot.unknown_hours,
                tot.allocated_hours,
                tot.allocated_idle_hours
            ),
            (7, 6, 3)
        );
        assert_eq!(tot.avg_activity_pct, Some(28.98));
        assert_eq!((tot.cost_usd, tot.idle_cost_usd), (75.49, 24.93));
    }

    // Inside a day: hours only.
    let part = Window {
        from: t("2026-12-01T01:00:00Z").timestamp(),
        to: t("2026-12-01T12:00:00Z").timestamp(),
    };
    let s = store
        .summary(part, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(group(&s.groups, "nlp").gpu_hours, 5);
    assert_eq!(group(&s.groups, "nlp").idle_hours, 2);
    assert_eq!(group(&s.groups, "vision").gpu_hours, 2);

    // Other groupings and filters.
    let by_env = store
        .summary(day(), &Filters::default(), GroupBy::Env, now())
        .await
        .unwrap();
    let keys: Vec<&str> = by_env.groups.iter().map(|g| g.key.as_str()).collect();
    assert_eq!(keys, ["prod", "dev", "unknown"]);
    let f = Filters {
        cloud: vec!["gcp".into(), "onprem".into()],
        ..Default::default()
    };
    let s = store
        .summary(day(), &f, GroupBy::Cluster, now())
        .await
        .unwrap();
    assert_eq!((s.total.gpus, s.total.gpu_hours), (2, 7));
    assert_eq!(group(&s.groups, "c1").unpriced_gpu_hours, 2);
}

async fn ingest_resend_changes_nothing(store: Store) {
    let first = push(&store, &who("hand", None), SCENARIO).await;
    let before = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let again = push(&store, &who("hand", None), SCENARIO).await;
    assert_eq!(again.accepted, first.accepted);
    assert_eq!(
        (
            again.duplicates.gpus,
            again.duplicates.samples,
            again.duplicates.allocations
        ),
        (4, 9, 2)
    );
    let after = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(before, after);
}

/// A body may name one allocation twice (an open pod, then its end): the later one is what is
/// stored, as if each had been its own push; and a body of more allocations than one statement
/// writes loses none of them and finds them all again when re-sent.
async fn ingest_an_allocation_named_twice_in_a_body_keeps_the_later(store: Store) {
    let p = who("hand", None);
    push(&store, &p, SCENARIO).await;
    let b_job = |end: &str| {
        format!(
            r#"{{"gpu_uuid":"{B}","start":"2026-12-01T11:00:00Z","end":{end},"workload":"12345","kind":"slurm_job","user":"bob","team":"vision"}}"#
        )
    };
    let many: Vec<String> = (0..250)
        .map(|i| {
            format!(
                r#"{{"gpu_uuid":"{A}","start":"2026-12-01T00:{:02}:{:02}Z","end":"2026-12-01T00:{:02}:{:02}Z","workload":"nlp/burst-{i}","kind":"pod","team":"nlp"}}"#,
                i / 6,
                (i % 6) * 10,
                i / 6,
                (i % 6) * 10 + 5
            )
        })
        .collect();
    let allocated = |s: &gpuledger_model::Summary| group(&s.groups, "vision").allocated_hours;
    let short = format!(
        r#"{{"gpu_uuid":"{B}","start":"2026-12-01T11:10:00Z","end":"2026-12-01T11:20:00Z","workload":"67890","kind":"slurm_job","team":"vision"}}"#
    );
    let body = format!(
        r#"{{"allocations":[{},{short},{},{short},{}]}}"#,
        b_job("null"),
        many.join(","),
        b_job(r#""2026-12-01T12:00:00Z""#)
    );
    let out = push(&store, &p, &body).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert_eq!(out.accepted.allocations, 254);
    assert_eq!(
        out.duplicates.allocations, 2,
        "the open job is the stored one, and the short job's second naming the first"
    );
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(allocated(&s), 1, "closed at 12:00: hour 11 only");
    let a = store.gpu_detail(A, day(), now()).await.unwrap().unwrap();
    assert_eq!(a.allocations.len(), 251, "ft-0 and the 250 bursts");
    let again = push(
        &store,
        &p,
        &format!(r#"{{"allocations":[{}]}}"#, many.join(",")),
    )
    .await;
    assert_eq!(
        (again.accepted.allocations, again.duplicates.allocations),
        (250, 250)
    );
    // The other way round: the open job named last is stored open again; the short job,
    // changed twice, keeps its last end.
    let body = format!(
        r#"{{"allocations":[{},{},{},{short}]}}"#,
        b_job(r#""2026-12-01T12:00:00Z""#),
        short.replace("11:20:00Z", "11:30:00Z"),
        b_job("null")
    );
    let out = push(&store, &p, &body).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(allocated(&s), 4, "open again: hours 11-14");
    let b = store.gpu_detail(B, day(), now()).await.unwrap().unwrap();
    let ends: Vec<_> = b
        .allocations
        .iter()
        .filter(|a| a.workload == "67890")
        .map(|a| a.end)
        .collect();
    assert_eq!(ends, vec![Some(t("2026-12-01T11:20:00Z"))]);
}

async fn ingest_scopes_refuse_other_teams(store: Store) {
    push(&store, &who("hand", None), SCENARIO).await;
    // A token granted nlp only may not write vision's GPU, nor samples for it.
    let nlp_only = who("hand", Some(&["nlp"]));
    let out = push(
        &store,
        &nlp_only,
        &format!(
            r#"{{"gpus":[{{"uuid":"{B}","model":"Tesla T4","labels":{{"team":"vision"}},"observed_at":"2026-12-02T11:00:00Z"}}],
                "samples":[{{"gpu_uuid":"{B}","ts":"2026-12-02T11:00:00Z","util_pct":10}}]}}"#
        ),
    )
    .await;
    assert!(out.nothing_allowed());
    assert_eq!(out.rejected.len(), 2);
    assert!(
        out.rejected[0].reason.contains("owned by team `vision`"),
        "{:?}",
        out.rejected
    );
    // Nor may it create a GPU for another team; its own team's records go through.
    let out = push(
        &store,
        &nlp_only,
        &format!(
            r#"{{"gpus":[{{"uuid":"GPU-dddd","model":"Tesla T4","labels":{{"team":"speech"}},"observed_at":"2026-12-02T11:00:00Z"}}],
                "samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T11:00:00Z","util_pct":10}}]}}"#
        ),
    )
    .await;
    assert!(!out.nothing_allowed());
    assert_eq!(out.accepted.samples, 1);
    assert_eq!(out.rejected[0].path, "gpus[0].labels.team");
}

async fn ingest_other_source_cannot_overwrite(store: Store) {
    push(&store, &who("hand", None), SCENARIO).await;
    let other = who("other", None);
    let out = push(
        &store,
        &other,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"renamed","serial":"S-1","labels":{{"team":"vision","rack":"r7"}},"observed_at":"2026-12-02T11:00:00Z"}}],
                "allocations":[{{"gpu_uuid":"{A}","start":"2026-12-01T01:15:00Z","end":null,"workload":"nlp-prod/ft-0","kind":"pod"}}]}}"#
        ),
    )
    .await;
    assert_eq!(out.accepted.gpus, 1);
    assert_eq!(out.rejected.len(), 1);
    assert!(out.rejected[0].reason.contains("reported by source `hand`"));
    let d = store.gpu_detail(A, day(), now()).await.unwrap().unwrap();
    assert_eq!(&*d.gpu.model, "NVIDIA H100 80GB HBM3");
    assert_eq!(&*d.gpu.team, "nlp");
    assert_eq!(
        d.gpu.serial.as_deref(),
        Some("S-1"),
        "gaps are filled by other sources"
    );
    assert_eq!(d.gpu.labels.get("rack").map(String::as_str), Some("r7"));
    assert_eq!(d.allocations[0].end, Some(t("2026-12-01T02:10:00Z")));
    let serial = d
        .provenance
        .iter()
        .find(|p| p.attribute == "serial")
        .unwrap();
    assert_eq!((&*serial.source, serial.value.as_str()), ("other", "S-1"));
    let model: Vec<&str> = d
        .provenance
        .iter()
        .filter(|p| p.attribute == "model")
        .map(|p| &*p.source)
        .collect();
    assert_eq!(model, ["other", "hand"]);
}

async fn ingest_unknown_gpu_samples_are_rejected_and_rest_kept(store: Store) {
    push(&store, &who("hand", None), SCENARIO).await;
    let out = push(
        &store,
        &who("hand", None),
        &format!(
            r#"{{"samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T10:00:00Z","util_pct":10}},
                            {{"gpu_uuid":"GPU-nope","ts":"2026-12-02T10:00:00Z","util_pct":10}},
                            {{"gpu_uuid":"{A}","ts":"2026-12-02T10:01:00Z","util_pct":101}}]}}"#
        ),
    )
    .await;
    assert_eq!(out.accepted.samples, 1);
    let paths: Vec<&str> = out.rejected.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["samples[2].util_pct", "samples[1].gpu_uuid"]);
}

async fn rollup_late_sample_rerolls_its_hour(store: Store) {
    push(&store, &who("hand", None), SCENARIO).await;
    // Hour 01 of A was idle (2 %); a late sample of 90 % makes it (2 + 90) / 2 = 46: busy.
    push(
        &store,
        &who("hand", None),
        &format!(
            r#"{{"samples":[{{"gpu_uuid":"{A}","ts":"2026-12-01T01:45:00Z","util_pct":90}}]}}"#
        ),
    )
    .await;
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let nlp = group(&s.groups, "nlp");
    assert_eq!(
        (nlp.busy_hours, nlp.idle_hours, nlp.allocated_idle_hours),
        (2, 1, 1)
    );
    let d = store.gpu_detail(A, day(), now()).await.unwrap().unwrap();
    let h1 = d
        .hours
        .iter()
        .find(|h| h.hour == t("2026-12-01T01:00:00Z"))
        .unwrap();
    assert_eq!(
        (h1.samples, h1.activity_pct, h1.allocated),
        (2, Some(46.0), true)
    );
    let h3 = d
        .hours
        .iter()
        .find(|h| h.hour == t("2026-12-01T03:00:00Z"))
        .unwrap();
    assert_eq!((h3.activity_pct, h3.power_w_avg), (None, Some(70.0)));
}

async fn rollup_retention_refuses_and_prunes_old_samples(store: Store) {
    push(&store, &who("hand", None), SCENARIO).await;
    let later = now() + Duration::days(15);
    let out = push_at(
        &store,
        &who("hand", None),
        &format!(
            r#"{{"samples":[{{"gpu_uuid":"{A}","ts":"2026-12-01T05:00:00Z","util_pct":90}}]}}"#
        ),
        later,
    )
    .await;
    assert_eq!(out.accepted.samples, 0);
    assert!(out.rejected[0]
        .reason
        .contains("older than the raw-sample retention (14 days)"));
    let (raw, _) = store.prune(later.timestamp()).await.unwrap();
    assert_eq!(raw, 9);
    // Rollups outlive raw samples.
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, later)
        .await
        .unwrap();
    assert_eq!(s.total.gpu_hours, 13);
}

async fn placeholder_replaced_by_real_gpu_on_same_host(store: Store) {
    let k8s = who("k8s", None);
    let made = store
        .observe_host_gpu_count(
            &k8s,
            &HostGpus {
                host: "node-p".into(),
                count: 2,
                model: Some("NVIDIA L4".into()),
                cluster: Some("c9".into()),
                ..Default::default()
            },
            t("2026-12-01T00:00:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(made, 2);
    let gpus = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    assert_eq!(gpus.iter().filter(|g| g.placeholder).count(), 2);
    assert_eq!(gpus[0].usd_per_hour, Some(0.8048));
    // A UUID-aware source names one GPU of that host: one placeholder goes, its history moves.
    push(
        &store,
        &who("dcgm", None),
        r#"{"gpus":[{"uuid":"GPU-real-1","model":"NVIDIA L4","host":"node-p","labels":{"team":"nlp"},"observed_at":"2026-12-01T03:00:00Z"}]}"#,
    )
    .await;
    let gpus = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus.iter().filter(|g| g.placeholder).count(), 1);
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    // Real GPU: placeholder hours 00–01 plus its own 03–04; the remaining placeholder 00–01.
    assert_eq!(group(&s.groups, "nlp").gpu_hours, 4);
    assert_eq!(group(&s.groups, "unowned").gpu_hours, 2);
    // The count source reporting again keeps one placeholder, not two.
    let made = store
        .observe_host_gpu_count(
            &k8s,
            &HostGpus {
                host: "node-p".into(),
                count: 2,
                model: Some("NVIDIA L4".into()),
                ..Default::default()
            },
            t("2026-12-01T04:00:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(made, 1);
    assert_eq!(
        store
            .list_gpus(&Filters::default(), false, now())
            .await
            .unwrap()
            .len(),
        2
    );
}

/// A collector's body, validated as the server validates what its pull collectors report.
async fn collect_at(store: &Store, p: &Principal, json: &str, at: DateTime<Utc>) {
    let map = gpuledger_ledger::decode_body(json.as_bytes(), None, Default::default()).unwrap();
    let out = store
        .ingest(p, validate_collected(map, at, 300), at)
        .await
        .unwrap();
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
}

fn dec2() -> Window {
    Window {
        from: t("2026-12-02T00:00:00Z").timestamp(),
        to: t("2026-12-03T00:00:00Z").timestamp(),
    }
}

async fn workloads_on(store: &Store, uuid: &str) -> Vec<(String, String)> {
    let d = store
        .gpu_detail(uuid, dec2(), now())
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no GPU {uuid}"));
    d.allocations
        .into_iter()
        .map(|a| (a.workload, a.source))
        .collect()
}

async fn placeholder_pool_allocations_move_to_exact_gpus(store: Store) {
    let k8s = who("k8s", None);
    let dcgm = who("dcgm", None);
    let node = HostGpus {
        host: "node-q".into(),
        count: 2,
        model: Some("Tesla T4".into()),
        ..Default::default()
    };
    store
        .observe_host_gpu_count(&k8s, &node, t("2026-12-02T08:00:00Z"))
        .await
        .unwrap();
    let pod = |slot: u32, workload: &str| {
        format!(
            r#"{{"allocations":[{{"gpu_uuid":"placeholder:node-q:{slot}","start":"2026-12-02T08:00:00Z","workload":"{workload}","kind":"pod","team":"infra","owner":"Job/train"}}]}}"#
        )
    };
    // Before any UUID source: on the pool's placeholder.
    collect_at(&store, &k8s, &pod(0, "ns/p"), t("2026-12-02T08:01:00Z")).await;
    assert_eq!(
        workloads_on(&store, "placeholder:node-q:0").await,
        vec![("ns/p".to_string(), "k8s".to_string())]
    );
    // dcgm names both GPUs and sees pod ns/p on the second one.
    push_at(
        &store,
        &dcgm,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","host":"node-q","observed_at":"2026-12-02T08:05:00Z"}},
                {{"uuid":"{B}","model":"Tesla T4","host":"node-q","observed_at":"2026-12-02T08:05:00Z"}}],
               "allocations":[{{"gpu_uuid":"{B}","start":"2026-12-02T08:05:00Z","workload":"ns/p","kind":"pod"}}]}}"#
        ),
        t("2026-12-02T08:05:00Z"),
    )
    .await;
    // Absorbing the placeholder moved its allocation to A; the next report moves it to B, where
    // dcgm saw the pod, and leaves nothing on A.
    collect_at(&store, &k8s, &pod(0, "ns/p"), t("2026-12-02T08:06:00Z")).await;
    assert_eq!(workloads_on(&store, A).await, vec![]);
    let on_b = workloads_on(&store, B).await;
    assert_eq!(on_b.len(), 2, "{on_b:?}");
    assert!(on_b.contains(&("ns/p".to_string(), "k8s".to_string())));
    let d = store.gpu_detail(B, dec2(), now()).await.unwrap().unwrap();
    let k = d.allocations.iter().find(|a| *a.source == *"k8s").unwrap();
    assert_eq!(
        (k.team.as_deref(), k.owner.as_deref()),
        (Some("infra"), Some("Job/train"))
    );
    // A pod no other source saw goes to the host's GPUs in UUID order by slot.
    collect_at(&store, &k8s, &pod(1, "ns/q"), t("2026-12-02T08:07:00Z")).await;
    assert_eq!(
        workloads_on(&store, B)
            .await
            .iter()
            .filter(|w| w.0 == "ns/q")
            .count(),
        1
    );
    // The count source reporting again keeps two GPUs, no placeholder.
    store
        .observe_host_gpu_count(&k8s, &node, t("2026-12-02T08:10:00Z"))
        .await
        .unwrap();
    let gpus = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    assert_eq!(gpus.len(), 2, "{gpus:?}");
    assert!(gpus.iter().all(|g| !g.placeholder));
    // Pushes may not name placeholders.
    let map =
        gpuledger_ledger::decode_body(pod(0, "ns/x").as_bytes(), None, Default::default()).unwrap();
    let v = validate_body(map, now(), 300);
    assert_eq!(v.rejections[0].path, "allocations[0].gpu_uuid");
}

async fn placeholder_host_alias_files_gpus_under_the_node(store: Store) {
    let k8s = who("k8s", None);
    let dcgm = who("dcgm", None);
    // dcgm first: its GPUs carry the exporter pod's name as their host.
    push_at(
        &store,
        &dcgm,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","host":"nvidia-dcgm-exporter-s228n","observed_at":"2026-12-02T08:00:00Z"}}]}}"#
        ),
        t("2026-12-02T08:00:00Z"),
    )
    .await;
    store
        .observe_host_alias(
            &k8s,
            "nvidia-dcgm-exporter-s228n",
            "node-t4",
            t("2026-12-02T08:01:00Z"),
        )
        .await
        .unwrap();
    store
        .observe_host_gpu_count(
            &k8s,
            &HostGpus {
                host: "node-t4".into(),
                count: 2,
                model: Some("Tesla T4".into()),
                cluster: Some("qa".into()),
                ..Default::default()
            },
            t("2026-12-02T08:01:00Z"),
        )
        .await
        .unwrap();
    // Then dcgm names the second GPU, still under the exporter pod's name.
    push_at(
        &store,
        &dcgm,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","host":"nvidia-dcgm-exporter-s228n","observed_at":"2026-12-02T08:02:00Z"}},
                {{"uuid":"{B}","model":"Tesla T4","host":"nvidia-dcgm-exporter-s228n","observed_at":"2026-12-02T08:02:00Z"}}]}}"#
        ),
        t("2026-12-02T08:02:00Z"),
    )
    .await;
    let gpus = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    assert_eq!(gpus.len(), 2, "one placeholder was absorbed: {gpus:?}");
    assert!(gpus
        .iter()
        .all(|g| !g.placeholder && g.host.as_deref() == Some("node-t4")));
    // The count source filled the gap it knows: the cluster.
    assert!(
        gpus.iter().all(|g| g.cluster.as_deref() == Some("qa")),
        "{gpus:?}"
    );
}

async fn ingest_sources_disagreeing_on_a_team_are_kept_and_shown(store: Store) {
    push(
        &store,
        &who("k8s", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T10:00:00Z"}}]}}"#
        ),
    )
    .await;
    push(
        &store,
        &who("cmdb", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","labels":{{"team":"vision","env":"prod"}},"observed_at":"2026-12-02T11:00:00Z"}}]}}"#
        ),
    )
    .await;
    let window = Window {
        from: t("2026-12-02T00:00:00Z").timestamp(),
        to: t("2026-12-03T00:00:00Z").timestamp(),
    };
    let d = store.gpu_detail(A, window, now()).await.unwrap().unwrap();
    assert_eq!(&*d.gpu.team, "nlp", "the primary source's label is kept");
    assert_eq!(&*d.gpu.env, "prod", "the other source filled the gap");
    assert_eq!(d.conflicts.len(), 1, "{:?}", d.conflicts);
    let c = &d.conflicts[0];
    assert_eq!(c.attribute, "labels.team");
    let said: Vec<(&str, &str)> = c
        .values
        .iter()
        .map(|v| (&*v.source, v.value.as_str()))
        .collect();
    assert!(
        said.contains(&("k8s", "team=nlp")) && said.contains(&("cmdb", "team=vision")),
        "{said:?}"
    );
}

async fn used_by_splits_shared_hours_and_sums_to_the_cost(store: Store) {
    // A time-sliced T4 ($0.35/h) present 08–11, pods of nlp (08–10) and vision (09–) on it,
    // the same vision pod reported twice (two sources), and a MIG GPU whose instance holds
    // an nlp pod; an L4 nobody holds.
    let p = who("lab", None);
    push(
        &store,
        &p,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","observed_at":"2026-12-02T08:00:00Z"}},
                {{"uuid":"{B}","model":"NVIDIA L4","observed_at":"2026-12-02T08:00:00Z"}},
                {{"uuid":"{C}","model":"Tesla T4","observed_at":"2026-12-02T08:00:00Z"}},
                {{"uuid":"{A_MIG}","model":"Tesla T4 MIG","mig_parent_uuid":"{C}","observed_at":"2026-12-02T08:00:00Z"}},
                {{"uuid":"{A}","model":"Tesla T4","observed_at":"2026-12-02T10:00:00Z"}}],
              "allocations":[
                {{"gpu_uuid":"{A}","start":"2026-12-02T08:00:00Z","end":"2026-12-02T10:00:00Z","workload":"nlp/a","kind":"pod","team":"NLP"}},
                {{"gpu_uuid":"{A}","start":"2026-12-02T09:00:00Z","workload":"vision/b","kind":"pod","team":"vision"}},
                {{"gpu_uuid":"{A}","start":"2026-12-02T09:10:00Z","workload":"vision/b","kind":"pod","team":"vision"}},
                {{"gpu_uuid":"{A_MIG}","start":"2026-12-02T08:30:00Z","workload":"nlp/c","kind":"pod"}}]}}"#
        ),
    )
    .await;
    let window = Window {
        from: t("2026-12-02T08:00:00Z").timestamp(),
        to: t("2026-12-02T12:00:00Z").timestamp(),
    };
    let rows = store
        .used_by_cost(window, &Filters::default(), now())
        .await
        .unwrap();
    let get = |team: &str| {
        rows.iter()
            .find(|r| r.team == team)
            .map(|r| (r.gpu_hours, (r.cost_usd * 1e6).round() / 1e6))
            .unwrap_or_else(|| panic!("{team}: {rows:?}"))
    };
    // A: 08 nlp; 09 nlp ½ + vision ½; 10, 11 vision. C: 08, 09 the unnamed team's pod.
    assert_eq!(get("nlp"), (1.5, 0.525));
    assert_eq!(get("vision"), (2.5, 0.875));
    assert_eq!(get("unowned"), (2.0, 0.7), "the MIG pod names no team");
    // B, and nothing else: 08 and 09 at $0.8048.
    assert_eq!(get("unallocated"), (2.0, 1.6096));
    let total: f64 = rows.iter().map(|r| r.cost_usd).sum();
    assert!(
        (total - (4.0 * 0.35 + 2.0 * 0.35 + 2.0 * 0.8048)).abs() < 1e-9,
        "{rows:?}"
    );
}

async fn sources_report_freshness(store: Store) {
    push_at(
        &store,
        &who("hand", None),
        SCENARIO,
        t("2026-12-02T09:00:00Z"),
    )
    .await;
    push(
        &store,
        &who("fresh", None),
        r#"{"gpus":[{"uuid":"GPU-f","model":"NVIDIA L4","observed_at":"2026-12-02T11:59:00Z"}]}"#,
    )
    .await;
    push(
        &store,
        &who("broken", None),
        r#"{"samples":[{"gpu_uuid":"GPU-zz","ts":"2026-12-02T11:00:00Z"}]}"#,
    )
    .await;
    let s = store.sources(now()).await.unwrap();
    let by = |n: &str| s.iter().find(|x| x.name == n).unwrap().clone();
    assert_eq!(
        (by("hand").status, by("hand").lag_secs, by("hand").gpus),
        (SourceStatus::Stale, Some(3 * 3600), 3)
    );
    assert_eq!(by("fresh").status, SourceStatus::Ok);
    assert_eq!(by("broken").status, SourceStatus::Never);
    assert!(by("broken")
        .last_error
        .unwrap()
        .contains("no GPU GPU-zz has been reported"));
}

async fn gpus_list_filters_and_detail(store: Store) {
    push(&store, &who("hand", None), SCENARIO).await;
    let all = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    assert_eq!(all.len(), 3);
    let a = all.iter().find(|g| *g.uuid == *A).unwrap();
    assert_eq!(a.state, gpuledger_model::GpuState::Missing);
    assert_eq!((&*a.team, &*a.env), ("nlp", "prod"));
    assert!(
        a.owner_reason.starts_with("owner: nlp — label `team=nlp`"),
        "{}",
        a.owner_reason
    );
    assert_eq!(&*a.rate_origin, "built-in default (H100)");
    let with_mig = store
        .list_gpus(&Filters::default(), true, now())
        .await
        .unwrap();
    assert_eq!(with_mig.len(), 4);
    // Read a page at a time, the list is the same, in the same order, and each page says how
    // many there are in all.
    for size in 1..=5 {
        let mut paged = Vec::new();
        loop {
            let from = paged.len();
            let (total, page) = store
                .list_gpus_page(
                    &Filters::default(),
                    true,
                    |n| from.min(n)..(from + size).min(n),
                    now(),
                )
                .await
                .unwrap();
            assert_eq!(total, 4);
            if page.is_empty() {
                break;
            }
            paged.extend(page);
        }
        assert_eq!(paged, with_mig, "pages of {size}");
    }
    let f = Filters {
        team: vec!["vision".into()],
        ..Default::default()
    };
    let v = store.list_gpus(&f, false, now()).await.unwrap();
    assert_eq!(v.iter().map(|g| &*g.uuid).collect::<Vec<_>>(), [B]);
    // A page of a filtered list counts the filtered list.
    let (total, page) = store
        .list_gpus_page(&f, false, |n| n..n, now())
        .await
        .unwrap();
    assert_eq!((total, page.len()), (1, 0));
    let f = Filters {
        model: vec!["Mystery GPU".into()],
        env: vec!["unknown".into()],
        ..Default::default()
    };
    assert_eq!(
        &*store.list_gpus(&f, false, now()).await.unwrap()[0].uuid,
        C
    );
    let d = store.gpu_detail(A, day(), now()).await.unwrap().unwrap();
    assert_eq!(d.mig_children, [A_MIG]);
    assert_eq!(d.hours.len(), 6);
    assert_eq!(d.allocations.len(), 1);
    assert!(store
        .gpu_detail("GPU-none", day(), now())
        .await
        .unwrap()
        .is_none());
}

/// Ownership rules from the config decide owner and environment on ingest, with the rule named.
#[tokio::test]
async fn ownership_rules_place_gpus_with_their_reason() {
    use gpuledger_ledger::ownership::{Attr, Rule, Setting};
    let dir = tempdir::Dir::new();
    let mut settings = Settings::default();
    settings.ownership.rules.push(Rule {
        name: Some("rdu research".into()),
        when: vec![
            (Attr::Cluster, "rdu-*".into()),
            (Attr::Host, "dgx-*".into()),
        ],
        team: Some(Setting::Name("research".into())),
        env: Some(Setting::From(Attr::Label("stage".into()))),
    });
    let store = Store::open(&format!("sqlite://{}/r.db", dir.0.display()), settings)
        .await
        .unwrap();
    push(
        &store,
        &who("agent", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"NVIDIA H100 80GB HBM3","host":"dgx-2","cluster":"rdu-1","labels":{{"team":"nlp","stage":"Dev"}},"observed_at":"2026-12-02T11:00:00Z"}},
               {{"uuid":"{B}","model":"Tesla T4","host":"node-1","cluster":"rdu-1","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T11:00:00Z"}}]}}"#
        ),
    )
    .await;
    let gpus = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    let a = gpus.iter().find(|g| *g.uuid == *A).unwrap();
    assert_eq!((&*a.team, &*a.env), ("research", "dev"));
    assert_eq!(
        &*a.owner_reason,
        "owner: research — rule 1 `rdu research`: cluster `rdu-1`, host `dgx-2` (from source \
         agent, seen 2026-12-02 11:00 UTC); env: dev — rule 1 `rdu research`: cluster `rdu-1`, \
         host `dgx-2`, label `stage` `Dev` (from source agent, seen 2026-12-02 11:00 UTC); GPU \
         first reported by source agent"
    );
    let b = gpus.iter().find(|g| *g.uuid == *B).unwrap();
    assert_eq!(&*b.team, "nlp", "no rule matches: the team label decides");
}

/// Owner history, on both backends: a rule change at start moves the owner from the current
/// hour on and leaves the past with its owner; `reattribute --from` rewrites history from a
/// mid-day hour, which splits that day's rollup into hours per owner. Real clock times, since
/// the change takes effect at the store's start.
async fn owner_history_keeps_the_past_and_reattribute_rewrites_it(
    open: impl Fn(Settings) -> std::pin::Pin<Box<dyn std::future::Future<Output = Store>>>,
) {
    use gpuledger_ledger::ownership::{Attr, Rule, Setting};
    use gpuledger_model::{day_floor, hour_floor};
    let real_now = Utc::now();
    let day0 = day_floor(real_now.timestamp()) - 3 * 86_400;
    let at = |secs: i64| DateTime::<Utc>::from_timestamp(secs, 0).unwrap();
    let iso = |secs: i64| at(secs).to_rfc3339();
    let store = open(Settings::default()).await;
    let samples: Vec<String> = (10..14)
        .map(|h| {
            format!(
                r#"{{"gpu_uuid":"{A}","ts":"{}","util_pct":50}}"#,
                iso(day0 + h * 3600)
            )
        })
        .collect();
    let body = format!(
        r#"{{"gpus":[{{"uuid":"{A}","model":"NVIDIA H100 80GB HBM3","host":"dgx-1","labels":{{"team":"nlp","env":"prod"}},"observed_at":"{}"}}],"samples":[{}]}}"#,
        iso(day0 + 10 * 3600),
        samples.join(",")
    );
    let out = push_at(&store, &who("agent", None), &body, real_now).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let d = store.gpu_detail(A, day(), real_now).await.unwrap().unwrap();
    assert_eq!(d.owner_history.len(), 1);
    assert_eq!(
        (d.owner_history[0].from, d.owner_history[0].to),
        (None, None)
    );
    assert!(
        d.gpu.owner_reason.starts_with(&format!(
            "owner: nlp — label `team=nlp` (from source agent, seen {})",
            at(day0 + 10 * 3600).format("%Y-%m-%d %H:%M UTC")
        )),
        "{}",
        d.gpu.owner_reason
    );
    store.close().await;

    // The config now places dgx-* hosts in vision.
    let mut settings = Settings::default();
    settings.ownership.rules.push(Rule {
        name: Some("dgx".into()),
        when: vec![(Attr::Host, "dgx-*".into())],
        team: Some(Setting::Name("vision".into())),
        env: None,
    });
    let store = open(settings).await;
    let change = hour_floor(Utc::now().timestamp());
    let now_body = format!(
        r#"{{"gpus":[{{"uuid":"{A}","model":"NVIDIA H100 80GB HBM3","host":"dgx-1","labels":{{"team":"nlp","env":"prod"}},"observed_at":"{n}"}}],"samples":[{{"gpu_uuid":"{A}","ts":"{n}","util_pct":50}}]}}"#,
        n = iso(Utc::now().timestamp())
    );
    let out = push_at(&store, &who("agent", None), &now_body, Utc::now()).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let past = Window {
        from: day0,
        to: day0 + 2 * 86_400,
    };
    let hours_by_team = |s: gpuledger_model::Summary| -> Vec<(String, i64, i64)> {
        s.groups
            .into_iter()
            .map(|g| (g.key, g.gpus, g.gpu_hours))
            .collect()
    };
    let s = store
        .summary(past, &Filters::default(), GroupBy::Team, Utc::now())
        .await
        .unwrap();
    // Present hours 10–14: the last sample at 13:00 keeps the GPU present for the 2-hour
    // stale window.
    assert_eq!(
        hours_by_team(s),
        [("nlp".to_string(), 1, 5)],
        "the past keeps its owner"
    );
    let today = Window {
        from: change,
        to: change + 3600,
    };
    let s = store
        .summary(today, &Filters::default(), GroupBy::Team, Utc::now())
        .await
        .unwrap();
    assert_eq!(hours_by_team(s), [("vision".to_string(), 1, 1)]);
    let d = store
        .gpu_detail(A, day(), Utc::now())
        .await
        .unwrap()
        .unwrap();
    let h: Vec<_> = d
        .owner_history
        .iter()
        .map(|p| {
            (
                &*p.team,
                p.from.map(|t| t.timestamp()),
                p.to.map(|t| t.timestamp()),
            )
        })
        .collect();
    assert_eq!(
        h,
        [("nlp", None, Some(change)), ("vision", Some(change), None)]
    );
    assert!(
        d.owner_history[1]
            .reason
            .starts_with("owner: vision — rule 1 `dgx`: host `dgx-1` (from source agent, seen "),
        "{}",
        d.owner_history[1].reason
    );

    // Re-attribute from noon of day0: hours 10 and 11 stay nlp's, 12 to 14 become vision's.
    let from = day0 + 12 * 3600;
    assert_eq!(store.reattribute(at(from)).await.unwrap(), 1);
    assert_eq!(store.reattribute(at(from)).await.unwrap(), 0, "idempotent");
    let s = store
        .summary(past, &Filters::default(), GroupBy::Team, Utc::now())
        .await
        .unwrap();
    assert_eq!(
        s.total.gpus, 1,
        "a GPU with two owners in the window counts once"
    );
    assert_eq!(s.total.gpu_hours, 5);
    assert_eq!(
        hours_by_team(s),
        [("vision".to_string(), 1, 3), ("nlp".to_string(), 1, 2)]
    );
    let vision = Filters {
        team: vec!["vision".into()],
        ..Default::default()
    };
    let s = store
        .summary(past, &vision, GroupBy::Team, Utc::now())
        .await
        .unwrap();
    assert_eq!((s.total.gpu_hours, s.total.busy_hours), (3, 2));
    let per_gpu = store
        .gpu_totals(past, &Filters::default(), Utc::now())
        .await
        .unwrap();
    assert_eq!(per_gpu.len(), 1);
    assert_eq!((per_gpu[0].present_hours, &*per_gpu[0].team), (5, "vision"));
    let series = store
        .series(past, &vision, false, Utc::now())
        .await
        .unwrap();
    assert_eq!(
        series
            .iter()
            .map(|p| p.start.timestamp())
            .collect::<Vec<_>>(),
        [from, from + 3600, from + 7200],
        "hourly series filtered by team follow the owner at each hour"
    );
    let d = store
        .gpu_detail(A, day(), Utc::now())
        .await
        .unwrap()
        .unwrap();
    let h: Vec<_> = d
        .owner_history
        .iter()
        .map(|p| {
            (
                &*p.team,
                p.from.map(|t| t.timestamp()),
                p.to.map(|t| t.timestamp()),
            )
        })
        .collect();
    assert_eq!(h, [("nlp", None, Some(from)), ("vision", Some(from), None)]);
    assert!(d.owner_history[1].reason.contains("(re-attributed from "));
}

/// Ownership by the workloads holding a GPU, on both backends: a rule on the namespace's
/// `team` label places a Kubernetes placeholder by the pod on it; the real GPU that absorbs
/// the placeholder takes over its pods and so its owner; the owner stays after the pod ends
/// (the last holder still decides) and changes, from the hour it starts, when a pod of another
/// namespace takes the GPU. Two pods at once: the earlier one decides and the other is named.
async fn workload_rules_follow_the_pods_holding_a_gpu(
    open: impl Fn(Settings) -> std::pin::Pin<Box<dyn std::future::Future<Output = Store>>>,
) {
    use gpuledger_ledger::ownership::{Attr, Rule, Setting};
    let mut settings = Settings::default();
    settings.ownership.rules.push(Rule {
        name: Some("namespace team".into()),
        when: vec![(Attr::Namespace, "*-prod".into())],
        team: Some(Setting::From(Attr::NamespaceLabel("team".into()))),
        env: Some(Setting::Name("prod".into())),
    });
    let store = open(settings).await;
    let k8s = who("k8s", None);
    let node = HostGpus {
        host: "node-q".into(),
        count: 1,
        model: Some("Tesla T4".into()),
        cluster: Some("c1".into()),
        ..Default::default()
    };
    store
        .observe_host_gpu_count(&k8s, &node, t("2026-12-02T08:00:00Z"))
        .await
        .unwrap();
    let pod = |ns: &str, name: &str, start: &str, end: Option<&str>| {
        let end = end.map(|e| format!("\"{e}\"")).unwrap_or("null".into());
        format!(
            r#"{{"allocations":[{{"gpu_uuid":"placeholder:node-q:0","start":"{start}","end":{end},"workload":"{ns}/{name}","kind":"pod","context":{{"namespace":"{ns}","namespace_labels":{{"team":"{team}"}}}}}}]}}"#,
            team = ns.trim_end_matches("-prod")
        )
    };
    let owner = |store: &Store, uuid: &'static str| {
        let store = store.clone();
        async move {
            let d = store
                .gpu_detail(uuid, dec2(), now())
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("no GPU {uuid}"));
            let periods: Vec<(String, Option<String>, Option<String>)> = d
                .owner_history
                .iter()
                .map(|p| {
                    let hm = |t: Option<DateTime<Utc>>| t.map(|t| t.format("%H:%M").to_string());
                    (p.team.clone(), hm(p.from), hm(p.to))
                })
                .collect();
            (d.gpu, periods)
        }
    };
    let ph = "placeholder:node-q:0";
    collect_at(
        &store,
        &k8s,
        &pod("nlp-prod", "a", "2026-12-02T08:20:00Z", None),
        t("2026-12-02T08:21:00Z"),
    )
    .await;
    let (g, _) = owner(&store, ph).await;
    assert_eq!((&*g.team, &*g.env), ("nlp", "prod"));
    assert!(
        g.owner_reason.starts_with(
            "placeholder: a GPU of node-q counted by source k8s, not yet named by a UUID-aware \
             source; owner: nlp — rule 1 `namespace team`: namespace `nlp-prod`, namespace label \
             `team` `nlp` on c1/nlp-prod (held by pod nlp-prod/a on c1, from source k8s, since \
             2026-12-02 08:20 UTC); env: prod"
        ),
        "{}",
        g.owner_reason
    );

    // dcgm names the GPU: it absorbs the placeholder with its pod, and so its owner.
    push_at(
        &store,
        &who("dcgm", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","host":"node-q","observed_at":"2026-12-02T09:05:00Z"}}]}}"#
        ),
        t("2026-12-02T09:05:00Z"),
    )
    .await;
    let (g, periods) = owner(&store, A).await;
    assert_eq!(&*g.team, "nlp", "{}", g.owner_reason);
    assert_eq!(
        periods,
        [
            ("unowned".to_string(), None, Some("08:00".to_string())),
            ("nlp".to_string(), Some("08:00".to_string()), None)
        ]
    );

    // The pod ends; the GPU stays nlp's. A vision pod takes it at 10:30.
    collect_at(
        &store,
        &k8s,
        &pod(
            "nlp-prod",
            "a",
            "2026-12-02T08:20:00Z",
            Some("2026-12-02T10:00:00Z"),
        ),
        t("2026-12-02T10:01:00Z"),
    )
    .await;
    assert_eq!(&*owner(&store, A).await.0.team, "nlp");
    collect_at(
        &store,
        &k8s,
        &pod("vision-prod", "b", "2026-12-02T10:30:00Z", None),
        t("2026-12-02T10:31:00Z"),
    )
    .await;
    let (g, periods) = owner(&store, A).await;
    assert_eq!(&*g.team, "vision");
    assert_eq!(
        periods,
        [
            ("unowned".to_string(), None, Some("08:00".to_string())),
            (
                "nlp".to_string(),
                Some("08:00".to_string()),
                Some("10:00".to_string())
            ),
            ("vision".to_string(), Some("10:00".to_string()), None)
        ]
    );

    // Time-slicing: an nlp pod joins while vision's runs. The earlier holder decides.
    collect_at(
        &store,
        &k8s,
        &pod("nlp-prod", "c", "2026-12-02T11:00:00Z", None),
        t("2026-12-02T11:01:00Z"),
    )
    .await;
    let (g, periods) = owner(&store, A).await;
    assert_eq!(&*g.team, "vision");
    assert_eq!(periods.len(), 3);
    assert!(
        g.owner_reason
            .contains("(conflict: pod nlp-prod/c would place it in nlp; the earliest holder wins)"),
        "{}",
        g.owner_reason
    );
    // Each hour under its owner: 08–09 nlp, 10–11 vision.
    let s = store
        .summary(
            Window {
                from: t("2026-12-02T08:00:00Z").timestamp(),
                to: t("2026-12-02T12:00:00Z").timestamp(),
            },
            &Filters::default(),
            GroupBy::Team,
            now(),
        )
        .await
        .unwrap();
    let hours: Vec<(&str, i64, i64)> = s
        .groups
        .iter()
        .map(|g| (g.key.as_str(), g.gpus, g.gpu_hours))
        .collect();
    assert_eq!(hours, [("nlp", 1, 2), ("vision", 1, 2)], "{hours:?}");
    assert_eq!(s.total.gpus, 1);

    // vision's pod ends at 11:30: the nlp pod is the only holder, and the GPU is nlp's from
    // the hour the vision pod left, not from when the nlp pod started.
    collect_at(
        &store,
        &k8s,
        &pod(
            "vision-prod",
            "b",
            "2026-12-02T10:30:00Z",
            Some("2026-12-02T11:30:00Z"),
        ),
        t("2026-12-02T11:31:00Z"),
    )
    .await;
    let (g, periods) = owner(&store, A).await;
    assert_eq!(&*g.team, "nlp");
    assert_eq!(
        periods[2..],
        [
            (
                "vision".to_string(),
                Some("10:00".to_string()),
                Some("11:00".to_string())
            ),
            ("nlp".to_string(), Some("11:00".to_string()), None)
        ]
    );

    // A token scoped to nlp may not move a GPU out of nlp through a pod's namespace.
    let scoped = who("nlp-cron", Some(&["nlp"]));
    let out = push_at(
        &store,
        &scoped,
        &format!(
            r#"{{"allocations":[{{"gpu_uuid":"{A}","start":"2026-12-02T09:00:00Z","workload":"vision-prod/early","kind":"pod","context":{{"namespace":"vision-prod","namespace_labels":{{"team":"vision"}}}}}}]}}"#
        ),
        t("2026-12-02T11:40:00Z"),
    )
    .await;
    assert_eq!(out.rejected.len(), 1, "{:?}", out.rejected);
    assert_eq!(out.rejected[0].path, "allocations[0].context");
    assert!(
        out.rejected[0]
            .reason
            .contains("would place GPU GPU-aaaaaaaa-0000-0000-0000-000000000001 in team `vision`"),
        "{}",
        out.rejected[0].reason
    );
    assert_eq!(&*owner(&store, A).await.0.team, "nlp");

    // Re-attributing replays the holders since the date: the history comes out the same, not
    // flattened to today's owner.
    let before = owner(&store, A).await.1;
    assert_eq!(
        store.reattribute(t("2026-12-02T00:00:00Z")).await.unwrap(),
        0
    );
    let after = owner(&store, A).await.1;
    assert_eq!(before[1..], after[1..]);
}

/// A contract for an account prices the GPUs a push places in that account; another account
/// pays the catalog's on-demand price.
#[tokio::test]
async fn contracts_price_gpus_by_their_pushed_account() {
    use gpuledger_ledger::ownership::Attr;
    use gpuledger_ledger::{Contract, ContractPrice};
    let dir = tempdir::Dir::new();
    let mut settings = Settings::default();
    settings.rates.contracts.push(Contract {
        name: "p5 plan".into(),
        deal: "savings_plan".into(),
        when: vec![(Attr::Account, "111122223333".into())],
        price: ContractPrice::Instance {
            usd_per_hour: 55.04,
            gpus: None,
        },
    });
    let store = Store::open(&format!("sqlite://{}/c.db", dir.0.display()), settings)
        .await
        .unwrap();
    let gpu = |uuid: &str, account: &str| {
        format!(
            r#"{{"uuid":"{uuid}","model":"NVIDIA H100 80GB HBM3","host":"ip-1","cloud":"aws","instance_type":"p5.48xlarge","account":"{account}","observed_at":"2026-12-02T11:00:00Z"}}"#
        )
    };
    let out = push(
        &store,
        &who("aws", None),
        &format!(
            r#"{{"gpus":[{},{}]}}"#,
            gpu(A, "111122223333"),
            gpu(B, "999988887777")
        ),
    )
    .await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let gpus = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    let a = gpus.iter().find(|g| *g.uuid == *A).unwrap();
    assert_eq!(a.account.as_deref(), Some("111122223333"));
    assert_eq!(a.usd_per_hour, Some(6.88));
    assert_eq!(
        &*a.rate_origin,
        "contract `p5 plan` (savings_plan; account `111122223333`: p5.48xlarge $55.04/h ÷ 8)"
    );
    let b = gpus.iter().find(|g| *g.uuid == *B).unwrap();
    assert_eq!(b.usd_per_hour, Some(12.29));
}

/// A FOCUS export against the hand-computed fleet: node-a's p5 line is matched to GPU A (its
/// only physical GPU: the MIG instance is no extra GPU), the unknown instance is listed, the
/// storage line is no GPU spend. Stored, it shows beside the estimate in summaries, spread over
/// A's present hours of the month; the same file again changes nothing; a corrected file under
/// the same name replaces it.
async fn billing_import_is_kept_and_shown_beside_the_estimate(store: Store) {
    let out = push(&store, &who("p", None), SCENARIO).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let focus = |a_cost: &str| {
        format!(
            "BilledCost,ChargePeriodStart,EffectiveCost,ResourceId,ChargeDescription,ServiceName,ProviderName\n\
             60.00,2026-12-01T00:00:00Z,{a_cost},arn:aws:ec2:us-east-1:1:instance/node-a,$98.32 per On Demand Linux p5.48xlarge Instance Hour,Amazon EC2,AWS\n\
             10.00,2026-12-01T00:00:00Z,10.00,i-0zzz,$1.006 per On Demand Linux g5.xlarge Instance Hour,Amazon EC2,AWS\n\
             1.00,2026-12-01T00:00:00Z,1.00,node-a,$0.023 per GB-month of storage,Amazon S3,AWS\n"
        )
    };
    let done = store
        .import_billing("focus-2026-12.csv", &focus("48.00"), now(), false)
        .await
        .unwrap();
    assert!(!done.unchanged);
    let r = &done.report;
    assert_eq!((r.lines, r.gpu_lines, r.matched_lines), (3, 2, 1));
    assert_eq!(r.unmatched.len(), 1);
    assert_eq!(r.unmatched[0].resource_id.as_deref(), Some("i-0zzz"));
    assert_eq!(r.gpus.len(), 1);
    assert_eq!((&*r.gpus[0].uuid, r.gpus[0].billed_usd), (A, 48.0));
    // 6 present hours × $12.29.
    assert_eq!(r.gpus[0].estimated_usd, Some(73.74));

    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let nlp = group(&s.groups, "nlp");
    assert_eq!(nlp.cost_usd, 73.74, "the estimate stays the estimate");
    assert_eq!(
        (
            nlp.billed_gpu_hours,
            nlp.billed_usd,
            nlp.billed_estimate_usd
        ),
        (6, 48.0, 73.74)
    );
    assert_eq!(
        nlp.cost_basis,
        gpuledger_model::CostBasis::PartlyReconciled,
        "C's 2 hours are not billed"
    );
    assert_eq!(
        group(&s.groups, "vision").cost_basis,
        gpuledger_model::CostBasis::Estimate
    );
    // Half of A's hours in the window: half of what was billed for the month.
    let early = Window {
        from: t("2026-12-01T00:00:00Z").timestamp(),
        to: t("2026-12-01T03:00:00Z").timestamp(),
    };
    let s = store
        .summary(early, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let nlp = group(&s.groups, "nlp");
    assert_eq!((nlp.billed_gpu_hours, nlp.billed_usd), (3, 24.0));
    assert_eq!(nlp.cost_basis, gpuledger_model::CostBasis::Reconciled);

    let again = store
        .import_billing("focus-2026-12.csv", &focus("48.00"), now(), false)
        .await
        .unwrap();
    assert!(again.unchanged, "the same content changes nothing");
    store
        .import_billing("focus-2026-12.csv", &focus("30.00"), now(), false)
        .await
        .unwrap();
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(
        group(&s.groups, "nlp").billed_usd,
        30.0,
        "a corrected export replaces, never adds"
    );
    let unseen = store.billed_unseen(day().from, day().to).await.unwrap();
    assert_eq!(unseen.len(), 1, "{unseen:?}");
    assert_eq!(
        (unseen[0].resource_id.as_str(), unseen[0].effective_cost),
        ("i-0zzz", 10.0)
    );
    let d = store.gpu_detail(A, day(), now()).await.unwrap().unwrap();
    assert_eq!((d.billed_gpu_hours, d.billed_usd), (6, 30.0));
    assert_eq!(d.cost_basis, gpuledger_model::CostBasis::Reconciled);
    let files = store.billing_files().await.unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].report["matched_lines"], 1);
    // The report compares the bill with the estimate of the hours it covers.
    assert_eq!(files[0].report["gpus"][0]["gpu_hours"], 6);
    assert_eq!(files[0].report["gpus"][0]["estimated_usd"], 73.74);
    assert_eq!(files[0].report["teams"][0]["team"], "nlp");
    // The same bill delivered again under another name replaces the first, never adds up.
    let again = store
        .import_billing("run-2/focus-2026-12.csv", &focus("32.00"), now(), false)
        .await
        .unwrap();
    assert!(!again.unchanged);
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(group(&s.groups, "nlp").billed_usd, 32.0, "latest bill wins");
    // Importing the first file again (forced) makes it the latest.
    store
        .import_billing("focus-2026-12.csv", &focus("30.00"), now(), true)
        .await
        .unwrap();
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(group(&s.groups, "nlp").billed_usd, 30.0);
    // A corrected file that no longer bills node-a leaves A's hours estimated only.
    let without_a: String = focus("30.00")
        .lines()
        .filter(|l| !l.contains("node-a,"))
        .map(|l| format!("{l}\n"))
        .collect();
    store
        .import_billing("focus-2026-12.csv", &without_a, now(), false)
        .await
        .unwrap();
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let nlp = group(&s.groups, "nlp");
    assert_eq!((nlp.billed_gpu_hours, nlp.billed_usd), (0, 0.0));
    assert_eq!(nlp.cost_basis, gpuledger_model::CostBasis::Estimate);
    let d = store.gpu_detail(A, day(), now()).await.unwrap().unwrap();
    assert_eq!((d.billed_gpu_hours, d.billed_usd), (0, 0.0));
    // One GPU's period billed on two lines (part under a savings plan, part on demand):
    // the two bills add up, on the hours and in the report.
    let split = "BilledCost,ChargePeriodStart,EffectiveCost,ResourceId,ChargeDescription,ServiceName,ProviderName\n\
         40.00,2026-12-01T00:00:00Z,28.00,arn:aws:ec2:us-east-1:1:instance/node-a,$98.32 per SavingsPlanCoveredUsage p5.48xlarge Instance Hour,Amazon EC2,AWS\n\
         20.00,2026-12-01T00:00:00Z,20.00,arn:aws:ec2:us-east-1:1:instance/node-a,$98.32 per On Demand Linux p5.48xlarge Instance Hour,Amazon EC2,AWS\n";
    let done = store
        .import_billing("focus-2026-12.csv", split, now(), false)
        .await
        .unwrap();
    assert_eq!(done.report.matched_lines, 2);
    assert_eq!(done.report.gpus.len(), 1, "{:?}", done.report.gpus);
    assert_eq!(done.report.gpus[0].billed_usd, 48.0);
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let nlp = group(&s.groups, "nlp");
    assert_eq!((nlp.billed_gpu_hours, nlp.billed_usd), (6, 48.0));
    // The same file again with a period that shrinks, then grows: the hours it no longer
    // covers lose their share, the hours it covers again get theirs, the rest keep theirs.
    let until = |end: &str| {
        format!(
            "BilledCost,ChargePeriodStart,ChargePeriodEnd,EffectiveCost,ResourceId,ChargeDescription,ServiceName,ProviderName\n\
             30.00,2026-12-01T00:00:00Z,{end},30.00,arn:aws:ec2:us-east-1:1:instance/node-a,$98.32 per On Demand Linux p5.48xlarge Instance Hour,Amazon EC2,AWS\n"
        )
    };
    for (end, billed) in [
        ("2026-12-01T03:00:00Z", (3, 30.0)),
        ("2026-12-01T04:00:00Z", (4, 30.0)),
        ("2026-12-02T00:00:00Z", (6, 30.0)),
    ] {
        store
            .import_billing("focus-2026-12.csv", &until(end), now(), false)
            .await
            .unwrap();
        let s = store
            .summary(day(), &Filters::default(), GroupBy::Team, now())
            .await
            .unwrap();
        let nlp = group(&s.groups, "nlp");
        assert_eq!(
            (nlp.billed_gpu_hours, nlp.billed_usd),
            billed,
            "until {end}"
        );
        let d = store.gpu_detail(A, day(), now()).await.unwrap().unwrap();
        assert_eq!((d.billed_gpu_hours, d.billed_usd), billed, "until {end}");
    }
    store
        .import_billing("focus-2026-12.csv", split, now(), false)
        .await
        .unwrap();
    let err = store
        .import_billing("not-focus.csv", "a,b\n1,2\n", now(), false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ChargePeriodStart"), "{err}");
}

// Figures defined once (issue: every figure defined once, in `ledger`). Each test below failed
// on the code before it and is named after the case it pins.

fn hours_window(from: &str, to: &str) -> Window {
    Window {
        from: t(from).timestamp(),
        to: t(to).timestamp(),
    }
}

/// An open allocation that receives its end more than an hour late must not leave the hours
/// after its end allocated.
async fn allocation_closed_late_leaves_no_allocated_hours_behind(store: Store) {
    let p = who("k8s", None);
    push_at(
        &store,
        &p,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T08:00:00Z"}}],
              "allocations":[{{"gpu_uuid":"{A}","start":"2026-12-02T08:00:00Z","workload":"nlp/a","kind":"pod","team":"nlp"}}]}}"#
        ),
        t("2026-12-02T08:05:00Z"),
    )
    .await;
    push_at(
        &store,
        &p,
        &format!(
            r#"{{"samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T09:30:00Z","util_pct":1}},
                {{"gpu_uuid":"{A}","ts":"2026-12-02T10:30:00Z","util_pct":1}}]}}"#
        ),
        t("2026-12-02T10:35:00Z"),
    )
    .await;
    let window = hours_window("2026-12-02T08:00:00Z", "2026-12-02T12:00:00Z");
    let before = store
        .summary(window, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(before.total.allocated_hours, 4, "open: 08–11 allocated");
    // The pod's end arrives at 11:30, saying it ended at 09:00.
    let out = push_at(
        &store,
        &p,
        &format!(
            r#"{{"allocations":[{{"gpu_uuid":"{A}","start":"2026-12-02T08:00:00Z","end":"2026-12-02T09:00:00Z","workload":"nlp/a","kind":"pod","team":"nlp"}}]}}"#
        ),
        t("2026-12-02T11:30:00Z"),
    )
    .await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let after = store
        .summary(window, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(
        (
            after.total.allocated_hours,
            after.total.allocated_idle_hours
        ),
        (1, 0),
        "only hour 08 was allocated; 09 and 10 were idle but not allocated"
    );
    let gpu = store.gpu_detail(A, window, now()).await.unwrap().unwrap();
    let flagged: Vec<bool> = gpu.hours.iter().map(|h| h.allocated).collect();
    assert_eq!(flagged, [true, false, false, false]);
}

/// A MIG instance reported with a host must not take over the host's placeholder GPU: its
/// hours would vanish from GPU-hours and cost (MIG instances are never counted).
async fn placeholder_is_never_absorbed_by_a_mig_instance(store: Store) {
    let k8s = who("k8s", None);
    store
        .observe_host_gpu_count(
            &k8s,
            &HostGpus {
                host: "node-m".into(),
                count: 1,
                model: Some("NVIDIA A100-SXM4-40GB".into()),
                ..Default::default()
            },
            t("2026-12-01T00:00:00Z"),
        )
        .await
        .unwrap();
    push(
        &store,
        &who("dcgm", None),
        r#"{"gpus":[{"uuid":"MIG-11111111-2222-3333-4444-555555555555","model":"NVIDIA A100-SXM4-40GB","host":"node-m","mig_parent_uuid":"GPU-99999999-0000-0000-0000-000000000009","mig_profile":"3g.20gb","observed_at":"2026-12-01T01:00:00Z"}]}"#,
    )
    .await;
    let gpus = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    assert_eq!(
        gpus.iter().filter(|g| g.placeholder).count(),
        1,
        "the placeholder stays until a physical GPU names it"
    );
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!((s.total.gpus, s.total.gpu_hours), (1, 2));
    // The physical GPU takes it over, hours and all.
    push(
        &store,
        &who("dcgm", None),
        r#"{"gpus":[{"uuid":"GPU-99999999-0000-0000-0000-000000000009","model":"NVIDIA A100-SXM4-40GB","host":"node-m","observed_at":"2026-12-01T05:00:00Z"}]}"#,
    )
    .await;
    let gpus = store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap();
    assert_eq!(gpus.len(), 1);
    assert!(!gpus[0].placeholder);
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!((s.total.gpus, s.total.gpu_hours), (1, 4));
}

/// An allocation on a MIG instance makes its physical GPU's hour allocated, in the summary, in
/// used-by and in allocated-but-idle alike — whether it arrives with the GPU or later.
async fn mig_allocations_make_their_gpu_hour_allocated_in_every_figure(store: Store) {
    let p = who("dcgm", None);
    push(
        &store,
        &p,
        &format!(
            r#"{{"gpus":[{{"uuid":"{C}","model":"NVIDIA A100-SXM4-40GB","labels":{{"team":"vision"}},"observed_at":"2026-12-02T08:00:00Z"}},
                {{"uuid":"{A_MIG}","model":"NVIDIA A100-SXM4-40GB","mig_parent_uuid":"{C}","mig_profile":"3g.20gb","labels":{{"team":"vision"}},"observed_at":"2026-12-02T08:00:00Z"}}],
              "samples":[{{"gpu_uuid":"{C}","ts":"2026-12-02T08:30:00Z","util_pct":1}},
                {{"gpu_uuid":"{C}","ts":"2026-12-02T09:30:00Z","util_pct":90}}]}}"#
        ),
    )
    .await;
    // Later, a pod on the MIG instance from 08:00 to 09:30.
    push(
        &store,
        &p,
        &format!(
            r#"{{"allocations":[{{"gpu_uuid":"{A_MIG}","start":"2026-12-02T08:00:00Z","end":"2026-12-02T09:30:00Z","workload":"nlp/c","kind":"pod","team":"nlp"}}]}}"#
        ),
    )
    .await;
    let window = hours_window("2026-12-02T08:00:00Z", "2026-12-02T12:00:00Z");
    let s = store
        .summary(window, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(
        (
            s.total.gpu_hours,
            s.total.allocated_hours,
            s.total.allocated_idle_hours
        ),
        (4, 2, 1),
        "present 08–11; the instance's pod holds 08 (idle) and 09 (busy)"
    );
    let used = store
        .used_by_cost(window, &Filters::default(), now())
        .await
        .unwrap();
    let nlp = used.iter().find(|u| *u.team == *"nlp").unwrap();
    assert_eq!((nlp.gpus, nlp.gpu_hours), (1, 2.0));
    let idle = store
        .idle_workloads(window, &Filters::default(), now())
        .await
        .unwrap();
    assert_eq!(idle.len(), 1);
    assert_eq!(
        (idle[0].workload.as_str(), idle[0].allocated_idle_hours),
        ("nlp/c", 1.0)
    );
}

/// The daily trend's bars add up to the headline: clipped to the window at both ends (the
/// first day's hours before the window and hours already marked present after now are out).
async fn daily_trend_adds_up_to_the_summary(store: Store) {
    push(&store, &who("hand", None), SCENARIO).await;
    // Observed at 11:30 today: hours 11 and 12 are in the window, 13 is still in the future.
    push(
        &store,
        &who("hand", None),
        r#"{"gpus":[{"uuid":"GPU-dddddddd-0000-0000-0000-000000000004","model":"Tesla T4","labels":{"team":"nlp"},"observed_at":"2026-12-02T11:30:00Z"}]}"#,
    )
    .await;
    for filters in [
        Filters::default(),
        Filters {
            team: vec!["nlp".into()],
            ..Default::default()
        },
    ] {
        let window = hours_window("2026-12-01T01:00:00Z", "2026-12-02T12:00:00Z");
        let s = store
            .summary(window, &filters, GroupBy::Team, now())
            .await
            .unwrap();
        let series = store.series(window, &filters, true, now()).await.unwrap();
        let sum = |f: fn(&gpuledger_store::SeriesPoint) -> i64| series.iter().map(f).sum::<i64>();
        assert_eq!(
            (
                sum(|p| p.gpu_hours),
                sum(|p| p.idle_hours),
                sum(|p| p.busy_hours),
                sum(|p| p.allocated_hours)
            ),
            (
                s.total.gpu_hours,
                s.total.idle_hours,
                s.total.busy_hours,
                s.total.allocated_hours
            ),
            "{filters:?}: {series:?}"
        );
        assert!(s.total.gpu_hours > 0);
    }
}

/// Per-workload allocated-but-idle hours: a shared idle hour is split among its holders, and
/// hours on a GPU without a rate are unpriced, never $0.
async fn idle_workloads_split_shared_hours_and_keep_unpriced_hours(store: Store) {
    let p = who("lab", None);
    push(
        &store,
        &p,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T08:00:00Z"}},
                {{"uuid":"{C}","model":"Mystery GPU","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T08:00:00Z"}}],
              "samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T08:30:00Z","util_pct":1}},
                {{"gpu_uuid":"{C}","ts":"2026-12-02T08:30:00Z","util_pct":1}}],
              "allocations":[{{"gpu_uuid":"{A}","start":"2026-12-02T08:00:00Z","end":"2026-12-02T09:00:00Z","workload":"nlp/a","kind":"pod","team":"nlp"}},
                {{"gpu_uuid":"{A}","start":"2026-12-02T08:00:00Z","end":"2026-12-02T09:00:00Z","workload":"nlp/b","kind":"pod","team":"nlp"}},
                {{"gpu_uuid":"{C}","start":"2026-12-02T08:00:00Z","end":"2026-12-02T09:00:00Z","workload":"nlp/m","kind":"pod"}}]}}"#
        ),
    )
    .await;
    let window = hours_window("2026-12-02T08:00:00Z", "2026-12-02T12:00:00Z");
    let idle = store
        .idle_workloads(window, &Filters::default(), now())
        .await
        .unwrap();
    let got: Vec<_> = idle
        .iter()
        .map(|w| {
            (
                w.workload.as_str(),
                w.used_by.as_str(),
                w.allocated_idle_hours,
                (w.cost_usd * 1e4).round() / 1e4,
                w.unpriced_hours,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("nlp/a", "nlp", 0.5, 0.175, 0.0),
            ("nlp/b", "nlp", 0.5, 0.175, 0.0),
            ("nlp/m", "unowned", 1.0, 0.0, 1.0)
        ]
    );
    let s = store
        .summary(window, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let split: f64 = idle.iter().map(|w| w.cost_usd).sum();
    assert!(
        (split - s.total.allocated_idle_cost_usd).abs() < 0.005,
        "the workloads' shares add up to the summary's allocated-idle cost"
    );
}

/// Idle and unmeasured are told apart: a GPU nobody measures has no known day at all.
async fn activity_evidence_tells_unmeasured_from_idle(store: Store) {
    push(
        &store,
        &who("lab", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","observed_at":"2026-12-02T08:00:00Z"}},
                {{"uuid":"{B}","model":"Tesla T4","observed_at":"2026-12-02T08:00:00Z"}}],
              "samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T08:30:00Z","util_pct":1}}]}}"#
        ),
    )
    .await;
    let ev = store
        .activity_evidence(&Filters::default(), now())
        .await
        .unwrap();
    let of = |u: &str| ev.iter().find(|(x, _)| x == u).unwrap().1;
    let day = Some(t("2026-12-02T00:00:00Z").timestamp());
    assert_eq!((of(A).last_known_day, of(A).last_busy_day), (day, None));
    assert_eq!((of(B).last_known_day, of(B).last_busy_day), (None, None));
    // Busy days before today (kept once settled) and today's day rows (read each time): the
    // later day wins, whichever part it is in.
    const C: &str = "GPU-cccccccc-0000-0000-0000-000000000003";
    push(
        &store,
        &who("lab", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{C}","model":"Tesla T4","observed_at":"2026-11-30T08:00:00Z"}}],
              "samples":[{{"gpu_uuid":"{A}","ts":"2026-11-30T08:30:00Z","util_pct":90}},
                {{"gpu_uuid":"{C}","ts":"2026-11-30T08:30:00Z","util_pct":90}},
                {{"gpu_uuid":"{C}","ts":"2026-12-02T09:30:00Z","util_pct":95}}]}}"#
        ),
    )
    .await;
    store.refresh_groups(now().timestamp()).await.unwrap();
    let before = Some(t("2026-11-30T00:00:00Z").timestamp());
    for read in ["read", "kept"] {
        let ev = store
            .activity_evidence(&Filters::default(), now())
            .await
            .unwrap();
        let of = |u: &str| ev.iter().find(|(x, _)| x == u).unwrap().1;
        assert_eq!(
            (of(A).last_known_day, of(A).last_busy_day),
            (day, before),
            "{read}"
        );
        assert_eq!((of(B).last_known_day, of(B).last_busy_day), (None, None));
        assert_eq!(
            (of(C).last_known_day, of(C).last_busy_day),
            (day, day),
            "{read}"
        );
    }
    assert!(
        store.settled_answers() > 0,
        "the days before today are kept"
    );
}

/// `import billing` and other one-off commands re-roll day rows with the idle threshold the
/// rollups were built with, never their own default. (The stored settings live in `meta` on
/// both backends; SQLite suffices to pin the rule.)
#[tokio::test]
async fn a_one_off_command_uses_the_stored_idle_threshold() {
    let dir = tempdir::Dir::new();
    let url = format!("sqlite://{}/tool.db", dir.0.display());
    let served = Settings {
        idle_threshold_pct: 10.0,
        ..Settings::default()
    };
    let store = Store::open(&url, served).await.unwrap();
    push(
        &store,
        &who("lab", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","observed_at":"2026-12-01T08:00:00Z"}}],
              "samples":[{{"gpu_uuid":"{A}","ts":"2026-12-01T08:30:00Z","util_pct":7}}]}}"#
        ),
    )
    .await;
    store.close().await;
    let tool = Store::open_for_tool(&url, Settings::default())
        .await
        .unwrap();
    assert_eq!(tool.settings().idle_threshold_pct, 10.0);
    let s = tool
        .summary(day(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(s.idle_threshold_pct, 10.0);
    assert_eq!((s.total.idle_hours, s.total.busy_hours), (1, 0));
}

/// A count-only source that knows a node's MIG layout (Kubernetes under the mixed strategy)
/// shows it as placeholder MIG instances of the node's GPU — never as GPUs — which follow the
/// GPU when a UUID-aware source names it and go when it names real instances.
async fn placeholder_mig_layout_shows_until_real_instances_are_named(store: Store) {
    let k8s = who("k8s", None);
    let node = HostGpus {
        host: "node-mig".into(),
        count: 1,
        model: Some("NVIDIA A100-SXM4-40GB".into()),
        mig_instances: [("1g.5gb".to_string(), 3), ("2g.10gb".to_string(), 1)]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    store
        .observe_host_gpu_count(&k8s, &node, t("2026-12-02T08:00:00Z"))
        .await
        .unwrap();
    let all = store
        .list_gpus(&Filters::default(), true, now())
        .await
        .unwrap();
    let migs: Vec<_> = all.iter().filter(|g| g.mig_parent_uuid.is_some()).collect();
    assert_eq!(migs.len(), 4, "{all:?}");
    assert!(migs
        .iter()
        .all(|g| g.placeholder && g.mig_parent_uuid.as_deref() == Some("placeholder:node-mig:0")));
    let profiles: Vec<_> = migs
        .iter()
        .filter_map(|g| g.mig_profile.as_deref())
        .collect();
    assert_eq!(profiles.iter().filter(|p| **p == "1g.5gb").count(), 3);
    let window = hours_window("2026-12-02T08:00:00Z", "2026-12-02T12:00:00Z");
    let s = store
        .summary(window, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(
        (s.total.gpus, s.total.gpu_hours),
        (1, 2),
        "instances are no GPUs"
    );
    // Reported again: the same four, not eight.
    store
        .observe_host_gpu_count(&k8s, &node, t("2026-12-02T08:30:00Z"))
        .await
        .unwrap();
    let count_migs = |gpus: &[gpuledger_model::GpuView]| {
        gpus.iter().filter(|g| g.mig_parent_uuid.is_some()).count()
    };
    assert_eq!(
        count_migs(
            &store
                .list_gpus(&Filters::default(), true, now())
                .await
                .unwrap()
        ),
        4
    );
    // The GPU is named: the instances follow it.
    let gpu = "GPU-77777777-0000-0000-0000-000000000007";
    push(
        &store,
        &who("dcgm", None),
        &format!(r#"{{"gpus":[{{"uuid":"{gpu}","model":"NVIDIA A100-SXM4-40GB","host":"node-mig","observed_at":"2026-12-02T09:00:00Z"}}]}}"#),
    )
    .await;
    let all = store
        .list_gpus(&Filters::default(), true, now())
        .await
        .unwrap();
    assert!(all
        .iter()
        .filter(|g| g.mig_parent_uuid.is_some())
        .all(|g| g.mig_parent_uuid.as_deref() == Some(gpu)));
    assert_eq!(count_migs(&all), 4);
    // A real instance is named: the placeholders go.
    push(
        &store,
        &who("dcgm", None),
        &format!(r#"{{"gpus":[{{"uuid":"MIG-77777777-0000-0000-0000-0000000000a1","model":"NVIDIA A100-SXM4-40GB","host":"node-mig","mig_parent_uuid":"{gpu}","mig_profile":"1g.5gb","observed_at":"2026-12-02T09:30:00Z"}}]}}"#),
    )
    .await;
    let all = store
        .list_gpus(&Filters::default(), true, now())
        .await
        .unwrap();
    let migs: Vec<_> = all.iter().filter(|g| g.mig_parent_uuid.is_some()).collect();
    assert_eq!(migs.len(), 1);
    assert!(!migs[0].placeholder);
    // And the count source reporting again makes none while a real instance is known.
    store
        .observe_host_gpu_count(&k8s, &node, t("2026-12-02T10:00:00Z"))
        .await
        .unwrap();
    assert_eq!(
        count_migs(
            &store
                .list_gpus(&Filters::default(), true, now())
                .await
                .unwrap()
        ),
        1
    );
}

both!(
    placeholder_mig_layout_shows_until_real_instances_are_named,
    allocation_closed_late_leaves_no_allocated_hours_behind,
    placeholder_is_never_absorbed_by_a_mig_instance,
    mig_allocations_make_their_gpu_hour_allocated_in_every_figure,
    daily_trend_adds_up_to_the_summary,
    idle_workloads_split_shared_hours_and_keep_unpriced_hours,
    activity_evidence_tells_unmeasured_from_idle,
);

/// The same summary group: counts exactly, money and the average to within a rounding step
/// (a float summed in another order may round to the other side of half a cent).
fn assert_same_group(a: &SummaryGroup, b: &SummaryGroup, at: &str) {
    let mut a = a.clone();
    let close = |x: f64, y: f64| (x - y).abs() <= 0.0101;
    for (x, y) in [
        (&mut a.cost_usd, b.cost_usd),
        (&mut a.idle_cost_usd, b.idle_cost_usd),
        (&mut a.allocated_idle_cost_usd, b.allocated_idle_cost_usd),
        (&mut a.billed_usd, b.billed_usd),
        (&mut a.billed_estimate_usd, b.billed_estimate_usd),
    ] {
        assert!(close(*x, y), "{at}: {x} vs {y} in {b:?}");
        *x = y;
    }
    if let (Some(x), Some(y)) = (a.avg_activity_pct, b.avg_activity_pct) {
        assert!(close(x, y), "{at}: {x} vs {y}");
        a.avg_activity_pct = b.avg_activity_pct;
    }
    assert_eq!(&a, b, "{at}");
}

/// A small deterministic generator for the property tests (no dependency needed).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Windows over [`push_random_fleets`]' week: whole days, edges, one day, a few hours.
const RANDOM_FLEET_WINDOWS: [(&str, &str); 4] = [
    ("2026-11-25T00:00:00Z", "2026-12-02T00:00:00Z"),
    ("2026-11-25T07:00:00Z", "2026-11-30T13:00:00Z"),
    ("2026-11-26T00:00:00Z", "2026-11-27T00:00:00Z"),
    ("2026-11-27T05:00:00Z", "2026-11-27T09:00:00Z"),
];

/// Four random fleets of five GPUs over the week from 2026-11-25, pushed in a shuffled order:
/// late samples, allocations that close later, a MIG instance, shared GPUs, rate-less GPUs and
/// a change of owner mid-day.
async fn push_random_fleets(store: &Store) {
    let base = t("2026-11-25T00:00:00Z").timestamp();
    let at = |secs: i64| chrono::DateTime::from_timestamp(secs, 0).unwrap();
    for seed in 1..=4u64 {
        let mut r = Lcg(seed * 7919);
        let p = who(&format!("prop-{seed}"), None);
        let gpus: Vec<String> = (0..5)
            .map(|i| format!("GPU-{seed:08x}-0000-0000-0000-{i:012x}"))
            .collect();
        let mut bodies = Vec::new();
        for (i, g) in gpus.iter().enumerate() {
            let model = ["Tesla T4", "Mystery GPU", "NVIDIA A100-SXM4-40GB"][i % 3];
            let mig = format!("MIG-{seed:08x}-0000-0000-0000-{i:012x}");
            let mut gpus_json = vec![format!(
                r#"{{"uuid":"{g}","model":"{model}","observed_at":"{}"}}"#,
                at(base).to_rfc3339()
            )];
            if i == 2 {
                gpus_json.push(format!(
                    r#"{{"uuid":"{mig}","model":"{model}","mig_parent_uuid":"{g}","mig_profile":"3g.20gb","observed_at":"{}"}}"#,
                    at(base).to_rfc3339()
                ));
            }
            bodies.push(format!(r#"{{"gpus":[{}]}}"#, gpus_json.join(",")));
            if i == 0 {
                // A change of owner in the middle of a day.
                bodies.push(format!(
                    r#"{{"gpus":[{{"uuid":"{g}","model":"{model}","labels":{{"team":"vision"}},"observed_at":"{}"}}]}}"#,
                    at(base + 3 * 86_400 + 13 * 3600).to_rfc3339()
                ));
            }
            let mut samples = Vec::new();
            let mut h = 0;
            while h < 6 * 24 {
                samples.push(format!(
                    r#"{{"gpu_uuid":"{g}","ts":"{}","util_pct":{},"mem_used_mib":{}}}"#,
                    at(base + h * 3600 + 1800).to_rfc3339(),
                    r.below(100),
                    r.below(40_000)
                ));
                h += 1 + r.below(3) as i64;
            }
            bodies.push(format!(r#"{{"samples":[{}]}}"#, samples.join(",")));
            for k in 0..6 {
                let start = base + r.below(6 * 86_400) as i64;
                let len = 600 + r.below(2 * 86_400) as i64;
                let holder = if i == 2 && k % 2 == 0 { &mig } else { g };
                let team = ["nlp", "NLP ", "vision", ""][r.below(4) as usize];
                let team = if team.is_empty() {
                    String::new()
                } else {
                    format!(r#","team":"{team}""#)
                };
                let open = format!(
                    r#"{{"allocations":[{{"gpu_uuid":"{holder}","start":"{}","workload":"w{k}","kind":"pod"{team}}}]}}"#,
                    at(start).to_rfc3339()
                );
                let closed = format!(
                    r#"{{"allocations":[{{"gpu_uuid":"{holder}","start":"{}","end":"{}","workload":"w{k}","kind":"pod"{team}}}]}}"#,
                    at(start).to_rfc3339(),
                    at((start + len).min(base + 7 * 86_400)).to_rfc3339()
                );
                bodies.push(open);
                if r.below(3) > 0 {
                    bodies.push(closed);
                }
            }
        }
        // Inventory first; the rest in a shuffled order (a closing push may come before its
        // opening one, which then re-opens it: both are real orders of arrival).
        let (inventory, mut rest): (Vec<String>, Vec<String>) = bodies
            .into_iter()
            .partition(|b| b.starts_with(r#"{"gpus""#) && !b.contains("labels"));
        for i in (1..rest.len()).rev() {
            rest.swap(i, r.below(i as u64 + 1) as usize);
        }
        for b in inventory.iter().chain(&rest) {
            let out = push(store, &p, b).await;
            assert!(out.rejected.is_empty(), "{:?}", out.rejected);
        }
    }
}

/// The per-GPU window counts (summed per GPU where one owner period covers the window, row by
/// row for the GPU whose owner changed, edge days from their day row less the hours outside
/// the window where those are fewer) and the summary, against every row joined to its period,
/// without a filter and with every team of the window named.
async fn assert_window_figures_match(store: &Store, w: Window, now: DateTime<Utc>, at: &str) {
    let summary = store
        .summary(w, &Filters::default(), GroupBy::Team, now)
        .await
        .unwrap();
    let every_team = Filters {
        team: summary.groups.iter().map(|g| g.key.clone()).collect(),
        ..Default::default()
    };
    // Per-GPU window counts: summed per GPU where one owner period covers the window,
    // row by row for the GPU whose owner changed, against every row joined to its period;
    // unfiltered, by every team, and by model and vendor (on PostgreSQL, today's rows kept
    // for the whole fleet and filtered in memory, against the filters' SQL).
    let models = Filters {
        model: vec!["Tesla T4".into(), "NVIDIA A100-SXM4-40GB".into()],
        vendor: vec!["nvidia".into()],
        ..Default::default()
    };
    for filters in [Filters::default(), every_team.clone(), models] {
        let fast = store.gpu_windows(w, &filters, now).await.unwrap();
        let slow = store.gpu_windows_joined(w, &filters, now).await.unwrap();
        assert_eq!(fast.len(), slow.len(), "{at}: {fast:?} vs {slow:?}");
        for (a, b) in fast.iter().zip(&slow) {
            let mut a = a.clone();
            assert!((a.activity_sum - b.activity_sum).abs() < 1e-6, "{at}");
            assert!((a.billed_usd - b.billed_usd).abs() < 1e-6, "{at}");
            a.activity_sum = b.activity_sum;
            a.billed_usd = b.billed_usd;
            assert_eq!(&a, b, "{at}");
        }
    }
    // The summary, whose whole days come from the day rows' running totals (kept as
    // those rows are re-rolled in any order), against the summary of every row joined
    // to its period.
    for filters in [Filters::default(), every_team.clone()] {
        let fast = store
            .summary(w, &filters, GroupBy::Team, now)
            .await
            .unwrap();
        let joined = store.gpu_windows_joined(w, &filters, now).await.unwrap();
        let (groups, total) = gpuledger_ledger::summary::summarize(&joined, GroupBy::Team);
        assert_eq!(fast.groups.len(), groups.len(), "{at}");
        assert!(total.gpu_hours > 0, "{at}: an empty window proves nothing");
        for (a, b) in fast
            .groups
            .iter()
            .chain([&fast.total])
            .zip(groups.iter().chain([&total]))
        {
            assert_same_group(a, b, at);
        }
    }
    // The daily trend without an owner filter reads no owner period (and may read an edge
    // day as its day rows less the hours outside the window); with every team named it reads
    // each row's period. Both must give the same points, split days included, and add up to
    // the summary.
    let unowned = store
        .series(w, &Filters::default(), true, now)
        .await
        .unwrap();
    let owned = store.series(w, &every_team, true, now).await.unwrap();
    let counts = |p: &gpuledger_store::SeriesPoint| {
        (
            p.start,
            p.gpus,
            p.gpu_hours,
            p.busy_hours,
            p.idle_hours,
            p.known_hours,
            p.allocated_hours,
        )
    };
    assert_eq!(unowned.len(), owned.len(), "{at}");
    for (a, b) in unowned.iter().zip(&owned) {
        assert_eq!(counts(a), counts(b), "{at}");
        assert!((a.activity_sum - b.activity_sum).abs() < 1e-6, "{at}");
    }
    assert_eq!(
        unowned.iter().map(|p| p.gpu_hours).sum::<i64>(),
        summary.total.gpu_hours,
        "{at}"
    );
    assert_eq!(
        unowned.iter().map(|p| p.idle_hours).sum::<i64>(),
        summary.total.idle_hours,
        "{at}"
    );
    // Each team's daily trend (every row under its owner period, edge days from their day
    // rows less the hours outside the window, a GPU-day a change of owner splits from its
    // hours) adds up to its group of the summary.
    for g in &summary.groups {
        let one = Filters {
            team: vec![g.key.clone()],
            ..Default::default()
        };
        let days = store.series(w, &one, true, now).await.unwrap();
        let sum = |f: fn(&gpuledger_store::SeriesPoint) -> i64| days.iter().map(f).sum::<i64>();
        assert_eq!(
            (
                sum(|p| p.gpu_hours),
                sum(|p| p.busy_hours),
                sum(|p| p.idle_hours),
                sum(|p| p.allocated_hours)
            ),
            (g.gpu_hours, g.busy_hours, g.idle_hours, g.allocated_hours),
            "{at}: team {}",
            g.key
        );
    }
    // The daily trend per team, in one read (the Teams page's week over week), folded per
    // team: the same figures as each team's group of the summary.
    let mut by_team: std::collections::BTreeMap<String, gpuledger_store::SeriesPoint> =
        Default::default();
    for (team, p) in store
        .daily_series_by_team(w, &Filters::default(), now)
        .await
        .unwrap()
    {
        by_team.entry(team).or_default().absorb(&p);
    }
    by_team.retain(|_, p| p.gpu_hours > 0);
    let teams: Vec<&String> = by_team.keys().collect();
    let mut groups: Vec<&String> = summary
        .groups
        .iter()
        .filter(|g| g.gpu_hours > 0)
        .map(|g| &g.key)
        .collect();
    // The summary orders its groups by their figures; the fold, by name.
    groups.sort();
    assert_eq!(teams, groups, "{at}");
    for g in &summary.groups {
        let Some(p) = by_team.get(&g.key) else {
            continue;
        };
        assert_eq!(
            (p.gpu_hours, p.busy_hours, p.idle_hours, p.allocated_hours),
            (g.gpu_hours, g.busy_hours, g.idle_hours, g.allocated_hours),
            "{at}: team {}",
            g.key
        );
        let (a, b) = (p.avg_activity_pct(), g.avg_activity_pct);
        assert!(
            a.is_some() == b.is_some()
                && (a.unwrap_or(0.0) - b.unwrap_or(0.0)).abs() <= 0.005 + 1e-9,
            "{at}: team {}: {a:?} vs {b:?}",
            g.key
        );
    }
    // Used-by: whole days from its day rollup and present hours from the day rows' running
    // totals, against the allocations and the plain present hours.
    let fast = store
        .used_by_cost(w, &Filters::default(), now)
        .await
        .unwrap();
    let slow = store
        .used_by_cost_unrolled(w, &Filters::default(), now)
        .await
        .unwrap();
    assert_eq!(fast.len(), slow.len(), "{at}: {fast:?} vs {slow:?}");
    for (a, b) in fast.iter().zip(&slow) {
        assert_eq!((&a.team, a.gpus), (&b.team, b.gpus), "{at}");
        assert!(
            (a.gpu_hours - b.gpu_hours).abs() < 1e-9
                && (a.cost_usd - b.cost_usd).abs() < 1e-6
                && (a.unpriced_gpu_hours - b.unpriced_gpu_hours).abs() < 1e-9,
            "{at}: {a:?} vs {b:?}"
        );
    }
}

/// Allocated-but-idle hours per workload (whole days from their day rollup, an edge day
/// possibly as its day rows less the shares outside the window) against the allocations
/// themselves; the slow answer.
async fn assert_idle_workloads_match(
    store: &Store,
    w: Window,
    filters: &Filters,
    now: DateTime<Utc>,
    at: &str,
) -> Vec<gpuledger_ledger::waste::IdleWorkload> {
    let mut fast = store.idle_workloads(w, filters, now).await.unwrap();
    let mut slow = store
        .idle_workloads_unrolled(w, filters, now)
        .await
        .unwrap();
    let key = |x: &gpuledger_ledger::waste::IdleWorkload| {
        (x.workload.clone(), x.used_by.clone(), x.owner.clone())
    };
    fast.sort_by_key(key);
    slow.sort_by_key(key);
    assert_eq!(
        fast.len(),
        slow.len(),
        "{at} {filters:?}: {fast:?} vs {slow:?}"
    );
    for (a, b) in fast.iter().zip(&slow) {
        assert_eq!(key(a), key(b), "{at}");
        assert_eq!(a.gpus, b.gpus, "{at}");
        assert!(
            (a.allocated_idle_hours - b.allocated_idle_hours).abs() < 1e-9
                && (a.cost_usd - b.cost_usd).abs() < 1e-6
                && (a.unpriced_hours - b.unpriced_hours).abs() < 1e-9,
            "{at} {filters:?}: {a:?} vs {b:?}"
        );
    }
    slow
}

/// Property: the allocations overlapping a range of hours, found GPU by GPU by when they start
/// or by when they end (the store picks the side with fewer), give the same holders, for
/// ranges before, across and after allocations that open, close and stay open.
async fn allocations_found_by_start_or_end_hold_the_same_hours(store: Store) {
    push_random_fleets(&store).await;
    let base = t("2026-11-25T00:00:00Z").timestamp();
    let mut compared = (0, 0);
    for (from_h, hours) in [
        (0, 24),
        (5, 3),
        (30, 1),
        (77, 50),
        (100, 68),
        (160, 24),
        (0, 190),
    ] {
        let (lo, hi) = (base + from_h * 3600, base + (from_h + hours) * 3600);
        let [mut start, mut end] = store.held_shares_both_ways(lo, hi).await.unwrap();
        for (used, idle) in [&mut start, &mut end] {
            used.sort_by(|a, b| (a.gpu_id, &a.team).cmp(&(b.gpu_id, &b.team)));
            idle.sort_by(|a, b| {
                (&a.workload, &a.used_by, &a.owner, a.gpu_id).cmp(&(
                    &b.workload,
                    &b.used_by,
                    &b.owner,
                    b.gpu_id,
                ))
            });
        }
        let at = format!("hours {from_h}..{}", from_h + hours);
        assert_eq!(start.0.len(), end.0.len(), "{at}: {start:?} vs {end:?}");
        for (a, b) in start.0.iter().zip(&end.0) {
            assert_eq!((a.gpu_id, &a.team), (b.gpu_id, &b.team), "{at}");
            assert!(
                (a.gpu_hours - b.gpu_hours).abs() < 1e-9,
                "{at}: {a:?} vs {b:?}"
            );
        }
        assert_eq!(start.1.len(), end.1.len(), "{at}: {start:?} vs {end:?}");
        for (a, b) in start.1.iter().zip(&end.1) {
            assert_eq!(
                (&a.workload, &a.used_by, &a.owner, a.gpu_id, &a.kind),
                (&b.workload, &b.used_by, &b.owner, b.gpu_id, &b.kind),
                "{at}"
            );
            assert!((a.hours - b.hours).abs() < 1e-9, "{at}: {a:?} vs {b:?}");
        }
        compared.0 += start.0.len();
        compared.1 += start.1.len();
    }
    assert!(
        compared.0 > 20 && compared.1 > 5,
        "the random fleets hold hours and leave some idle: {compared:?}"
    );
}

/// Property: the used-by and allocated-idle day rollups, kept as pushes arrive in any order
/// (late samples, allocations that close later, MIG instances, shared GPUs, rate-less GPUs, a
/// change of owner mid-day), give exactly what the allocations themselves give, for windows
/// with whole days and edges.
async fn used_by_rollup_equals_recomputation_on_random_fleets(store: Store) {
    push_random_fleets(&store).await;
    // Edge days long and short, and windows that end at their `now` (the last edge day is
    // then its day row less the day's later hours, which exist here as if pushed ahead of the
    // clock): each edge read both ways.
    for (from, to, at) in [
        (
            "2026-11-26T20:00:00Z",
            "2026-11-29T05:00:00Z",
            "2026-11-29T04:30:00Z",
        ),
        (
            "2026-11-25T03:00:00Z",
            "2026-11-30T22:00:00Z",
            "2026-11-30T21:10:00Z",
        ),
        (
            "2026-11-27T23:00:00Z",
            "2026-12-01T02:00:00Z",
            "2026-12-02T12:00:00Z",
        ),
        (
            "2026-11-26T01:00:00Z",
            "2026-11-28T23:00:00Z",
            "2026-12-02T12:00:00Z",
        ),
        // Edge days on the day a GPU changes owner at 13:00, first and last.
        (
            "2026-11-28T05:00:00Z",
            "2026-11-30T20:00:00Z",
            "2026-11-30T19:40:00Z",
        ),
        (
            "2026-11-26T10:00:00Z",
            "2026-11-28T18:00:00Z",
            "2026-11-28T17:20:00Z",
        ),
    ] {
        let w = hours_window(from, to);
        let at_now = format!("{from}–{to} at {at}");
        assert_window_figures_match(&store, w, t(at), &at_now).await;
        let slow =
            assert_idle_workloads_match(&store, w, &Filters::default(), t(at), &at_now).await;
        assert!(
            !slow.is_empty(),
            "{at_now}: no idle allocated hours prove nothing"
        );
    }
    for (from, to) in RANDOM_FLEET_WINDOWS {
        let w = hours_window(from, to);
        assert_window_figures_match(&store, w, now(), &format!("{from}–{to}")).await;
        // Allocated-but-idle hours per workload, by owner at the hour, with and without a
        // filter on the owner.
        for filters in [
            Filters::default(),
            Filters {
                team: vec!["vision".into()],
                ..Default::default()
            },
        ] {
            let slow =
                assert_idle_workloads_match(&store, w, &filters, now(), &format!("{from}–{to}"))
                    .await;
            assert!(
                filters.team.is_empty() || slow.iter().all(|x| x.owner == "vision"),
                "{slow:?}"
            );
            if from == "2026-11-25T00:00:00Z" {
                assert!(
                    !slow.is_empty(),
                    "the random fleets have idle allocated hours"
                );
                assert!(
                    filters.team.is_empty() || slow.iter().any(|x| x.owner == "vision"),
                    "and hours after the mid-day change of owner"
                );
            }
        }
    }
}

/// Edge days read as their day row less the hours outside the window, on a fleet built for
/// their corners: a GPU whose hours on the first edge day all fall before the window (its day
/// row less those hours is nothing: it is not in the window), a GPU whose hours end before the
/// window does on the last edge day and one with hours after it.
async fn edge_days_from_day_rows_match_their_hours(store: Store) {
    let p = who("edges", None);
    let at = |s: &str| t(s).timestamp();
    let hourly = |g: &str, from: i64, to: i64| {
        let samples: Vec<String> = (0..)
            .map(|i| from + i * 3600 + 1800)
            .take_while(|&ts| ts < to)
            .map(|ts| {
                format!(
                    r#"{{"gpu_uuid":"{g}","ts":"{}","util_pct":{},"mem_used_mib":{}}}"#,
                    chrono::DateTime::from_timestamp(ts, 0)
                        .unwrap()
                        .to_rfc3339(),
                    // The last GPU idle throughout, under an allocation: every hour of it
                    // allocated and idle.
                    if g.ends_with('c') {
                        0
                    } else {
                        (ts / 3600) % 7 * 10
                    },
                    (ts - from) / 36
                )
            })
            .collect();
        format!(r#"{{"samples":[{}]}}"#, samples.join(","))
    };
    let gpus = ["GPU-edge-a", "GPU-edge-b", "GPU-edge-c"];
    let inventory: Vec<String> = gpus
        .iter()
        .map(|g| {
            // The GPU outside the window is its team's only GPU.
            let labels = if *g == "GPU-edge-a" {
                r#","labels":{"team":"edge"}"#
            } else {
                ""
            };
            format!(
                r#"{{"uuid":"{g}","model":"Tesla T4"{labels},"observed_at":"2026-11-26T00:00:00Z"}}"#
            )
        })
        .collect();
    for body in [
        format!(r#"{{"gpus":[{}]}}"#, inventory.join(",")),
        hourly(
            gpus[0],
            at("2026-11-26T00:00:00Z"),
            at("2026-11-26T02:00:00Z"),
        ),
        hourly(
            gpus[1],
            at("2026-11-26T00:00:00Z"),
            at("2026-11-28T02:00:00Z"),
        ),
        hourly(
            gpus[2],
            at("2026-11-26T00:00:00Z"),
            at("2026-11-28T12:00:00Z"),
        ),
        r#"{"allocations":[{"gpu_uuid":"GPU-edge-c","start":"2026-11-26T00:10:00Z","workload":"w-c","kind":"pod","team":"nlp"}]}"#.to_string(),
    ] {
        let out = push(&store, &p, &body).await;
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    }
    let (from, to, now) = (
        "2026-11-26T05:00:00Z",
        "2026-11-28T05:00:00Z",
        "2026-11-28T04:40:00Z",
    );
    let w = hours_window(from, to);
    let windows = store
        .gpu_windows(w, &Filters::default(), t(now))
        .await
        .unwrap();
    let seen: Vec<&str> = windows.iter().map(|w| &*w.uuid).collect();
    assert_eq!(seen, [gpus[1], gpus[2]], "{windows:?}");
    let summary = store
        .summary(w, &Filters::default(), GroupBy::Team, t(now))
        .await
        .unwrap();
    assert_eq!(summary.total.gpus, 2, "{summary:?}");
    assert!(
        summary.groups.iter().all(|g| g.key != "edge"),
        "{summary:?}"
    );
    let at_now = format!("{from}–{to} at {now}");
    assert_window_figures_match(&store, w, t(now), &at_now).await;
    let slow = assert_idle_workloads_match(&store, w, &Filters::default(), t(now), &at_now).await;
    assert_eq!(slow.len(), 1, "{slow:?}");
}

/// Late samples onto hours a push already stored, which make allocated hours idle: the push
/// adds no hour and no allocation, so only its hours' figures change, and the allocated-but-idle
/// hours per workload must follow them as the slow split from the allocations does.
async fn late_samples_on_stored_hours_move_allocated_idle_hours(store: Store) {
    let p = who("late-idle", None);
    let gpu = "GPU-late-idle-0000-0000-000000000000";
    // The pushes come the same morning: their samples are added onto their hours.
    let at = t("2026-12-01T06:00:00Z");
    let samples = |minute: u32, util: u32, hours: std::ops::RangeInclusive<u32>| {
        let s: Vec<String> = hours
            .map(|h| {
                format!(
                    r#"{{"gpu_uuid":"{gpu}","ts":"2026-12-01T{h:02}:{minute:02}:00Z","util_pct":{util}}}"#
                )
            })
            .collect();
        format!(r#"{{"samples":[{}]}}"#, s.join(","))
    };
    for body in [
        format!(
            r#"{{"gpus":[{{"uuid":"{gpu}","model":"Tesla T4","labels":{{"team":"nlp"}},"observed_at":"2026-12-01T00:00:00Z"}}]}}"#
        ),
        // Busy enough (6 %) every hour of the morning.
        samples(30, 6, 0..=5),
        format!(
            r#"{{"allocations":[{{"gpu_uuid":"{gpu}","start":"2026-12-01T02:00:00Z","end":"2026-12-01T05:00:00Z","workload":"job-7","kind":"pod","team":"nlp"}}]}}"#
        ),
    ] {
        let out = push_at(&store, &p, &body, at).await;
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    }
    // A whole day: read from the per-day rows (an edge day may be split from the allocations).
    let w = hours_window("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z");
    let before = assert_idle_workloads_match(&store, w, &Filters::default(), now(), "before").await;
    assert!(before.is_empty(), "{before:?}");
    // An idle sample late in hours 1 to 4: each averages 3 %, idle; hours 2 to 4 allocated.
    let out = push_at(&store, &p, &samples(45, 0, 1..=4), at).await;
    assert!(
        out.rejected.is_empty() && out.duplicates.samples == 0,
        "{out:?}"
    );
    let after = assert_idle_workloads_match(&store, w, &Filters::default(), now(), "after").await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(
        (after[0].workload.as_str(), after[0].allocated_idle_hours),
        ("job-7", 3.0),
        "{after:?}"
    );
}

both!(late_samples_on_stored_hours_move_allocated_idle_hours);

/// Live pushes, one sample per GPU every ten minutes, so most pushes add onto hours stored
/// already and their day rows and running totals are moved by what the samples changed
/// (`DayDelta` in the store) rather than rolled again. Hours turn busy or idle as samples
/// arrive, one GPU's first sample of each hour has no activity (its hour becomes known later),
/// memory rises and falls, one GPU is allocated half the day, and late samples land on the day
/// before (whose later day's running totals must move) and on two days in one push. Per GPU,
/// for whole days, two days and edges, every count and the activity sum equal what the raw
/// samples give; allocated-idle workloads equal their slow split.
async fn live_pushes_move_day_rows_as_their_hours_changed(store: Store) {
    let p = who("live-days", None);
    // The server's clock for every push: the last day's hours take samples added on.
    let at = t("2026-12-01T20:00:00Z");
    let first = t("2026-11-30T20:00:00Z").timestamp();
    let gpus: Vec<String> = (0..3)
        .map(|i| format!("GPU-11ve0000-0000-0000-0000-{i:012x}"))
        .collect();
    let inventory: Vec<String> = gpus
        .iter()
        .map(|g| {
            format!(
                r#"{{"uuid":"{g}","model":"Tesla T4","labels":{{"team":"live"}},"observed_at":"2026-11-30T00:00:00Z"}}"#
            )
        })
        .collect();
    let out = push_at(
        &store,
        &p,
        &format!(r#"{{"gpus":[{}]}}"#, inventory.join(",")),
        at,
    )
    .await;
    assert!(out.rejected.is_empty(), "{out:?}");
    let out = push_at(
        &store,
        &p,
        &format!(
            r#"{{"allocations":[{{"gpu_uuid":"{}","start":"2026-12-01T00:00:00Z","end":"2026-12-01T12:00:00Z","workload":"job-live","kind":"pod","team":"live"}}]}}"#,
            gpus[1]
        ),
        at,
    )
    .await;
    assert!(out.rejected.is_empty(), "{out:?}");
    // (gpu, ts, util, mem)
    type LiveSample = (usize, i64, Option<u64>, u64);
    let mut raw: Vec<LiveSample> = Vec::new();
    let mut r = Lcg(7_919);
    let sample = |r: &mut Lcg, g: usize, ts: i64| {
        // GPU 2's first sample of each hour has no activity, nor any of its last hour of the
        // day before until a late one.
        let util = if g == 2 && (ts % 3600 == 0 || ts / 3600 == first / 3600 + 3) {
            None
        } else if r.below(3) == 0 {
            Some(r.below(8))
        } else {
            Some(r.below(101))
        };
        (g, ts, util, 1000 + r.below(4000))
    };
    let body = |batch: &[LiveSample]| {
        let s: Vec<String> = batch
            .iter()
            .map(|&(g, ts, util, mem)| {
                let util = util
                    .map(|u| format!(r#","util_pct":{u}"#))
                    .unwrap_or_default();
                format!(
                    r#"{{"gpu_uuid":"{}","ts":"{}"{util},"mem_used_mib":{mem}}}"#,
                    gpus[g],
                    chrono::DateTime::from_timestamp(ts, 0)
                        .unwrap()
                        .to_rfc3339()
                )
            })
            .collect();
        format!(r#"{{"samples":[{}]}}"#, s.join(","))
    };
    let mut pushes: Vec<Vec<LiveSample>> = Vec::new();
    for step in 0..24 * 6 {
        let ts = first + step * 600;
        pushes.push((0..3).map(|g| sample(&mut r, g, ts)).collect());
    }
    // Late: GPU 0 on both days in one push; GPU 1 on two hours of a day, the earlier with the
    // day's peak memory; GPU 2 alone on the day before, the first activity of its hour.
    pushes.push(vec![
        sample(&mut r, 0, first + 3600 + 300),
        sample(&mut r, 0, first + 7 * 3600 + 300),
    ]);
    pushes.push(vec![
        (1, first + 7 * 3600 + 300, Some(50), 9000),
        (1, first + 9 * 3600 + 300, Some(50), 100),
    ]);
    pushes.push(vec![(2, first + 3 * 3600 + 300, Some(50), 100)]);
    for batch in &pushes {
        let out = push_at(&store, &p, &body(batch), at).await;
        assert!(
            out.rejected.is_empty() && out.duplicates.samples == 0,
            "{out:?}"
        );
        raw.extend(batch.iter().copied());
    }
    let allocated = |ts: i64| {
        ts >= t("2026-12-01T00:00:00Z").timestamp() && ts < t("2026-12-01T12:00:00Z").timestamp()
    };
    let live = Filters {
        team: vec!["live".into()],
        ..Default::default()
    };
    for (from, to) in [
        ("2026-11-30T00:00:00Z", "2026-12-02T00:00:00Z"),
        ("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"),
        ("2026-11-30T00:00:00Z", "2026-12-01T00:00:00Z"),
        ("2026-11-30T21:00:00Z", "2026-12-01T15:00:00Z"),
    ] {
        let w = hours_window(from, to);
        // Per GPU and hour: the mean of its samples' activity (if any), the largest memory.
        let mut hours: std::collections::BTreeMap<(usize, i64), (f64, u32, u64)> =
            Default::default();
        for &(g, ts, util, mem) in &raw {
            if ts >= w.from && ts < w.to {
                let e = hours.entry((g, ts - ts.rem_euclid(3600))).or_default();
                if let Some(u) = util {
                    e.0 += u as f64;
                    e.1 += 1;
                }
                e.2 = e.2.max(mem);
            }
        }
        let got = store.gpu_windows(w, &live, now()).await.unwrap();
        for (g, uuid) in gpus.iter().enumerate() {
            let mine: Vec<_> = hours.iter().filter(|((gg, _), _)| *gg == g).collect();
            let acts: Vec<(i64, f64)> = mine
                .iter()
                .filter(|(_, (_, n, _))| *n > 0)
                .map(|((_, h), (s, n, _))| (*h, s / *n as f64))
                .collect();
            let idle = acts.iter().filter(|(_, a)| *a < 5.0).count() as i64;
            let alloc_idle = acts
                .iter()
                .filter(|(h, a)| g == 1 && allocated(*h) && *a < 5.0)
                .count() as i64;
            let sum: f64 = acts.iter().map(|(_, a)| a).sum();
            let mem = mine.iter().map(|(_, (_, _, m))| *m).max();
            let row = got.iter().find(|x| *x.uuid == **uuid);
            let label = format!("{from}..{to}, {uuid}");
            let row = row.unwrap_or_else(|| panic!("{label}: no row in {got:#?}"));
            assert_eq!(row.known_hours, acts.len() as i64, "{label}");
            assert_eq!(row.idle_hours, idle, "{label}");
            assert_eq!(row.busy_hours, acts.len() as i64 - idle, "{label}");
            assert_eq!(row.allocated_idle_hours, alloc_idle, "{label}");
            assert!(
                (row.activity_sum - sum).abs() < 1e-6,
                "{label}: {} against {sum}",
                row.activity_sum
            );
            assert_eq!(row.mem_max_mib, mem.map(|m| m as f64), "{label}");
        }
        assert_idle_workloads_match(&store, w, &live, now(), from).await;
    }
}

both!(live_pushes_move_day_rows_as_their_hours_changed);

both!(
    edge_days_from_day_rows_match_their_hours,
    used_by_rollup_equals_recomputation_on_random_fleets,
    allocations_found_by_start_or_end_hold_the_same_hours,
    group_rollups_equal_per_gpu_rows_on_random_fleets,
    settled_answers_are_read_again_after_each_change,
    todays_kept_counts_follow_every_write,
);

/// The answers kept over settled days (`settled` in the store) are served while nothing
/// changed, and read again after each kind of change: a late sample on an old day, a change of
/// owner mid-day with a model without a rate, the refresher's rebuild; each time they equal
/// the figures read with every day listed as changed.
async fn settled_answers_are_read_again_after_each_change(store: Store) {
    push_random_fleets(&store).await;
    store.refresh_groups(now().timestamp()).await.unwrap();
    assert_eq!(store.dirty_group_days().await.unwrap(), 0);
    let (from, to) = RANDOM_FLEET_WINDOWS[0];
    let w = hours_window(from, to);
    let vision = Filters {
        team: vec!["vision".into()],
        ..Default::default()
    };
    let figures = || async {
        let mut all = String::new();
        for f in [Filters::default(), vision.clone()] {
            all.push_str(&group_figures(&store, w, &f).await);
        }
        all
    };
    let reference = || async {
        // Every day listed: nothing kept is used; then rebuilt, so the next answers are kept.
        store.mark_all_groups_dirty().await.unwrap();
        let r = figures().await;
        store.refresh_groups(now().timestamp()).await.unwrap();
        r
    };
    let first = figures().await;
    assert!(store.settled_answers() > 0, "answers are kept");
    assert_eq!(figures().await, first, "kept answers are served as read");
    let mut last = first;
    let g0 = "GPU-00000001-0000-0000-0000-000000000001";
    for (who_, body) in [
        (
            "prop-3",
            r#"{"samples":[{"gpu_uuid":"GPU-00000003-0000-0000-0000-000000000003","ts":"2026-11-26T03:10:00Z","util_pct":97}]}"#.to_string(),
        ),
        (
            "prop-1",
            format!(r#"{{"gpus":[{{"uuid":"{g0}","model":"Mystery GPU","labels":{{"team":"vision"}},"observed_at":"2026-11-27T07:30:00Z"}}]}}"#),
        ),
    ] {
        let out = push(&store, &who(who_, None), &body).await;
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
        let pending = figures().await;
        let expected = reference().await;
        assert_close_debug(&pending, &expected, &format!("{who_}: before the refresh"));
        assert_ne!(expected, last, "{who_}: the change shows");
        // After the refresh (the reference ran it): read again, then kept.
        assert_close_debug(&figures().await, &expected, &format!("{who_}: after"));
        assert_close_debug(&figures().await, &expected, &format!("{who_}: kept"));
        last = expected;
    }
}

/// Today's per-GPU counts kept between requests (on PostgreSQL, `live` in the store): after
/// each write of a series that lands on today, the fleet's per-GPU window counts, summary and
/// daily trend equal every row joined to its owner period. The writes: samples before and
/// ahead of the clock, an allocation, a change of owner within today, a new GPU, a GPU moved
/// to another host, a label and a sample that change a GPU's row alone, the hours ahead of
/// the clock of a stopped host removed. The GPU lists and today's activity evidence, kept the
/// same way, equal the same read whole after each write.
async fn todays_kept_counts_follow_every_write(store: Store) {
    push_random_fleets(&store).await;
    // "Now" is within the random fleets' week: today is 2026-11-28, 10:30.
    let clock = t("2026-11-28T10:30:00Z");
    let windows = [
        hours_window("2026-11-25T00:00:00Z", "2026-11-28T10:30:00Z"),
        hours_window("2026-11-26T07:00:00Z", "2026-11-28T10:30:00Z"),
    ];
    let check = |at: String| {
        let store = store.clone();
        async move {
            for w in windows {
                assert_window_figures_match(&store, w, clock, &at).await;
            }
            assert_kept_lists_match(&store, clock, &at).await;
        }
    };
    check("first read".into()).await;
    check("nothing changed".into()).await;
    let g = |seed: u64, i: u64| format!("GPU-{seed:08x}-0000-0000-0000-{i:012x}");
    let sample = |uuid: &str, ts: &str, util: u32, mem: u32| {
        format!(
            r#"{{"samples":[{{"gpu_uuid":"{uuid}","ts":"{ts}","util_pct":{util},"mem_used_mib":{mem}}}]}}"#
        )
    };
    let new_gpu = "GPU-0000000a-0000-0000-0000-00000000000a";
    let writes: Vec<(&str, String)> = vec![
        ("prop-1", sample(&g(1, 1), "2026-11-28T09:40:00Z", 3, 100)),
        ("prop-1", sample(&g(1, 1), "2026-11-28T10:10:00Z", 90, 200)),
        // Ahead of the clock, with the day's peak memory.
        (
            "prop-2",
            sample(&g(2, 3), "2026-11-28T13:30:00Z", 1, 39_999),
        ),
        (
            "prop-2",
            format!(
                r#"{{"allocations":[{{"gpu_uuid":"{}","start":"2026-11-28T08:00:00Z","workload":"late","kind":"pod","team":"nlp"}}]}}"#,
                g(2, 4)
            ),
        ),
        // A change of owner within today: the day is split.
        (
            "prop-3",
            format!(
                r#"{{"gpus":[{{"uuid":"{}","model":"Tesla T4","labels":{{"team":"infra"}},"observed_at":"2026-11-28T07:00:00Z"}}]}}"#,
                g(3, 0)
            ),
        ),
        // Then a sample onto its split day.
        ("prop-3", sample(&g(3, 0), "2026-11-28T08:20:00Z", 2, 10)),
        (
            "prop-4",
            format!(
                r#"{{"gpus":[{{"uuid":"{new_gpu}","model":"Tesla T4","host":"new-host","observed_at":"2026-11-28T06:00:00Z"}}],"samples":[{{"gpu_uuid":"{new_gpu}","ts":"2026-11-28T06:05:00Z","util_pct":50}},{{"gpu_uuid":"{new_gpu}","ts":"2026-11-28T10:58:00Z","util_pct":60}}]}}"#
            ),
        ),
        (
            "prop-4",
            format!(
                r#"{{"gpus":[{{"uuid":"{}","model":"Tesla T4","host":"moved-1","observed_at":"2026-11-28T09:00:00Z"}}]}}"#,
                g(4, 0)
            ),
        ),
        ("prop-1", sample(&g(1, 2), "2026-11-28T10:25:00Z", 0, 5)),
        // A GPU's row alone: a label that names no owner, and a sample after its last seen.
        (
            "prop-1",
            format!(
                r#"{{"gpus":[{{"uuid":"{}","model":"Tesla T4","labels":{{"rack":"r7"}},"observed_at":"2026-11-28T10:00:00Z"}}]}}"#,
                g(1, 3)
            ),
        ),
        ("prop-1", sample(&g(1, 3), "2026-12-01T06:00:00Z", 40, 7)),
    ];
    for (n, (source, body)) in writes.iter().enumerate() {
        let out = push(&store, &who(source, None), body).await;
        assert!(out.rejected.is_empty(), "write {n}: {:?}", out.rejected);
        let before = store.kept_reads(KeptKind::Today);
        check(format!("after write {n}: {body}")).await;
        let after = store.kept_reads(KeptKind::Today);
        if store.backend() == gpuledger_store::Backend::Postgres {
            // The first read after the write notices it: today's rows read whole or brought
            // up to date, never only served as kept.
            assert!(
                after[0] + after[1] > before[0] + before[1],
                "write {n} not noticed: {before:?} {after:?}"
            );
        }
        check(format!("after write {n}, again")).await;
    }
    // The new GPU's stale window runs past the clock from 11:00; its host stops before: those
    // hour rows are removed.
    let stopper = gpuledger_store::Principal {
        source: "prop-4".into(),
        teams: None,
        kind: "pull".into(),
    };
    let gone = store
        .observe_host_stopped(&stopper, "new-host", None, t("2026-11-28T10:59:00Z"))
        .await
        .unwrap();
    assert!(
        gone >= 1,
        "the stopped host's hours ahead of the clock: {gone}"
    );
    check("after a stopped host".into()).await;
    // On a day no GPU's owner changes and no hour ahead of the clock holds a peak, a read
    // with nothing written since is served as kept.
    let quiet = t("2026-12-01T12:30:00Z");
    let w = hours_window("2026-11-29T00:00:00Z", "2026-12-01T12:30:00Z");
    assert_window_figures_match(&store, w, quiet, "a quiet day").await;
    assert_kept_lists_match(&store, quiet, "a quiet day").await;
    let kinds = [KeptKind::Today, KeptKind::Lists, KeptKind::Evidence];
    let before = kinds.map(|k| store.kept_reads(k));
    if store.backend() == gpuledger_store::Backend::Postgres {
        // Every row the writes touched counts as written since a read until no writing
        // transaction older than the writes runs (other tests' on the same server): read
        // again until then, a minute at most.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            assert_window_figures_match(&store, w, quiet, "a quiet day, again").await;
            assert_kept_lists_match(&store, quiet, "a quiet day, again").await;
            let kept = kinds.map(|k| store.kept_reads(k)[2]);
            if kept.iter().zip(&before).all(|(k, b)| *k > b[2]) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never served as kept: {:?}",
                kinds.map(|k| store.kept_reads(k))
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        // Today's rows brought up to date after most writes (read whole after those that
        // bump the generation); those and the GPU lists and today's activity evidence then
        // served as kept, none read whole.
        let at_least = [writes.len() as u64 / 2, 1, 1];
        for ((kind, before), least) in kinds.into_iter().zip(before).zip(at_least) {
            let [whole, some, kept, _] = store.kept_reads(kind);
            let counts = format!("{kind:?}: {whole} {some} {kept}");
            assert!(some >= least, "brought up to date: {counts}");
            assert_eq!(whole, before[0], "nothing read whole: {counts}");
        }
        // With no transaction ended since the last read anywhere on the server (other tests
        // write to it too: read again until one such pair of reads happens, a minute at most),
        // each kind is served as kept without a scan for what changed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let all = Filters::default();
        let fresh = store.without_kept();
        loop {
            let before = kinds.map(|k| store.kept_reads(k)[3]);
            let mut served = Vec::new();
            for _ in 0..2 {
                served.push((
                    sorted_debug(&store.gpu_windows(w, &all, quiet).await.unwrap()),
                    sorted_debug(&store.list_gpus(&all, false, quiet).await.unwrap()),
                    sorted_debug(&store.activity_evidence(&all, quiet).await.unwrap()),
                ));
            }
            let read = (
                sorted_debug(&fresh.gpu_windows(w, &all, quiet).await.unwrap()),
                sorted_debug(&fresh.list_gpus(&all, false, quiet).await.unwrap()),
                sorted_debug(&fresh.activity_evidence(&all, quiet).await.unwrap()),
            );
            for one in &served {
                assert_close_debug(one, &read, "a quiet day, unscanned");
            }
            let after = kinds.map(|k| store.kept_reads(k)[3]);
            if after.iter().zip(&before).all(|(a, b)| a > b) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never served without a scan: {:?}",
                kinds.map(|k| store.kept_reads(k))
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    } else {
        assert_window_figures_match(&store, w, quiet, "a quiet day, again").await;
        assert_kept_lists_match(&store, quiet, "a quiet day, again").await;
    }
}

/// Each of `rows` printed, in order of the print.
fn sorted_debug<T: std::fmt::Debug>(rows: &[T]) -> Vec<String> {
    let mut out: Vec<String> = rows.iter().map(|r| format!("{r:?}")).collect();
    out.sort();
    out
}

/// The GPU lists (with MIG instances, without, brief) and the activity evidence, which
/// PostgreSQL keeps between requests (`live` in the store) and filters in memory, and used-by,
/// which reads its rates from the kept list, equal the same read from the database by a handle
/// keeping nothing (the filters applied by SQL), with and without filters: by team, by model
/// and vendor, and by a cloud no GPU has (a NULL passes no filter).
async fn assert_kept_lists_match(store: &Store, now: DateTime<Utc>, at: &str) {
    let fresh = store.without_live();
    let infra = Filters {
        team: vec!["infra".into()],
        ..Default::default()
    };
    let models = Filters {
        model: vec!["Tesla T4".into(), "Mystery GPU".into()],
        vendor: vec!["nvidia".into()],
        ..Default::default()
    };
    let cloud = Filters {
        cloud: vec!["aws".into()],
        ..Default::default()
    };
    for filters in [Filters::default(), infra, models, cloud] {
        for mig in [true, false] {
            let kept = store.list_gpus(&filters, mig, now).await.unwrap();
            let read = fresh.list_gpus(&filters, mig, now).await.unwrap();
            assert!(!read.is_empty() || !filters.is_empty(), "{at}: no GPUs");
            assert_eq!(kept, read, "{at}: GPU list, MIG {mig}, {filters:?}");
            let (total, page) = store
                .list_gpus_page(&filters, mig, |n| n / 3..n / 2, now)
                .await
                .unwrap();
            assert_eq!(total, read.len(), "{at}: GPUs listed in pages");
            assert_eq!(
                page,
                read[total / 3..total / 2],
                "{at}: a page of the GPU list, MIG {mig}, {filters:?}"
            );
        }
        let kept = store.list_gpus_brief(&filters, now).await.unwrap();
        let read = fresh.list_gpus_brief(&filters, now).await.unwrap();
        assert_eq!(kept, read, "{at}: brief GPU list, {filters:?}");
        let mut kept = store.activity_evidence(&filters, now).await.unwrap();
        let mut read = fresh.activity_evidence(&filters, now).await.unwrap();
        kept.sort_by(|a, b| a.0.cmp(&b.0));
        read.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(kept, read, "{at}: activity evidence, {filters:?}");
        // Used-by, whose rates come from the kept list.
        let w = Window {
            from: now.timestamp() - 3 * 86_400,
            to: now.timestamp(),
        };
        let kept = store.used_by_cost(w, &filters, now).await.unwrap();
        let read = fresh.used_by_cost(w, &filters, now).await.unwrap();
        assert_eq!(kept, read, "{at}: used-by, {filters:?}");
    }
}

/// `a` and `b` print the same but for numbers, which may differ by a float summed in another
/// order (relative 1e-9).
fn assert_close_debug(a: &impl std::fmt::Debug, b: &impl std::fmt::Debug, at: &str) {
    fn tokens(s: &str) -> Vec<(bool, String)> {
        let mut out: Vec<(bool, String)> = Vec::new();
        let cs: Vec<char> = s.chars().collect();
        let mut i = 0;
        while i < cs.len() {
            let starts_number = cs[i].is_ascii_digit()
                || (cs[i] == '-' && cs.get(i + 1).is_some_and(|c| c.is_ascii_digit()));
            if starts_number {
                let mut j = i + 1;
                while j < cs.len()
                    && (cs[j].is_ascii_digit()
                        || cs[j] == '.'
                        || cs[j] == 'e'
                        || (cs[j] == '-' && cs[j - 1] == 'e'))
                {
                    j += 1;
                }
                out.push((true, cs[i..j].iter().collect()));
                i = j;
            } else {
                let mut j = i + 1;
                while j < cs.len() && !cs[j].is_ascii_digit() && cs[j] != '-' {
                    j += 1;
                }
                out.push((false, cs[i..j].iter().collect()));
                i = j;
            }
        }
        out
    }
    let (sa, sb) = (format!("{a:?}"), format!("{b:?}"));
    let (ta, tb) = (tokens(&sa), tokens(&sb));
    let same = ta.len() == tb.len()
        && ta.iter().zip(&tb).all(|((na, a), (nb, b))| {
            if *na && *nb {
                match (a.parse::<f64>(), b.parse::<f64>()) {
                    (Ok(x), Ok(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
                    _ => a == b,
                }
            } else {
                a == b
            }
        });
    assert!(same, "{at}:\n{sa}\nvs\n{sb}");
}

/// Everything the group rollups answer for window `w` and `filters`: the daily and hourly
/// trends, the heatmap, the forecast's days and the total's forecast; and what is read from
/// settled days kept between requests (`settled` in the store): the allocated-idle workloads
/// (in name order), used-by and the per-GPU window counts.
async fn group_figures(store: &Store, w: Window, filters: &Filters) -> String {
    let daily = store.series(w, filters, true, now()).await.unwrap();
    let hourly = store.series(w, filters, false, now()).await.unwrap();
    let heat = store.heatmap(w, filters, now()).await.unwrap();
    let days = store.forecast_days(w, filters, now()).await.unwrap();
    let total = store.forecast_total(filters, now()).await.unwrap();
    let mut idle = store.idle_workloads(w, filters, now()).await.unwrap();
    idle.sort_by(|a, b| {
        (&a.workload, &a.used_by, &a.owner).cmp(&(&b.workload, &b.used_by, &b.owner))
    });
    let used = store.used_by_cost(w, filters, now()).await.unwrap();
    let windows = store.gpu_windows(w, filters, now()).await.unwrap();
    let mut evidence = store.activity_evidence(filters, now()).await.unwrap();
    evidence.sort_by(|a, b| a.0.cmp(&b.0));
    format!(
        "{daily:?}\n{hourly:?}\n{heat:?}\n{days:?}\n{total:?}\n{idle:?}\n{used:?}\n{windows:?}\n\
         {evidence:?}"
    )
}

/// The filters the group rollups are checked under: none, owner teams (one of them the team
/// a GPU moves to mid-day), an environment, attributes and a mix.
fn group_filters() -> Vec<Filters> {
    let f = |k: &str, v: &[&str]| {
        let mut f = Filters::default();
        *f.values_mut(k).unwrap() = v.iter().map(|s| s.to_string()).collect();
        f
    };
    let mut mixed = f("team", &["vision", "unassigned"]);
    mixed.model = vec!["Tesla T4".into(), "NVIDIA A100-SXM4-40GB".into()];
    vec![
        Filters::default(),
        f("team", &["vision"]),
        f("env", &["unknown", "prod"]),
        f("model", &["Tesla T4"]),
        f("vendor", &["nvidia"]),
        f("cloud", &["aws"]),
        mixed,
    ]
}

/// Property: the fleet-wide per-day and per-hour figures read from the group rollups equal the
/// same figures read from the per-GPU rows (every day listed dirty), on random fleets, for
/// whole days, edges and every filter; and after changes the refresher has not seen yet (a
/// change of owner mid-day, a GPU's model and so its group and rate, a late sample on an old
/// day), the days those changes touch are read from the per-GPU rows until it has. The answers
/// kept over settled days are held to the same: read again after each change.
async fn group_rollups_equal_per_gpu_rows_on_random_fleets(store: Store) {
    push_random_fleets(&store).await;
    let check = |label: &'static str| {
        let store = store.clone();
        async move {
            let mut got = Vec::new();
            for (from, to) in RANDOM_FLEET_WINDOWS {
                for filters in group_filters() {
                    got.push((
                        format!("{label} {from}–{to} {filters:?}"),
                        group_figures(&store, hours_window(from, to), &filters).await,
                    ));
                }
            }
            got
        }
    };
    let compare = |a: &[(String, String)], b: &[(String, String)]| {
        assert_eq!(a.len(), b.len());
        for ((at, x), (_, y)) in a.iter().zip(b) {
            assert_close_debug(&x, &y, at);
        }
    };
    assert!(
        store.dirty_group_days().await.unwrap() >= 7,
        "pushes list their days"
    );
    let reference = check("per-GPU rows").await;
    let week = hours_window(RANDOM_FLEET_WINDOWS[0].0, RANDOM_FLEET_WINDOWS[0].1);
    let hours = |filters: Filters| {
        let store = store.clone();
        async move {
            let s = store.series(week, &filters, true, now()).await.unwrap();
            s.iter().map(|p| p.gpu_hours).sum::<i64>()
        }
    };
    for filters in group_filters() {
        let n = hours(filters.clone()).await;
        assert!(
            n > 0 || filters.cloud == ["aws"],
            "{filters:?} selects hours: {n}"
        );
    }
    let rebuilt = store.refresh_groups(now().timestamp()).await.unwrap();
    assert!(rebuilt >= 7, "{rebuilt}");
    // The fleets have no hour on `now`'s day, the one day never rebuilt.
    assert_eq!(store.dirty_group_days().await.unwrap(), 0);
    compare(&check("group rows").await, &reference);
    // No day is listed now: answers over settled days are kept, and served again unchanged.
    assert!(store.settled_answers() > 0);
    compare(&check("group rows, kept").await, &reference);

    // Changes behind the refresher's back: each is read from the per-GPU rows at once.
    let before = reference;
    let p = who("prop-1", None);
    let g0 = "GPU-00000001-0000-0000-0000-000000000001";
    for body in [
        // A change of owner in the middle of an old day.
        format!(r#"{{"gpus":[{{"uuid":"{g0}","model":"Mystery GPU","labels":{{"team":"vision"}},"observed_at":"2026-11-27T07:30:00Z"}}]}}"#),
        // A late sample on an old day.
        r#"{"samples":[{"gpu_uuid":"GPU-00000003-0000-0000-0000-000000000003","ts":"2026-11-26T03:10:00Z","util_pct":3}]}"#.to_string(),
    ] {
        let out = push(&store, &p, &body).await;
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    }
    // A GPU's model, so its group and its rate (the mystery model has none).
    let g4 = "GPU-00000004-0000-0000-0000-000000000004";
    let out = push(
        &store,
        &who("prop-4", None),
        &format!(r#"{{"gpus":[{{"uuid":"{g4}","model":"Tesla T4","observed_at":"2026-12-02T11:00:00Z"}}]}}"#),
    )
    .await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert!(store.dirty_group_days().await.unwrap() > 1);
    let pending = check("pending refresh").await;
    store.mark_all_groups_dirty().await.unwrap();
    let reference = check("per-GPU rows after the changes").await;
    compare(&pending, &reference);
    // The changes move figures the group rows held (else stale rows would pass unseen): the
    // team the GPU moved to, the model it took, the day of the late sample.
    for (i, ((at, x), (_, y))) in before.iter().zip(&reference).enumerate() {
        let n = group_filters().len();
        if matches!(i % n, 0 | 1 | 3) && i < 2 * n {
            assert_ne!(x, y, "{at}: the changes show");
        }
    }
    store.refresh_groups(now().timestamp()).await.unwrap();
    compare(&check("group rows after the changes").await, &reference);
}

/// Regression: on PostgreSQL a cached statement first run with a NULL float (a GPU without a
/// rate, a sample without `util_pct`) refused every later value on that connection
/// ("incorrect binary data format in bind parameter").
async fn regression_a_null_float_does_not_break_later_writes(store: Store) {
    let p = who("lab", None);
    for round in 0..6 {
        let (model, util) = if round % 2 == 0 {
            ("Mystery GPU", "null")
        } else {
            ("Tesla T4", "42.5")
        };
        let uuid = format!("GPU-abcdef{round:02}-0000-0000-0000-000000000000");
        let samples: Vec<String> = (0..40)
            .map(|m| {
                format!(
                    r#"{{"gpu_uuid":"{uuid}","ts":"2026-12-02T{:02}:{:02}:00Z","util_pct":{util},"power_w":70}}"#,
                    8 + m / 60,
                    m % 60
                )
            })
            .collect();
        let out = push(
            &store,
            &p,
            &format!(
                r#"{{"gpus":[{{"uuid":"{uuid}","model":"{model}","observed_at":"2026-12-02T08:00:00Z"}}],"samples":[{}]}}"#,
                samples.join(",")
            ),
        )
        .await;
        assert!(out.rejected.is_empty(), "round {round}: {:?}", out.rejected);
        assert_eq!(out.accepted.samples, 40, "round {round}");
    }
}

both!(regression_a_null_float_does_not_break_later_writes);

/// The hourly maintenance's planner statistics run on both backends (PostgreSQL's ANALYZE
/// names every table that grows with the fleet; a missing one would fail here).
async fn maintenance_refreshes_planner_statistics(store: Store) {
    push(&store, &who("hand", None), SCENARIO).await;
    store.analyze().await.unwrap();
    store.prune(now().timestamp()).await.unwrap();
    store.analyze().await.unwrap();
    // The benchmark's vacuum after a bulk load, outside any transaction.
    store.vacuum().await.unwrap();
}

both!(maintenance_refreshes_planner_statistics);

/// The notifier's delivery log is kept as long as the audit log, then pruned with it.
async fn the_delivery_log_is_pruned_with_the_audit_log(store: Store) {
    let at = |s: &str| gpuledger_store::Delivery {
        at: t(s),
        key: "stale_source:rack-7".into(),
        event: "new".into(),
        audience: "email:ops@example.com".into(),
        channel: "smtp".into(),
        recipient: "email:ops@example.com".into(),
        subject: "Source rack-7 is stale".into(),
        outcome: "sent".into(),
        attempts: 1,
        error: None,
    };
    let days = Settings::default().audit_retention_days;
    let old = now() - Duration::days(days + 1);
    store.log_delivery(&at(&old.to_rfc3339())).await.unwrap();
    store
        .log_delivery(&at("2026-12-02T11:00:00Z"))
        .await
        .unwrap();
    assert_eq!(
        store
            .sent_since("email:ops@example.com", now().timestamp() - 3600)
            .await
            .unwrap(),
        1
    );
    store.prune(now().timestamp()).await.unwrap();
    let left = store.deliveries(10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].at, t("2026-12-02T11:00:00Z"));
}

both!(the_delivery_log_is_pruned_with_the_audit_log);

/// A store in a fresh schema `{prefix}_<pid>` of the test database, and a pool of one
/// connection whose `search_path` is that schema, for a test that reads the tables
/// themselves; with the database's URL and the schema's name. `None` where PostgreSQL is not
/// set up and not required ([`pg_url`]).
async fn postgres_schema(
    name: &str,
    prefix: &str,
) -> Option<(Store, sqlx::AnyPool, String, String)> {
    use sqlx::Executor;
    let url = pg_url(name)?;
    let schema = format!("{prefix}_{}", std::process::id());
    Store::drop_schema(&url, &schema).await.unwrap();
    let store = Store::open_in_schema(&url, Some(&schema), Settings::default())
        .await
        .unwrap();
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    pool.execute(format!("SET search_path TO {schema}").as_str())
        .await
        .unwrap();
    Some((store, pool, url, schema))
}

/// Used-by's and the allocated-idle workloads' shares of the hours ahead of the clock are kept
/// between requests on PostgreSQL (`live` in the store): they follow an idle sample ahead of
/// the clock, a new allocation, an allocation that ends and an allocation removed (which
/// leaves no row behind: the removal bumps the kept answers' generation), always equal to the
/// same read by a handle that keeps nothing.
#[tokio::test]
async fn postgres_kept_shares_ahead_follow_allocations() {
    use sqlx::Executor;
    let Some((store, pool, _url, _schema)) =
        postgres_schema("postgres_kept_shares_ahead_follow_allocations", "t_ahead").await
    else {
        return;
    };
    push(&store, &who("hand", None), SCENARIO).await;
    let clock = t("2026-12-01T14:30:00Z");
    let w = Window {
        from: clock.timestamp() - 3 * 86_400,
        to: clock.timestamp(),
    };
    let fresh = store.without_live();
    let check = |at: &'static str| {
        let (store, fresh) = (store.clone(), fresh.clone());
        async move {
            for _ in 0..2 {
                let kept = store
                    .used_by_cost(w, &Filters::default(), clock)
                    .await
                    .unwrap();
                let read = fresh
                    .used_by_cost(w, &Filters::default(), clock)
                    .await
                    .unwrap();
                assert!(!read.is_empty(), "{at}: no used-by");
                assert_eq!(kept, read, "{at}: used-by");
                // A team filter is taken from the whole fleet's kept shares too.
                for team in ["", "nlp", "infra", "vision"] {
                    let filters = Filters {
                        team: [team]
                            .iter()
                            .filter(|t| !t.is_empty())
                            .map(|t| t.to_string())
                            .collect(),
                        ..Default::default()
                    };
                    let kept = store.idle_workloads(w, &filters, clock).await.unwrap();
                    let read = fresh.idle_workloads(w, &filters, clock).await.unwrap();
                    assert_eq!(kept, read, "{at}: allocated-idle workloads {filters:?}");
                }
            }
        }
    };
    check("first read").await;
    let [whole, ..] = store.kept_reads(KeptKind::Ahead);
    assert!(whole >= 1, "the hours ahead were not kept: {whole}");
    // An idle hour of B ahead of the clock (pushed after it, so not in the future then).
    let idle = r#"{"samples":[{"gpu_uuid":"GPU-bbbbbbbb-0000-0000-0000-000000000002",
        "ts":"2026-12-01T16:10:00Z","util_pct":1}]}"#;
    let out = push(&store, &who("hand", None), idle).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    check("after an idle hour ahead").await;
    let idle_ahead = store
        .idle_workloads(w, &Filters::default(), clock)
        .await
        .unwrap();
    // At the day's end the idle hour is in the window: it is in today's day rows.
    let idle_all = store
        .idle_workloads(
            Window {
                from: w.from,
                to: t("2026-12-02T00:00:00Z").timestamp(),
            },
            &Filters::default(),
            t("2026-12-02T00:00:00Z"),
        )
        .await
        .unwrap();
    let hours = |x: &[gpuledger_ledger::waste::IdleWorkload]| {
        x.iter().map(|x| x.allocated_idle_hours).sum::<f64>()
    };
    assert!(
        hours(&idle_all) > hours(&idle_ahead),
        "the idle hour ahead of the clock is not taken out: {idle_all:?} {idle_ahead:?}"
    );
    let [whole, ..] = store.kept_reads(KeptKind::IdleAhead);
    assert!(whole >= 1, "the idle hours ahead were not kept: {whole}");
    let writes = [
        // A second holder of B's hours, on the MIG instance of A, and one that has ended.
        r#"{"allocations":[
          {"gpu_uuid":"GPU-bbbbbbbb-0000-0000-0000-000000000002","start":"2026-12-01T13:00:00Z",
           "end":null,"workload":"shared","kind":"pod","team":"infra"},
          {"gpu_uuid":"MIG-aaaaaaaa-0000-0000-0000-0000000000a1","start":"2026-12-01T12:00:00Z",
           "end":null,"workload":"mig-job","kind":"pod","team":"nlp"}]}"#,
        r#"{"allocations":[
          {"gpu_uuid":"GPU-bbbbbbbb-0000-0000-0000-000000000002","start":"2026-12-01T13:00:00Z",
           "end":"2026-12-01T14:10:00Z","workload":"shared","kind":"pod","team":"infra"}]}"#,
    ];
    for (n, body) in writes.iter().enumerate() {
        let out = push_at(&store, &who("hand", None), body, clock).await;
        assert!(out.rejected.is_empty(), "write {n}: {:?}", out.rejected);
        check("after a write").await;
    }
    let before = store.live_generation().await.unwrap();
    pool.execute("DELETE FROM allocations WHERE workload = 'mig-job'")
        .await
        .unwrap();
    assert!(
        store.live_generation().await.unwrap() > before,
        "a removed allocation leaves the kept answers' generation as it was"
    );
    check("after a removed allocation").await;
    for kind in [
        KeptKind::Ahead,
        KeptKind::IdleAhead,
        KeptKind::IdleToday,
        KeptKind::HeldToday,
    ] {
        let [_, some, kept, _] = store.kept_reads(kind);
        assert!(
            some >= 1 && kept >= 1,
            "{kind:?}: brought up to date {some}, served as kept {kept}"
        );
    }
}

/// A fleet with every hour of yesterday and of today up to `now()` (2026-12-02 12:00): four
/// physical GPUs of two teams and models, one MIG instance, hours busy, idle and unmeasured,
/// one allocation across today.
fn fleet_of_today() -> String {
    let mut gpus = Vec::new();
    let mut samples = Vec::new();
    for g in 1..=4 {
        let (model, team) = if g % 2 == 0 {
            ("Tesla T4", "vision")
        } else {
            ("NVIDIA A100-SXM4-40GB", "nlp")
        };
        let uuid = format!("GPU-0000000{g}-1111-0000-0000-000000000000");
        gpus.push(format!(
            r#"{{"uuid":"{uuid}","model":"{model}","host":"h{g}","cloud":"aws","labels":{{"team":"{team}","env":"prod"}},"observed_at":"2026-12-01T00:00:00Z"}}"#
        ));
        for day in 1..=2 {
            for hour in 0..24 {
                if day == 2 && hour >= 12 || (g + hour) % 5 == 0 {
                    continue;
                }
                let util = (g * 37 + hour * 11 + day) % 100;
                samples.push(format!(
                    r#"{{"gpu_uuid":"{uuid}","ts":"2026-12-0{day}T{hour:02}:20:00Z","util_pct":{util}}}"#
                ));
            }
        }
    }
    gpus.push(
        r#"{"uuid":"MIG-00000001-1111-0000-0000-0000000000a1","model":"NVIDIA A100-SXM4-40GB","host":"h1","mig_parent_uuid":"GPU-00000001-1111-0000-0000-000000000000","labels":{"team":"nlp"},"observed_at":"2026-12-01T00:00:00Z"}"#.to_string(),
    );
    samples.push(
        r#"{"gpu_uuid":"MIG-00000001-1111-0000-0000-0000000000a1","ts":"2026-12-02T04:20:00Z","util_pct":90}"#.to_string(),
    );
    format!(
        r#"{{"gpus":[{}],"samples":[{}],"allocations":[{{"gpu_uuid":"GPU-00000002-1111-0000-0000-000000000000","start":"2026-12-01T20:00:00Z","end":null,"workload":"train","kind":"pod","team":"vision"}}]}}"#,
        gpus.join(","),
        samples.join(",")
    )
}

/// PostgreSQL: the group rows of today's finished hours (`Store::refresh_group_hours`) give
/// the per-hour figures (the hourly trend, the heatmap) the per-GPU rows give, for windows
/// over and within today and every filter of the group rollups' property (and the daily
/// trend's point of today, summed from today's kept rows, the one read); they are what is
/// read (a group row changed by hand shows); and each kind of change takes the hours it
/// touches off the list at once, so the figures stay those of the per-GPU rows before the
/// refresher has been through: a late sample, a change of owner and of model, an allocation
/// and an hour row removed by SQL.
#[tokio::test]
async fn postgres_clean_hours_of_today_follow_changes() {
    use sqlx::Executor;
    let Some((store, pool, _url, _schema)) =
        postgres_schema("postgres_clean_hours_of_today_follow_changes", "t_clean").await
    else {
        return;
    };
    push(&store, &who("hand", None), &fleet_of_today()).await;
    let windows = [
        Window {
            from: t("2026-12-01T05:00:00Z").timestamp(),
            to: now().timestamp(),
        },
        Window {
            from: t("2026-12-02T03:00:00Z").timestamp(),
            to: t("2026-12-02T09:30:00Z").timestamp(),
        },
    ];
    let check = |daily_too: bool| {
        let store = store.clone();
        async move {
            let mut got = Vec::new();
            for w in windows {
                for filters in group_filters() {
                    let hourly = store.series(w, &filters, false, now()).await.unwrap();
                    let heat = store.heatmap(w, &filters, now()).await.unwrap();
                    // The daily trend of a window ending now sums today's point from today's
                    // per-GPU rows; a second earlier, the same hours are read from the hour
                    // and day rows.
                    let daily = store.series(w, &filters, true, now()).await.unwrap();
                    let before = Window { to: w.to - 1, ..w };
                    let read = store.series(before, &filters, true, now()).await.unwrap();
                    assert!(!daily.is_empty());
                    // The same for the forecast's days.
                    let sorted = |mut d: Vec<gpuledger_ledger::forecast::DayRow>| {
                        d.sort_by(|a, b| {
                            (a.day, &a.team, &a.env, &a.cloud, &a.model)
                                .cmp(&(b.day, &b.team, &b.env, &b.cloud, &b.model))
                        });
                        d
                    };
                    let days = sorted(store.forecast_days(w, &filters, now()).await.unwrap());
                    let days_read =
                        sorted(store.forecast_days(before, &filters, now()).await.unwrap());
                    if daily_too {
                        assert_close_debug(&daily, &read, &format!("daily {w:?} {filters:?}"));
                        assert_close_debug(&days, &days_read, &format!("days {w:?} {filters:?}"));
                    }
                    got.push((
                        format!("{w:?} {filters:?}"),
                        format!("{hourly:?}\n{heat:?}\n{daily:?}"),
                    ));
                }
            }
            got
        }
    };
    let compare = |a: &[(String, String)], b: &[(String, String)], when: &str| {
        assert_eq!(a.len(), b.len());
        for ((at, x), (_, y)) in a.iter().zip(b) {
            assert_close_debug(&x, &y, &format!("{when}: {at}"));
        }
    };
    // Reference: every hour read from the per-GPU rows, then everything rebuilt.
    let reference = |daily_too: bool| {
        let store = store.clone();
        async move {
            store.mark_all_groups_dirty().await.unwrap();
            assert!(store.clean_group_hours().await.unwrap().is_empty());
            let figures = check(daily_too).await;
            store.refresh_groups(now().timestamp()).await.unwrap();
            // Hours 00:00 to 10:00 have ended two minutes ago or more; 11:00 has not. They
            // are built a few at a time, oldest first.
            let mut built = Vec::new();
            loop {
                match store.refresh_group_hours(now().timestamp()).await.unwrap() {
                    0 => break,
                    n => built.push(n),
                }
            }
            assert_eq!(built, [4, 4, 3]);
            figures
        }
    };
    let expected = reference(true).await;
    let today = t("2026-12-02T00:00:00Z").timestamp();
    let all: Vec<i64> = (0..11).map(|h| today + h * 3600).collect();
    assert_eq!(store.clean_group_hours().await.unwrap(), all);
    assert_eq!(
        store.refresh_group_hours(now().timestamp()).await.unwrap(),
        0
    );
    compare(&check(true).await, &expected, "group rows of today's hours");

    // They are what is read: a group row of 05:00 changed by hand shows in the figures.
    pool.execute(
        format!(
            "UPDATE group_hours SET act = act + 1000 WHERE hour = {}",
            today + 5 * 3600
        )
        .as_str(),
    )
    .await
    .unwrap();
    let tampered = check(true).await;
    assert_ne!(tampered[0].1, expected[0].1, "the group rows are not read");
    assert_eq!(store.clean_group_hours().await.unwrap(), all);
    pool.execute(
        format!(
            "DELETE FROM group_clean_hours WHERE hour = {}",
            today + 5 * 3600
        )
        .as_str(),
    )
    .await
    .unwrap();
    compare(&check(true).await, &expected, "an hour off the list");
    assert_eq!(
        store.refresh_group_hours(now().timestamp()).await.unwrap(),
        1
    );
    compare(&check(true).await, &expected, "rebuilt");

    let g1 = "GPU-00000001-1111-0000-0000-000000000000";
    let g2 = "GPU-00000002-1111-0000-0000-000000000000";
    let changes = [
        // A late sample in a finished hour: that hour alone leaves the list.
        (
            format!(
                r#"{{"samples":[{{"gpu_uuid":"{g1}","ts":"2026-12-02T03:50:00Z","util_pct":1}}]}}"#
            ),
            Some(vec![today + 3 * 3600]),
        ),
        // A change of owner within today: the hours of that GPU's rows.
        (
            format!(
                r#"{{"gpus":[{{"uuid":"{g1}","model":"NVIDIA A100-SXM4-40GB","host":"h1","cloud":"aws","labels":{{"team":"vision","env":"prod"}},"observed_at":"2026-12-02T06:30:00Z"}}]}}"#
            ),
            None,
        ),
        // A change of model.
        (
            format!(
                r#"{{"gpus":[{{"uuid":"{g2}","model":"NVIDIA H100 80GB HBM3","host":"h2","cloud":"aws","labels":{{"team":"vision","env":"prod"}},"observed_at":"2026-12-02T11:10:00Z"}}]}}"#
            ),
            None,
        ),
        // An allocation over finished hours: their allocated flags.
        (
            format!(
                r#"{{"allocations":[{{"gpu_uuid":"{g1}","start":"2026-12-02T07:00:00Z","end":"2026-12-02T09:00:00Z","workload":"late","kind":"pod","team":"nlp"}}]}}"#
            ),
            Some(vec![today + 7 * 3600, today + 8 * 3600]),
        ),
    ];
    let mut previous = expected;
    for (n, (body, gone)) in changes.iter().enumerate() {
        let out = push(&store, &who("hand", None), body).await;
        assert!(out.rejected.is_empty(), "change {n}: {:?}", out.rejected);
        let left = store.clean_group_hours().await.unwrap();
        match gone {
            Some(gone) => {
                let want: Vec<i64> = all.iter().filter(|h| !gone.contains(h)).copied().collect();
                assert_eq!(left, want, "change {n}");
            }
            None => assert!(left.len() < all.len(), "change {n} left {left:?}"),
        }
        let pending = check(true).await;
        let expected = reference(true).await;
        compare(
            &pending,
            &expected,
            &format!("change {n}, before the refresher"),
        );
        assert_ne!(
            format!("{expected:?}"),
            format!("{previous:?}"),
            "change {n} moves no figure"
        );
        compare(
            &check(true).await,
            &expected,
            &format!("change {n}, rebuilt"),
        );
        previous = expected;
    }
    // An hour row removed by SQL.
    pool.execute(
        format!("DELETE FROM gpu_hours WHERE hour = {} AND gpu_id = (SELECT id FROM gpus WHERE uuid = '{g2}')", today + 9 * 3600).as_str(),
    )
    .await
    .unwrap();
    let left = store.clean_group_hours().await.unwrap();
    assert!(
        !left.contains(&(today + 9 * 3600)) && left.len() == all.len() - 1,
        "{left:?}"
    );
    // Its day row still counts it (nothing re-rolled it): the daily trend's point of today
    // differs from the hours, as the hours and day rows now do.
    let pending = check(false).await;
    compare(&pending, &reference(false).await, "a removed hour row");
}

/// PostgreSQL keeps raw samples in day partitions and hour rollups in week partitions:
/// samples land in theirs (not the default), retention drops a partition whole, and a row
/// that arrived before its partition existed moves into it when it is made.
#[tokio::test]
async fn postgres_retention_drops_time_partitions() {
    let Some((store, pool, url, schema)) =
        postgres_schema("postgres_retention_drops_time_partitions", "t_partitions").await
    else {
        return;
    };
    let rows = |table: String| {
        let pool = pool.clone();
        async move {
            let exists: Option<String> = sqlx::query_scalar("SELECT CAST(to_regclass($1) AS TEXT)")
                .bind(&table)
                .fetch_one(&pool)
                .await
                .unwrap();
            match exists {
                None => None,
                Some(_) => Some(
                    sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {table}"))
                        .fetch_one(&pool)
                        .await
                        .unwrap(),
                ),
            }
        }
    };
    store.ensure_partitions(now().timestamp()).await.unwrap();
    push(&store, &who("hand", None), SCENARIO).await;
    let dec1 = t("2026-12-01T00:00:00Z").timestamp();
    assert_eq!(rows("samples_default".into()).await, Some(0));
    assert_eq!(rows(format!("samples_p{dec1}")).await, Some(9));
    assert_eq!(rows("gpu_hours_default".into()).await, Some(0));

    // 15 days on, the raw samples of 1 December are past the 14 days kept: their partition
    // goes whole; the hour rollups stay.
    let later = now() + Duration::days(15);
    let (raw, _) = store.prune(later.timestamp()).await.unwrap();
    assert_eq!(raw, 9);
    assert_eq!(rows(format!("samples_p{dec1}")).await, None);
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Team, later)
        .await
        .unwrap();
    assert_eq!(s.total.gpu_hours, 13);

    // A sample for a day no partition covers yet lands in the default, and moves into the
    // day's partition when the server makes it.
    let far = now() + Duration::days(40);
    let far_day = far.timestamp() - far.timestamp() % 86_400;
    let out = push_at(
        &store,
        &who("hand", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","observed_at":"{far}"}}],"samples":[{{"gpu_uuid":"{A}","ts":"{far}","util_pct":90}}]}}"#,
            far = far.to_rfc3339()
        ),
        far,
    )
    .await;
    assert_eq!(out.accepted.samples, 1, "{:?}", out.rejected);
    assert_eq!(rows("samples_default".into()).await, Some(1));
    assert_eq!(rows(format!("samples_p{far_day}")).await, None);
    store.ensure_partitions(far.timestamp()).await.unwrap();
    assert_eq!(rows("samples_default".into()).await, Some(0));
    assert_eq!(rows(format!("samples_p{far_day}")).await, Some(1));
    assert_eq!(rows("gpu_hours_default".into()).await, Some(0));
    Store::drop_schema(&url, &schema).await.unwrap();
}

/// A new hour row rolled from its samples is written once, with its allocated flag: the roll
/// that stores it computes the flag, so the pass that sets the flags where allocations changed
/// finds it right. On PostgreSQL each rewrite is a new row version, with a new entry in every
/// index of the hour rollups until vacuum. Checked by the command that wrote each row's version
/// (`cmin`, all in the push's one transaction): no allocated row the rolls stored was written
/// after the last of them. The scenario's samples older than a day are rolled from their
/// samples (A's hours and B's first two); B's hour 12 is added onto its hour, and like the
/// hours with no sample (a GPU stays present for the stale window after its last sample), it
/// still takes its flag from a second write.
#[tokio::test]
async fn postgres_new_hours_are_written_once_with_their_flag() {
    let Some((store, pool, url, schema)) = postgres_schema(
        "postgres_new_hours_are_written_once_with_their_flag",
        "t_flag_once",
    )
    .await
    else {
        return;
    };
    store.ensure_partitions(now().timestamp()).await.unwrap();
    let out = push(&store, &who("hand", None), SCENARIO).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let cmin = "CAST(CAST(h.cmin AS TEXT) AS BIGINT)";
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(&format!(
        "SELECT g.uuid, h.hour, h.allocated, {cmin} FROM gpu_hours h JOIN gpus g ON g.id = h.gpu_id \
         WHERE h.samples > 0 ORDER BY g.uuid, h.hour"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let hour = |s: &str| t(s).timestamp();
    let added = hour("2026-12-01T12:00:00Z");
    let allocated: Vec<(&str, i64)> = rows
        .iter()
        .filter(|r| r.2 == 1)
        .map(|r| (r.0.as_str(), r.1))
        .collect();
    assert_eq!(
        allocated,
        vec![
            (A, hour("2026-12-01T01:00:00Z")),
            (A, hour("2026-12-01T02:00:00Z")),
            (B, hour("2026-12-01T11:00:00Z")),
            (B, hour("2026-12-01T12:00:00Z")),
        ],
        "{rows:?}"
    );
    // The flags' pass runs after every roll, and B's hour 10 is stored by the last of them
    // (its GPU's roll runs after A's).
    let rolled = |r: &&(String, i64, i64, i64)| r.1 < added;
    let last_roll = rows
        .iter()
        .filter(rolled)
        .filter(|r| r.2 == 0)
        .map(|r| r.3)
        .max()
        .unwrap();
    for r in rows.iter().filter(rolled).filter(|r| r.2 == 1) {
        assert!(
            r.3 <= last_roll,
            "{r:?} was written again after the rolls that stored it: {rows:?}"
        );
    }
    Store::drop_schema(&url, &schema).await.unwrap();
}

/// A team-scoped token may not take another team's GPU through a MIG instance: it may not
/// create an instance under a GPU it cannot write, and an allocation it sends may not move a
/// GPU out of a team it cannot write (here via a namespace rule on the instance's parent).
async fn scoped_token_cannot_take_a_gpu_through_a_mig_instance(
    open: impl Fn(Settings) -> std::pin::Pin<Box<dyn std::future::Future<Output = Store>>>,
) {
    use gpuledger_ledger::ownership::{Attr, Rule, Setting};
    let mut settings = Settings::default();
    settings.ownership.rules.push(Rule {
        name: Some("namespace team".into()),
        when: vec![(Attr::Namespace, "*-prod".into())],
        team: Some(Setting::From(Attr::NamespaceLabel("team".into()))),
        env: None,
    });
    let store = open(settings).await;
    let parent = "GPU-0a0a0a0a-0000-0000-0000-00000000000a";
    let child = "MIG-0a0a0a0a-0000-0000-0000-00000000000b";
    let pod = |gpu: &str, ns: &str, start: &str| {
        format!(
            r#"{{"gpu_uuid":"{gpu}","start":"{start}","workload":"{ns}/w","kind":"pod","context":{{"namespace":"{ns}","namespace_labels":{{"team":"{team}"}}}}}}"#,
            team = ns.trim_end_matches("-prod")
        )
    };
    // vision's GPU, placed by its last pod (ended).
    let admin = who("k8s", None);
    collect_at(
        &store,
        &admin,
        &format!(
            r#"{{"gpus":[{{"uuid":"{parent}","model":"NVIDIA A100-SXM4-40GB","host":"h-a","observed_at":"2026-12-02T08:00:00Z"}}],"allocations":[{}]}}"#,
            pod(parent, "vision-prod", "2026-12-02T08:00:00Z")
                .replace(r#""start""#, r#""end":"2026-12-02T08:30:00Z","start""#)
        ),
        t("2026-12-02T08:31:00Z"),
    )
    .await;
    let team_of = |uuid: &'static str| {
        let store = store.clone();
        async move { store.gpu(uuid, now()).await.unwrap().map(|g| g.team) }
    };
    assert_eq!(team_of(parent).await.as_deref(), Some("vision"));

    // nlp's token creates an instance under vision's GPU and a pod on it.
    let nlp = who("nlp-push", Some(&["nlp"]));
    let out = push_at(
        &store,
        &nlp,
        &format!(
            r#"{{"gpus":[{{"uuid":"{child}","model":"NVIDIA A100-SXM4-40GB MIG 1g.5gb","host":"h-a","mig_parent_uuid":"{parent}","mig_profile":"1g.5gb","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T09:00:00Z"}}],"allocations":[{}]}}"#,
            pod(child, "nlp-prod", "2026-12-02T09:00:00Z")
        ),
        t("2026-12-02T09:01:00Z"),
    )
    .await;
    assert_eq!(out.accepted.gpus + out.accepted.allocations, 0, "{out:?}");
    let gpu_refusal = out
        .rejected
        .iter()
        .find(|r| r.path == "gpus[0].mig_parent_uuid")
        .unwrap_or_else(|| panic!("{:?}", out.rejected));
    assert!(gpu_refusal.forbidden);
    assert!(
        gpu_refusal.reason.contains(&format!(
            "its parent GPU {parent} is owned by team `vision`"
        )),
        "{}",
        gpu_refusal.reason
    );
    assert_eq!(team_of(parent).await.as_deref(), Some("vision"));
    assert_eq!(team_of(child).await, None);

    // Where the instance exists (an unscoped source reported it), nlp's pod on it still may
    // not move its parent out of vision.
    collect_at(
        &store,
        &admin,
        &format!(
            r#"{{"gpus":[{{"uuid":"{child}","model":"NVIDIA A100-SXM4-40GB MIG 1g.5gb","host":"h-a","mig_parent_uuid":"{parent}","mig_profile":"1g.5gb","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T09:30:00Z"}}]}}"#
        ),
        t("2026-12-02T09:31:00Z"),
    )
    .await;
    let out = push_at(
        &store,
        &nlp,
        &format!(
            r#"{{"allocations":[{}]}}"#,
            pod(child, "nlp-prod", "2026-12-02T10:00:00Z")
        ),
        t("2026-12-02T10:01:00Z"),
    )
    .await;
    assert!(
        out.rejected.iter().any(|r| r.forbidden
            && r.reason.contains(&format!("GPU {parent}"))
            && r.reason.contains("stays `vision`'s")),
        "{out:?}"
    );
    assert_eq!(team_of(parent).await.as_deref(), Some("vision"));
}

both_reopening!(scoped_token_cannot_take_a_gpu_through_a_mig_instance);

/// A token's life: minted (optionally expiring), listed with its last use, rotated (the new
/// one keeps role, source and teams; the old one stops working) and revoked.
async fn tokens_are_listed_rotated_revoked_and_expire(store: Store) {
    use gpuledger_store::Role;
    let now = chrono::Utc::now().timestamp();
    let push = store
        .create_token(Role::Ingest, "nlp-cron", &["nlp".into()])
        .await
        .unwrap();
    let expired = store
        .create_token_expiring(Role::Viewer, "old-viewer", &[], Some(now - 1))
        .await
        .unwrap();
    let listed = store.list_tokens().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        (listed[0].role, &*listed[0].source, listed[0].teams.clone()),
        ("ingest", "nlp-cron", vec!["nlp".to_string()])
    );
    assert_eq!(listed[0].last_used_at, None, "never used yet");
    assert_eq!(listed[1].state(now), "expired");
    assert!(store.verify_token(&expired).await.unwrap().is_none());

    let info = store.verify_token(&push).await.unwrap().unwrap();
    assert_eq!(info.teams, Some(vec!["nlp".to_string()]));
    let used = store.list_tokens().await.unwrap()[0].last_used_at.unwrap();
    assert!((now..now + 60).contains(&used), "{used} vs {now}");

    let (rotated, row) = store.rotate_token(listed[0].id, now).await.unwrap();
    assert_ne!(rotated, push);
    assert_eq!(
        (row.role, &*row.source, row.teams.clone(), row.state(now)),
        ("ingest", "nlp-cron", vec!["nlp".to_string()], "active")
    );
    assert!(
        store.verify_token(&push).await.unwrap().is_none(),
        "old one revoked"
    );
    assert!(store.verify_token(&rotated).await.unwrap().is_some());
    let err = store.rotate_token(listed[0].id, now).await.unwrap_err();
    assert!(err.to_string().contains("is revoked"), "{err}");

    let revoked = store.revoke_token(row.id, now + 5).await.unwrap();
    assert_eq!(
        (revoked.revoked_at, revoked.state(now)),
        (Some(now + 5), "revoked")
    );
    assert!(store.verify_token(&rotated).await.unwrap().is_none());
    assert!(store
        .revoke_token(999, now)
        .await
        .unwrap_err()
        .to_string()
        .contains("no token with id 999"));
}

both!(tokens_are_listed_rotated_revoked_and_expire);

// The pull collectors' lease: several `serve` replicas on one PostgreSQL database.

/// Wait up to `secs` seconds for `cond`, polling; panics with `what` when it does not come.
async fn within(secs: u64, what: &str, mut cond: impl FnMut() -> bool) -> std::time::Duration {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(secs),
            "not within {secs} s: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// On SQLite the lease is held from the start: one server per database file is the only
/// supported setup, so there is nobody to share it with.
#[tokio::test]
async fn lease_is_always_held_on_sqlite() {
    let (store, _dir) = sqlite().await;
    let mut lease = store.lease(std::time::Duration::from_millis(50));
    assert!(lease.is_held());
    lease.wait_for(true).await;
}

/// Two stores on one schema (two replicas): exactly one holds the lease. When the leader's
/// store closes, the other takes over; when the leader's lock connection is killed on the
/// server (as a network cut or an administrator would end it), the leader notices on its next
/// check and lets go, and one store holds it again.
#[tokio::test]
async fn lease_has_one_holder_and_passes_on_when_the_leader_goes() {
    let Some(url) = pg_url("lease") else {
        return;
    };
    let schema = format!("t_lease_{}", std::process::id());
    Store::drop_schema(&url, &schema)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} (GPULEDGER_TEST_PG_URL): {e}"));
    let open = || Store::open_in_schema(&url, Some(&schema), Settings::default());
    let (a, b) = (open().await.unwrap(), open().await.unwrap());
    let retry = std::time::Duration::from_millis(100);

    let la = a.lease(retry);
    within(10, "the first store takes the lease", || la.is_held()).await;
    let lb = b.lease(retry);
    tokio::time::sleep(retry * 10).await;
    assert!(la.is_held() && !lb.is_held(), "exactly one holder");

    // A store in another schema of the same database has a lease of its own.
    let other = format!("{schema}_other");
    Store::drop_schema(&url, &other).await.unwrap();
    let elsewhere = Store::open_in_schema(&url, Some(&other), Settings::default())
        .await
        .unwrap();
    let le = elsewhere.lease(retry);
    within(10, "another schema's lease is its own", || le.is_held()).await;

    // The leader closes: the other takes over.
    a.close().await;
    let took = within(10, "the follower takes over from a closed leader", || {
        lb.is_held()
    })
    .await;
    eprintln!(
        "lease taken over {} ms after the leader closed",
        took.as_millis()
    );
    assert!(!la.is_held());

    // The leader's lock connection is ended on the server: it lets go, and one store holds it.
    let c = open().await.unwrap();
    let lc = c.lease(retry);
    tokio::time::sleep(retry * 5).await;
    assert!(lb.is_held() && !lc.is_held());
    let admin = sqlx::AnyPool::connect(&url).await.unwrap();
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid = hashtext('gpuledger pull collectors')::oid \
         AND objid = hashtext($1)::oid AND objsubid = 2",
    )
    .bind(&schema)
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(ended, [true], "one session holds the lock");
    within(10, "the leader notices its lock connection died", || {
        !lb.is_held()
    })
    .await;
    within(10, "a store holds the lease again", || {
        lb.is_held() || lc.is_held()
    })
    .await;
    tokio::time::sleep(retry * 5).await;
    assert!(lb.is_held() != lc.is_held(), "exactly one holder");

    admin.close().await;
    for s in [&b, &c, &elsewhere] {
        s.close().await;
    }
    Store::drop_schema(&url, &schema).await.unwrap();
    Store::drop_schema(&url, &other).await.unwrap();
}

/// Two servers on one PostgreSQL database write the same GPU's hour at the same time: the hour
/// rollup counts every sample both stored (their writers take turns through the database, not
/// only within each process).
#[tokio::test]
async fn postgres_replicas_writing_one_hour_lose_no_sample() {
    let Some(url) = pg_url("postgres_replicas_writing_one_hour_lose_no_sample") else {
        return;
    };
    let schema = format!("t_replica_writes_{}", std::process::id());
    Store::drop_schema(&url, &schema).await.unwrap();
    let a = Store::open_in_schema(&url, Some(&schema), Settings::default())
        .await
        .unwrap();
    let b = Store::open_in_schema(&url, Some(&schema), Settings::default())
        .await
        .unwrap();
    let hour = t("2026-12-02T10:00:00Z");
    push_at(
        &a,
        &who("hand", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","observed_at":"{}"}}]}}"#,
            hour.to_rfc3339()
        ),
        hour,
    )
    .await;
    let rounds = 15;
    let write = |store: Store, offset: i64| async move {
        for r in 0..rounds {
            let samples: Vec<String> = (0..20)
                .map(|i| {
                    let ts = hour + Duration::seconds(offset + r * 40 + i * 2);
                    format!(
                        r#"{{"gpu_uuid":"{A}","ts":"{}","util_pct":50}}"#,
                        ts.to_rfc3339()
                    )
                })
                .collect();
            let out = push_at(
                &store,
                &who("hand", None),
                &format!(r#"{{"samples":[{}]}}"#, samples.join(",")),
                hour + Duration::minutes(59),
            )
            .await;
            assert_eq!(out.accepted.samples, 20, "{out:?}");
        }
    };
    tokio::join!(write(a.clone(), 0), write(b.clone(), 1));
    let d = a.gpu_detail(A, dec2(), now()).await.unwrap().unwrap();
    let h = d.hours.iter().find(|h| h.hour == hour).unwrap();
    assert_eq!(h.samples, 2 * rounds * 20);
    Store::drop_schema(&url, &schema).await.unwrap();
}

/// The same workload reported by two sources, one naming its team (the Kubernetes collector)
/// and one not (dcgm-exporter's pod attribution): its hours are used by that team, on the
/// whole days of the rollup and on the window's partial edges alike, never by `unowned`.
async fn a_workload_named_by_one_source_and_not_another_counts_for_its_team(store: Store) {
    collect_at(
        &store,
        &who("k8s", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","observed_at":"2026-12-01T00:00:00Z"}}],
              "allocations":[{{"gpu_uuid":"{A}","start":"2026-12-01T00:00:00Z","workload":"ml/train","kind":"pod","team":"nlp"}}]}}"#
        ),
        t("2026-12-01T00:01:00Z"),
    )
    .await;
    collect_at(
        &store,
        &who("dcgm", None),
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"Tesla T4","observed_at":"2026-12-02T11:00:00Z"}}],
              "allocations":[{{"gpu_uuid":"{A}","start":"2026-12-01T00:05:00Z","workload":"ml/train","kind":"pod"}}]}}"#
        ),
        t("2026-12-02T11:01:00Z"),
    )
    .await;
    let samples: Vec<String> = (0..36)
        .map(|h| {
            let ts = t("2026-12-01T00:30:00Z") + Duration::hours(h);
            format!(
                r#"{{"gpu_uuid":"{A}","ts":"{}","util_pct":50}}"#,
                ts.to_rfc3339()
            )
        })
        .collect();
    collect_at(
        &store,
        &who("dcgm", None),
        &format!(r#"{{"samples":[{}]}}"#, samples.join(",")),
        now(),
    )
    .await;
    for (from, to) in [
        ("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"),
        ("2026-12-01T06:00:00Z", "2026-12-02T06:00:00Z"),
    ] {
        let rows = store
            .used_by_cost(
                Window {
                    from: t(from).timestamp(),
                    to: t(to).timestamp(),
                },
                &Filters::default(),
                now(),
            )
            .await
            .unwrap();
        let teams: Vec<&str> = rows.iter().map(|r| &*r.team).collect();
        assert_eq!(teams, vec!["nlp"], "{from}..{to}: {rows:?}");
        assert_eq!(rows[0].gpu_hours, 24.0, "{from}..{to}");
    }
}

both!(a_workload_named_by_one_source_and_not_another_counts_for_its_team);

/// `new_gpus_per_day`: a token's source adds at most that many GPUs in 24 hours; a GPU past
/// it is refused with the limit named, the rest of the body (and updates of GPUs it has) kept;
/// the count is the audit log's, so it holds across restarts and replicas. Collectors the
/// administrator configured are not bounded.
async fn limits_new_gpus_per_day_bound_a_tokens_source(
    open: impl Fn(Settings) -> std::pin::Pin<Box<dyn std::future::Future<Output = Store>>>,
) {
    let store = open(Settings {
        new_gpus_per_day: Some(2),
        ..Settings::default()
    })
    .await;
    let gpu = |uuid: &str| {
        format!(
            r#"{{"uuid":"{uuid}","model":"NVIDIA L4","host":"n1","observed_at":"2026-12-02T11:00:00Z"}}"#
        )
    };
    let p = who("lab", None);
    let out = push(
        &store,
        &p,
        &format!(r#"{{"gpus":[{},{},{}]}}"#, gpu(A), gpu(B), gpu(C)),
    )
    .await;
    assert_eq!(out.accepted.gpus, 2, "{out:?}");
    assert_eq!(out.rejected.len(), 1);
    assert!(
        out.rejected[0].reason.contains("new_gpus_per_day") && out.rejected[0].path == "gpus[2]",
        "{:?}",
        out.rejected
    );
    // After a restart: still two in the last 24 hours. A GPU it has is updated; a new one is not.
    drop(store);
    let store = open(Settings {
        new_gpus_per_day: Some(2),
        ..Settings::default()
    })
    .await;
    let out = push(
        &store,
        &p,
        &format!(r#"{{"gpus":[{},{}]}}"#, gpu(A), gpu(C)),
    )
    .await;
    assert_eq!((out.accepted.gpus, out.rejected.len()), (1, 1), "{out:?}");
    // Another source has its own count; a collector has none.
    let out = push(
        &store,
        &who("other", None),
        &format!(r#"{{"gpus":[{}]}}"#, gpu(C)),
    )
    .await;
    assert_eq!(out.accepted.gpus, 1, "{out:?}");
    let collector = Principal {
        kind: "dcgm".into(),
        ..who("lab", None)
    };
    let many: Vec<String> = (0..5)
        .map(|i| gpu(&format!("GPU-dddddddd-0000-0000-0000-00000000000{i}")))
        .collect();
    let out = push(
        &store,
        &collector,
        &format!(r#"{{"gpus":[{}]}}"#, many.join(",")),
    )
    .await;
    assert_eq!(out.accepted.gpus, 5, "{out:?}");
    // A day later the source may add again.
    let out = push_at(
        &store,
        &p,
        &format!(
            r#"{{"gpus":[{}]}}"#,
            gpu("GPU-eeeeeeee-0000-0000-0000-000000000001")
        ),
        now() + Duration::hours(25),
    )
    .await;
    assert_eq!(out.accepted.gpus, 1, "{out:?}");
}

both_reopening!(limits_new_gpus_per_day_bound_a_tokens_source);

/// A conflicting resend: the same GPU and `ts` with another value. The push contract's rule
/// (push-api.md): the first value stays, the resend is counted under `duplicates`, and no
/// figure changes; a correction is sent with a new `ts`.
async fn ingest_a_conflicting_resend_keeps_the_first_value(store: Store) {
    let body = |util: u32| {
        format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"NVIDIA L4","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T10:30:00Z"}}],
                "samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T10:15:00Z","util_pct":{util}}}]}}"#
        )
    };
    let today = Window {
        from: t("2026-12-02T00:00:00Z").timestamp(),
        to: now().timestamp(),
    };
    let first = push(&store, &who("lab", None), &body(80)).await;
    assert_eq!(first.duplicates.samples, 0);
    let before = store
        .summary(today, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let again = push(&store, &who("lab", None), &body(2)).await;
    assert_eq!(
        (again.accepted.samples, again.duplicates.samples),
        (1, 1),
        "{again:?}"
    );
    assert!(again.rejected.is_empty(), "{again:?}");
    let after = store
        .summary(today, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(before, after);
    // The hour stays busy at 80 %: not idle at 2 %, not an average of the two.
    let nlp = after.groups.iter().find(|g| g.key == "nlp").unwrap();
    assert_eq!(nlp.avg_activity_pct, Some(80.0), "{nlp:?}");
    // A correction under a new `ts` counts.
    let corrected = push(
        &store,
        &who("lab", None),
        &body(2).replace("10:15:00Z", "10:16:00Z"),
    )
    .await;
    assert_eq!(corrected.duplicates.samples, 0);
}

both!(ingest_a_conflicting_resend_keeps_the_first_value);

/// Clock skew of an hour either way: a pusher an hour behind the server has its samples
/// stored in the hour they name; one an hour ahead has them refused as in the future, naming
/// the latest time the server accepts (its clock plus 5 minutes), and nothing stored.
async fn ingest_a_pusher_an_hour_off_is_stored_or_refused_by_the_rule(store: Store) {
    let gpu = r#"{"uuid":"GPU-aaaaaaaa-0000-0000-0000-000000000001","model":"NVIDIA L4","labels":{"team":"nlp"},"observed_at":"2026-12-02T11:00:00Z"}"#;
    let sample = |ts: &str| {
        format!(r#"{{"gpus":[{gpu}],"samples":[{{"gpu_uuid":"{A}","ts":"{ts}","util_pct":70}}]}}"#)
    };
    // now() is 12:00: an hour behind says 11:00, an hour ahead 13:00.
    let behind = push(&store, &who("lab", None), &sample("2026-12-02T11:00:00Z")).await;
    assert_eq!(behind.accepted.samples, 1, "{behind:?}");
    let ahead = push(&store, &who("lab", None), &sample("2026-12-02T13:00:00Z")).await;
    assert_eq!(ahead.accepted.samples, 0, "{ahead:?}");
    let why = &ahead.rejected[0];
    assert!(
        why.path == "samples[0].ts"
            && why.reason.contains("future")
            && why.reason.contains("2026-12-02T12:05:00Z"),
        "{why:?}"
    );
    let w = Window {
        from: t("2026-12-02T00:00:00Z").timestamp(),
        to: now().timestamp(),
    };
    let s = store
        .summary(w, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    // One measured hour, 11:00, at 70 %: the refused sample changed nothing.
    assert_eq!(s.total.avg_activity_pct, Some(70.0), "{:?}", s.total);
    assert_eq!(s.total.busy_hours, 1, "{:?}", s.total);
}

both!(ingest_a_pusher_an_hour_off_is_stored_or_refused_by_the_rule);

/// A full disk, as SQLite sees it (`sqlite_max_size_mib` caps the file the way a full disk
/// would): a push is refused with an error that says so and keeps nothing, reads go on, and
/// writes resume once there is room again.
#[tokio::test]
async fn sqlite_a_full_disk_refuses_writes_keeps_reads_and_recovers() {
    let dir = tempdir::Dir::new();
    let url = format!("sqlite://{}/full.db", dir.0.display());
    let capped = |mib| Settings {
        sqlite_max_size_mib: Some(mib),
        ..Settings::default()
    };
    let store = Store::open(&url, capped(1)).await.unwrap();
    let p = who("lab", None);
    let body = |i: usize| {
        let samples: Vec<String> = (0..60)
            .map(|m| {
                format!(
                    r#"{{"gpu_uuid":"GPU-00000000-0000-4000-8000-{i:012}","ts":"2026-12-02T11:{m:02}:00Z","util_pct":50}}"#
                )
            })
            .collect();
        format!(
            r#"{{"gpus":[{{"uuid":"GPU-00000000-0000-4000-8000-{i:012}","model":"NVIDIA L4","host":"h{i}","labels":{{"team":"nlp"}},"observed_at":"2026-12-02T11:30:00Z"}}],"samples":[{}]}}"#,
            samples.join(",")
        )
    };
    let ingest = |store: &Store, i: usize| {
        let map =
            gpuledger_ledger::decode_body(body(i).as_bytes(), None, Default::default()).unwrap();
        let store = store.clone();
        let p = p.clone();
        async move {
            store
                .ingest(&p, validate_body(map, now(), 300), now())
                .await
        }
    };
    let mut kept = 0;
    let err = loop {
        match ingest(&store, kept).await {
            Ok(_) => kept += 1,
            Err(e) => break e,
        }
        assert!(kept < 10_000, "1 MiB never filled up");
    };
    assert!(err.to_string().contains("full"), "{err}");
    // Reads go on, and the refused push left nothing.
    let w = Window {
        from: t("2026-12-02T00:00:00Z").timestamp(),
        to: now().timestamp(),
    };
    let s = store
        .summary(w, &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(s.total.gpus, kept as i64, "{:?}", s.total);
    drop(store);
    // Room again: the same push goes through.
    let store = Store::open(&url, capped(64)).await.unwrap();
    let out = ingest(&store, kept).await.unwrap();
    assert_eq!(out.accepted.samples, 60);
}

/// Late data, as a property: samples at random minutes of three days, pushed in shuffled
/// batches (so most hours are rolled, then rolled again when a late sample of theirs arrives),
/// and for random windows the summary's busy and idle hours and average activity equal what
/// the raw samples give: per GPU and hour the mean of its samples, idle below the threshold,
/// the average over measured hours. The windows start and end at any hour, so both the day
/// rollups (whole days) and the hour rows (partial days) are checked. A sample's activity is
/// `util_pct` or, one in three, `sm_active`; one batch in four also sends samples again that an
/// earlier batch stored (duplicates), so both ways of rolling an hour run: adding a push's new
/// samples onto their hour, and rolling the hour again from all its samples.
async fn rollup_hours_and_days_equal_the_raw_samples_for_any_window(store: Store) {
    let base = t("2026-11-29T00:00:00Z").timestamp();
    let at = |secs: i64| chrono::DateTime::from_timestamp(secs, 0).unwrap();
    let hours: i64 = 72;
    for seed in 1..=3u64 {
        let mut r = Lcg(seed * 104_729);
        let p = who(&format!("late-{seed}"), None);
        let gpus: Vec<String> = (0..3)
            .map(|i| format!("GPU-{seed:08x}-1111-0000-0000-{i:012x}"))
            .collect();
        // (gpu index, ts, util)
        let mut raw: Vec<(usize, i64, u64)> = Vec::new();
        for g in 0..gpus.len() {
            for _ in 0..150 {
                let ts = base + r.below(hours as u64 * 60) as i64 * 60;
                // Some idle (below 5 %), most not.
                let util = if r.below(4) == 0 {
                    r.below(5)
                } else {
                    r.below(101)
                };
                if !raw.iter().any(|&(gg, tt, _)| gg == g && tt == ts) {
                    raw.push((g, ts, util));
                }
            }
        }
        let inventory: Vec<String> = gpus
            .iter()
            .map(|g| {
                format!(
                    r#"{{"uuid":"{g}","model":"NVIDIA L4","labels":{{"team":"t{seed}"}},"observed_at":"{}"}}"#,
                    at(base).to_rfc3339()
                )
            })
            .collect();
        push(
            &store,
            &p,
            &format!(r#"{{"gpus":[{}]}}"#, inventory.join(",")),
        )
        .await;
        // Shuffled, in batches of 1 to 40.
        let mut order: Vec<usize> = (0..raw.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, r.below(i as u64 + 1) as usize);
        }
        let mut rest = &order[..];
        let mut sent = 0;
        let mut resent = 0;
        while !rest.is_empty() {
            let n = (1 + r.below(40) as usize).min(rest.len());
            let mut batch: Vec<usize> = rest[..n].to_vec();
            if sent > 0 && r.below(4) == 0 {
                let again = 1 + r.below(5) as usize;
                batch.extend((0..again).map(|_| order[r.below(sent as u64) as usize]));
                resent += again;
            }
            let samples: Vec<String> = batch
                .iter()
                .map(|&k| {
                    let (g, ts, util) = raw[k];
                    let activity = if k % 3 == 0 {
                        format!(r#""sm_active":{}"#, util as f64 / 100.0)
                    } else {
                        format!(r#""util_pct":{util}"#)
                    };
                    format!(
                        r#"{{"gpu_uuid":"{}","ts":"{}",{activity}}}"#,
                        gpus[g],
                        at(ts).to_rfc3339()
                    )
                })
                .collect();
            let out = push(
                &store,
                &p,
                &format!(r#"{{"samples":[{}]}}"#, samples.join(",")),
            )
            .await;
            assert!(out.rejected.is_empty(), "{out:?}");
            assert_eq!(out.duplicates.samples as usize, batch.len() - n, "{out:?}");
            sent += n;
            rest = &rest[n..];
        }
        assert!(resent > 0, "seed {seed}: no sample sent twice");
        for _ in 0..6 {
            let a = r.below(hours as u64) as i64;
            let b = a + 1 + r.below((hours - a) as u64) as i64;
            let (from, to) = (base + a * 3600, base + b * 3600);
            // Expected, from the raw samples.
            let mut per_hour: std::collections::BTreeMap<(usize, i64), (f64, u32)> =
                Default::default();
            for &(g, ts, util) in &raw {
                if ts >= from && ts < to {
                    let e = per_hour.entry((g, ts - ts.rem_euclid(3600))).or_default();
                    e.0 += util as f64;
                    e.1 += 1;
                }
            }
            let acts: Vec<f64> = per_hour.values().map(|(s, n)| s / *n as f64).collect();
            let idle = acts.iter().filter(|a| **a < 5.0).count() as i64;
            let busy = acts.len() as i64 - idle;
            let avg = acts.iter().sum::<f64>() / acts.len().max(1) as f64;
            let s = store
                .summary(
                    Window { from, to },
                    &Filters {
                        team: vec![format!("t{seed}")],
                        ..Default::default()
                    },
                    GroupBy::Team,
                    now(),
                )
                .await
                .unwrap();
            let w = format!("seed {seed}, hours {a}..{b}");
            assert_eq!(s.total.busy_hours, busy, "{w}: {:?}", s.total);
            assert_eq!(s.total.idle_hours, idle, "{w}: {:?}", s.total);
            if acts.is_empty() {
                assert_eq!(s.total.avg_activity_pct, None, "{w}");
            } else {
                let got = s.total.avg_activity_pct.unwrap();
                // The summary gives the average to 0.01.
                assert!(
                    (got - avg).abs() <= 0.005 + 1e-9,
                    "{w}: {got} against {avg}"
                );
            }
        }
    }
}

both!(rollup_hours_and_days_equal_the_raw_samples_for_any_window);

/// The same machine seen by a cloud collector (as `ip-10-0-0-1.ec2.internal`), as a Kubernetes
/// node (`node-a`, a pod on its GPU pool) and by the agent (`node-a-agent`, its two GPUs), each
/// naming the instance `i-0abc`: one host with two GPUs, whatever the order, carrying what each
/// source knows, the pod's allocation on a real GPU, and no GPU counted twice.
async fn one_cloud_instance_is_one_host_whichever_source_names_it(store: Store) {
    let cloud = Principal {
        kind: "aws".into(),
        ..who("aws", None)
    };
    let k8s = who("k8s", None);
    let agent = who("agent-a", None);
    let instance = |host: &str, cluster: Option<&str>| HostGpus {
        host: host.into(),
        count: 2,
        model: Some("H100".into()),
        cluster: cluster.map(str::to_string),
        cloud: cluster.is_none().then_some(gpuledger_model::Cloud::Aws),
        account: cluster.is_none().then(|| "111122223333".to_string()),
        instance_type: Some("p5.48xlarge".into()),
        labels: [("instance_id".to_string(), "i-0abc".to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let physical = |store: Store| async move {
        store
            .list_gpus(&Filters::default(), false, now())
            .await
            .unwrap()
    };
    store
        .observe_host_gpu_count(
            &cloud,
            &instance("ip-10-0-0-1.ec2.internal", None),
            t("2026-12-02T08:00:00Z"),
        )
        .await
        .unwrap();
    store
        .observe_host_gpu_count(
            &k8s,
            &instance("node-a", Some("rdu")),
            t("2026-12-02T08:01:00Z"),
        )
        .await
        .unwrap();
    let gpus = physical(store.clone()).await;
    assert_eq!(
        gpus.len(),
        2,
        "the node's count lands on the instance's host: {gpus:#?}"
    );
    assert!(gpus
        .iter()
        .all(|g| g.host.as_deref() == Some("ip-10-0-0-1.ec2.internal")));
    assert!(
        gpus.iter()
            .all(|g| g.cluster.as_deref() == Some("rdu")
                && g.account.as_deref() == Some("111122223333")),
        "the node fills what the cloud did not say, and keeps what it did: {gpus:#?}"
    );
    // A pod on the node's pool lands on the instance's pool.
    collect_at(
        &store,
        &k8s,
        r#"{"allocations":[{"gpu_uuid":"placeholder:node-a:1","start":"2026-12-02T08:02:00Z","workload":"ml/train","kind":"pod"}]}"#,
        t("2026-12-02T08:02:00Z"),
    )
    .await;
    // The agent names the two GPUs under its own host name.
    push_at(
        &store,
        &agent,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"NVIDIA H100 80GB HBM3","host":"node-a-agent","labels":{{"instance_id":"i-0abc"}},"observed_at":"2026-12-02T08:05:00Z"}},
                {{"uuid":"{B}","model":"NVIDIA H100 80GB HBM3","host":"node-a-agent","labels":{{"instance_id":"i-0abc"}},"observed_at":"2026-12-02T08:05:00Z"}}]}}"#
        ),
        t("2026-12-02T08:05:00Z"),
    )
    .await;
    // Every source reports again, in another order.
    store
        .observe_host_gpu_count(
            &k8s,
            &instance("node-a", Some("rdu")),
            t("2026-12-02T08:10:00Z"),
        )
        .await
        .unwrap();
    store
        .observe_host_gpu_count(
            &cloud,
            &instance("ip-10-0-0-1.ec2.internal", None),
            t("2026-12-02T08:11:00Z"),
        )
        .await
        .unwrap();
    let gpus = physical(store.clone()).await;
    assert_eq!(gpus.len(), 2, "{gpus:#?}");
    let uuids: Vec<&str> = gpus.iter().map(|g| &*g.uuid).collect();
    assert!(uuids.contains(&A) && uuids.contains(&B), "{uuids:?}");
    for g in &gpus {
        assert_eq!(g.host.as_deref(), Some("ip-10-0-0-1.ec2.internal"));
        assert_eq!(g.cluster.as_deref(), Some("rdu"), "{g:#?}");
        assert_eq!(g.account.as_deref(), Some("111122223333"), "{g:#?}");
        assert_eq!(g.instance_type.as_deref(), Some("p5.48xlarge"), "{g:#?}");
    }
    let mut held = 0;
    for u in [A, B] {
        held += workloads_on(&store, u).await.len();
    }
    assert_eq!(held, 1, "the pod's allocation moved to one real GPU");
    let s = store
        .summary(dec2(), &Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(s.total.gpus, 2, "{:?}", s.total);

    // The other order: the node first, then the agent, then the cloud collector.
    const D: &str = "GPU-dddddddd-0000-0000-0000-000000000004";
    let other = |host: &str, cluster: Option<&str>| HostGpus {
        count: 1,
        labels: [("instance_id".to_string(), "i-0DEF".to_string())]
            .into_iter()
            .collect(),
        ..instance(host, cluster)
    };
    store
        .observe_host_gpu_count(
            &k8s,
            &other("node-b", Some("rdu")),
            t("2026-12-02T09:00:00Z"),
        )
        .await
        .unwrap();
    push_at(
        &store,
        &agent,
        &format!(
            r#"{{"gpus":[{{"uuid":"{D}","model":"NVIDIA H100 80GB HBM3","host":"node-b.local","labels":{{"instance_id":"i-0def"}},"observed_at":"2026-12-02T09:05:00Z"}}]}}"#
        ),
        t("2026-12-02T09:05:00Z"),
    )
    .await;
    store
        .observe_host_gpu_count(
            &cloud,
            &other("ip-10-0-0-2.ec2.internal", None),
            t("2026-12-02T09:10:00Z"),
        )
        .await
        .unwrap();
    let on_b: Vec<_> = physical(store.clone())
        .await
        .into_iter()
        .filter(|g| g.host.as_deref() != Some("ip-10-0-0-1.ec2.internal"))
        .collect();
    assert_eq!(on_b.len(), 1, "{on_b:#?}");
    assert_eq!(
        (&*on_b[0].uuid, on_b[0].host.as_deref()),
        (D, Some("node-b"))
    );
    assert_eq!(
        on_b[0].account.as_deref(),
        Some("111122223333"),
        "the cloud fills the gap"
    );

    // The sources page's cloud accounts: what the aws collector found, wherever it merged.
    // (A collector's run ends with a push of its records, which registers the source.)
    collect_at(&store, &cloud, "{}", t("2026-12-02T09:10:00Z")).await;
    let accounts = store.cloud_accounts().await.unwrap();
    assert_eq!(accounts.len(), 1, "{accounts:?}");
    let a = &accounts[0];
    assert_eq!(
        (&*a.source, a.kind.as_str(), a.account.as_str()),
        ("aws", "aws", "111122223333")
    );
    assert_eq!((a.gpus, a.hosts), (3, 2), "{a:?}");
    assert_eq!(a.last_seen, t("2026-12-02T09:10:00Z"));
}

/// A cloud instance counted at 08:00 is present through the stale window (08:00–09:59); the
/// cloud then says it stopped at 08:20: its GPUs count 08:00 only, on every page, and a GPU
/// of it some source saw after the stop keeps its hours.
async fn a_stopped_instance_stops_counting_when_the_cloud_says(store: Store) {
    let cloud = who("aws", None);
    let host = HostGpus {
        host: "ip-10-0-0-9.ec2.internal".into(),
        count: 1,
        model: Some("H100".into()),
        labels: [("instance_id".to_string(), "i-0stop".to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    store
        .observe_host_gpu_count(&cloud, &host, t("2026-12-02T08:00:00Z"))
        .await
        .unwrap();
    let hours = |store: Store| async move {
        let s = store
            .summary(dec2(), &Filters::default(), GroupBy::Team, now())
            .await
            .unwrap();
        s.total.gpu_hours
    };
    assert_eq!(
        hours(store.clone()).await,
        2,
        "08:00 and 09:00, the stale window"
    );
    // Named by its instance ID under another host name: found all the same.
    let gone = store
        .observe_host_stopped(
            &cloud,
            "i-0stop",
            Some("i-0stop"),
            t("2026-12-02T08:20:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(gone, 1);
    assert_eq!(hours(store.clone()).await, 1);
    let gpu = &store
        .list_gpus(&Filters::default(), false, now())
        .await
        .unwrap()[0];
    let d = store
        .gpu_detail(&gpu.uuid, dec2(), now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.hours.len(), 1, "{:?}", d.hours);
    // Told again on the next run: nothing more goes.
    let again = store
        .observe_host_stopped(
            &cloud,
            "ip-10-0-0-9.ec2.internal",
            None,
            t("2026-12-02T08:20:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(again, 0);
    // Seen running after an earlier stop time: that report wins, nothing goes.
    store
        .observe_host_gpu_count(&cloud, &host, t("2026-12-02T10:00:00Z"))
        .await
        .unwrap();
    let none = store
        .observe_host_stopped(
            &cloud,
            "ip-10-0-0-9.ec2.internal",
            Some("i-0stop"),
            t("2026-12-02T09:30:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(none, 0);
    assert_eq!(hours(store.clone()).await, 3, "08:00, 10:00, 11:00");
}

/// An authoritative sheet listed GPUs A and B and a host counted by one placeholder at 08:00
/// (present 08:00 and 09:00, the stale window); at 08:30 it lists only B, which an agent also
/// reports: A and the placeholder count 08:00 only, B keeps its hours, and listing the same
/// again ends nothing more.
async fn an_authoritative_sheet_ends_what_it_no_longer_lists(store: Store) {
    let sheet = who("sheet:inventory.csv", None);
    let agent = who("agent-b", None);
    push_at(
        &store,
        &sheet,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"H100","host":"rack-1","observed_at":"2026-12-02T08:00:00Z"}},
                {{"uuid":"{B}","model":"H100","host":"rack-2","observed_at":"2026-12-02T08:00:00Z"}}]}}"#
        ),
        t("2026-12-02T08:00:00Z"),
    )
    .await;
    let spare = HostGpus {
        host: "spare-1".into(),
        count: 1,
        model: Some("A100".into()),
        ..Default::default()
    };
    store
        .observe_host_gpu_count(&sheet, &spare, t("2026-12-02T08:00:00Z"))
        .await
        .unwrap();
    push_at(
        &store,
        &agent,
        &format!(
            r#"{{"gpus":[{{"uuid":"{B}","model":"NVIDIA H100 80GB HBM3","host":"rack-2","observed_at":"2026-12-02T08:20:00Z"}}]}}"#
        ),
        t("2026-12-02T08:20:00Z"),
    )
    .await;
    let hours_of = |store: Store, uuid: String| async move {
        store
            .gpu_detail(&uuid, dec2(), now())
            .await
            .unwrap()
            .unwrap()
            .hours
            .len()
    };
    let placeholder = gpuledger_model::placeholder_uuid("spare-1", 0);
    assert_eq!(hours_of(store.clone(), placeholder.clone()).await, 2);
    let gone = store
        .observe_inventory_list(&sheet, &[B.to_string()], &[], t("2026-12-02T08:30:00Z"))
        .await
        .unwrap();
    assert_eq!(gone, 2, "A's 09:00 and the placeholder's 09:00");
    assert_eq!(hours_of(store.clone(), A.to_string()).await, 1);
    assert_eq!(hours_of(store.clone(), placeholder).await, 1);
    assert_eq!(
        hours_of(store.clone(), B.to_string()).await,
        3,
        "08:00 to 10:00, the agent's window"
    );
    let again = store
        .observe_inventory_list(&sheet, &[B.to_string()], &[], t("2026-12-02T08:40:00Z"))
        .await
        .unwrap();
    assert_eq!(again, 0);
}

/// NVIDIA, AMD (a GPU and one of its compute partitions) and Gaudi on one host, plus an AMD
/// placeholder from a count source that named its vendor: every vendor is counted by the same
/// figures, the summary groups by vendor, the vendor filter selects, and a partition is never
/// counted as a GPU (as a MIG instance is not).
async fn a_mixed_vendor_fleet_is_one_ledger(store: Store) {
    let body = r#"{
      "gpus": [
        {"uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "model": "NVIDIA H100 80GB HBM3",
         "host": "mixed-1", "labels": {"team": "nlp"}, "observed_at": "2026-12-01T00:00:00Z"},
        {"uuid": "AMD-SN-692024000810", "model": "AMD Instinct MI300X", "memory_mib": 196592,
         "host": "mixed-1", "serial": "692024000810", "pci_bus_id": "0000:63:00.0",
         "labels": {"team": "nlp"}, "observed_at": "2026-12-01T00:00:00Z"},
        {"uuid": "AMD-SN-692024000810/P1", "model": "AMD Instinct MI300X", "host": "mixed-1",
         "mig_parent_uuid": "AMD-SN-692024000810", "mig_profile": "CPX",
         "labels": {"team": "nlp"}, "observed_at": "2026-12-01T00:00:00Z"},
        {"uuid": "HL-PCI-mixed-1-0000:9a:00.0", "model": "HL-225", "memory_mib": 98304,
         "host": "mixed-1", "pci_bus_id": "0000:9a:00.0", "labels": {"team": "vision"},
         "observed_at": "2026-12-01T00:00:00Z"}
      ],
      "samples": [
        {"gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "ts": "2026-12-01T00:10:00Z", "util_pct": 50},
        {"gpu_uuid": "AMD-SN-692024000810", "ts": "2026-12-01T00:10:00Z", "util_pct": 2},
        {"gpu_uuid": "HL-PCI-mixed-1-0000:9a:00.0", "ts": "2026-12-01T00:10:00Z", "mem_used_mib": 768}
      ]
    }"#;
    let out = push(&store, &who("mixed", None), body).await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    store
        .observe_host_gpu_count(
            &who("k8s", None),
            &HostGpus {
                host: "amd-node".into(),
                count: 1,
                labels: [("vendor".to_string(), "amd".to_string())].into(),
                ..Default::default()
            },
            t("2026-12-01T00:00:00Z"),
        )
        .await
        .unwrap();
    let s = store
        .summary(day(), &Filters::default(), GroupBy::Vendor, now())
        .await
        .unwrap();
    let keys: Vec<&str> = s.groups.iter().map(|g| g.key.as_str()).collect();
    assert_eq!(s.total.gpus, 4, "{keys:?}");
    // Each pushed GPU is present 00:00-02:59 (its sample at 00:10 plus the 2 h stale window);
    // the placeholder 00:00-01:59 (its count at 00:00 plus the stale window).
    assert_eq!(group(&s.groups, "nvidia").gpu_hours, 3);
    assert_eq!(group(&s.groups, "nvidia").busy_hours, 1);
    let amd = group(&s.groups, "amd");
    assert_eq!((amd.gpus, amd.gpu_hours, amd.idle_hours), (2, 5, 1));
    let intel = group(&s.groups, "intel");
    // Gaudi's only sample has no activity: unknown, never idle.
    assert_eq!(
        (intel.gpus, intel.idle_hours, intel.unknown_hours),
        (1, 0, 3)
    );

    let amd_only = Filters {
        vendor: vec!["amd".into()],
        ..Default::default()
    };
    let gpus = store.list_gpus(&amd_only, true, now()).await.unwrap();
    let uuids: Vec<&str> = gpus.iter().map(|g| &*g.uuid).collect();
    assert_eq!(
        uuids,
        [
            "placeholder:amd-node:0",
            "AMD-SN-692024000810",
            "AMD-SN-692024000810/P1"
        ]
    );
    assert!(gpus
        .iter()
        .all(|g| g.vendor == Some(gpuledger_model::Vendor::Amd)));
    let s = store
        .summary(day(), &amd_only, GroupBy::Team, now())
        .await
        .unwrap();
    assert_eq!(s.total.gpus, 2);
    assert_eq!(
        store.distinct("vendor").await.unwrap(),
        ["amd", "intel", "nvidia"]
    );
}

/// Slot `n` of a host's GPU pool (a Slurm job's `IDX:n`, a count source's slot) is the host's
/// `n`-th GPU by PCI address, the order Slurm and CUDA number devices in, not by UUID: here the
/// UUID order is the reverse of the PCI order, and a GPU without an address comes last.
async fn pool_slots_land_on_gpus_in_pci_order(store: Store) {
    let slurm = who("slurm", None);
    let agent = who("agent", None);
    store
        .observe_host_gpu_count(
            &slurm,
            &HostGpus {
                host: "gpu-n1".into(),
                count: 3,
                model: Some("NVIDIA H100 80GB HBM3".into()),
                ..Default::default()
            },
            t("2026-12-02T08:00:00Z"),
        )
        .await
        .unwrap();
    push_at(
        &store,
        &agent,
        &format!(
            r#"{{"gpus":[
              {{"uuid":"{A}","model":"NVIDIA H100 80GB HBM3","host":"gpu-n1","pci_bus_id":"00000000:BB:00.0","observed_at":"2026-12-02T08:05:00Z"}},
              {{"uuid":"{B}","model":"NVIDIA H100 80GB HBM3","host":"gpu-n1","pci_bus_id":"00000000:1a:00.0","observed_at":"2026-12-02T08:05:00Z"}},
              {{"uuid":"{C}","model":"NVIDIA H100 80GB HBM3","host":"gpu-n1","observed_at":"2026-12-02T08:05:00Z"}}]}}"#
        ),
        t("2026-12-02T08:05:00Z"),
    )
    .await;
    let job = |name: &str, slots: &[u32]| {
        let held: Vec<String> = slots
            .iter()
            .map(|slot| {
                format!(
                    r#"{{"gpu_uuid":"placeholder:gpu-n1:{slot}","start":"2026-12-02T08:10:00Z","workload":"{name}","kind":"slurm_job","user":"ana"}}"#
                )
            })
            .collect();
        format!(r#"{{"allocations":[{}]}}"#, held.join(","))
    };
    let on = |uuid: &'static str, name: &'static str| {
        let store = &store;
        async move {
            workloads_on(store, uuid)
                .await
                .into_iter()
                .filter(|w| w.0 == name)
                .count()
        }
    };
    // A job on slots 0 and 1 holds the two lowest PCI addresses, B then A.
    collect_at(
        &store,
        &slurm,
        &job("job-7", &[0, 1]),
        t("2026-12-02T08:11:00Z"),
    )
    .await;
    assert_eq!(
        (
            on(B, "job-7").await,
            on(A, "job-7").await,
            on(C, "job-7").await
        ),
        (1, 1, 0)
    );
    // Slot 2 is the GPU without an address.
    collect_at(
        &store,
        &slurm,
        &job("job-8", &[2]),
        t("2026-12-02T08:11:00Z"),
    )
    .await;
    assert_eq!(
        (
            on(B, "job-8").await,
            on(A, "job-8").await,
            on(C, "job-8").await
        ),
        (0, 0, 1)
    );
    // Slot 0 alone lands on the lowest PCI address, whatever the UUIDs say.
    collect_at(
        &store,
        &slurm,
        &job("job-9", &[0]),
        t("2026-12-02T08:12:00Z"),
    )
    .await;
    assert_eq!(
        (
            on(B, "job-9").await,
            on(A, "job-9").await,
            on(C, "job-9").await
        ),
        (1, 0, 0)
    );
}

/// Slurm's `gres/gpuutil` and `gres/gpumem` of a job arrive as its allocation's averages. They
/// fill the job's hours on the GPU that no sample measured, marked as such; a measured hour
/// keeps its samples; the filled figures follow the allocation when it changes, and move with
/// it when a real GPU takes over the placeholder the job was placed on.
async fn a_schedulers_average_fills_only_the_hours_no_sample_measured(store: Store) {
    let agent = who("agent", None);
    let slurm = who("slurm", None);
    // A present 04:00–07:59; hour 04 measured at 60 %, hour 05 has a sample without activity,
    // hours 06 and 07 only the stale window of it.
    push_at(
        &store,
        &agent,
        &format!(
            r#"{{"gpus":[{{"uuid":"{A}","model":"NVIDIA H100 80GB HBM3","host":"hpc-1","labels":{{"team":"hpc"}},"observed_at":"2026-12-02T04:00:00Z"}}],
               "samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T04:30:00Z","util_pct":60,"mem_used_mib":30000}},
                          {{"gpu_uuid":"{A}","ts":"2026-12-02T05:30:00Z","power_w":90}}]}}"#
        ),
        t("2026-12-02T06:15:00Z"),
    )
    .await;
    let job = |avg: &str| {
        format!(
            r#"{{"allocations":[{{"gpu_uuid":"{A}","start":"2026-12-02T04:15:00Z","end":"2026-12-02T07:45:00Z","workload":"4242","kind":"slurm_job","user":"ana"{avg}}}]}}"#
        )
    };
    let out = push_at(
        &store,
        &slurm,
        &job(r#","avg_util_pct":3.0,"avg_mem_used_mib":2048"#),
        t("2026-12-02T07:50:00Z"),
    )
    .await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let hours = |store: &Store| {
        let store = store.clone();
        async move {
            let d = store.gpu_detail(A, dec2(), now()).await.unwrap().unwrap();
            d.hours
                .iter()
                .map(|h| {
                    (
                        h.hour.format("%H").to_string(),
                        h.activity_pct,
                        h.activity_origin.clone(),
                        h.mem_used_mib_max,
                        h.mem_origin.clone(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let s = |x: &str| Some(x.to_string());
    let (samples, avg) = (s("samples"), s("allocation average"));
    assert_eq!(
        hours(&store).await,
        vec![
            (
                "04".into(),
                Some(60.0),
                samples.clone(),
                Some(30000.0),
                samples.clone()
            ),
            (
                "05".into(),
                Some(3.0),
                avg.clone(),
                Some(2048.0),
                avg.clone()
            ),
            (
                "06".into(),
                Some(3.0),
                avg.clone(),
                Some(2048.0),
                avg.clone()
            ),
            (
                "07".into(),
                Some(3.0),
                avg.clone(),
                Some(2048.0),
                avg.clone()
            ),
        ]
    );
    // The filled hours count as known, and as idle under the 5 % threshold: one definition.
    let team = |store: &Store| {
        let store = store.clone();
        async move {
            let sum = store
                .summary(dec2(), &Filters::default(), GroupBy::Team, now())
                .await
                .unwrap();
            let g = group(&sum.groups, "hpc");
            (
                g.gpu_hours,
                g.unknown_hours,
                g.idle_hours,
                g.allocated_idle_hours,
            )
        }
    };
    assert_eq!(team(&store).await, (4, 0, 3, 3));
    // The allocation shows its averages.
    let d = store.gpu_detail(A, dec2(), now()).await.unwrap().unwrap();
    assert_eq!(
        (
            d.allocations[0].avg_util_pct,
            d.allocations[0].avg_mem_used_mib
        ),
        (Some(3.0), Some(2048.0))
    );

    // A late sample measures hour 06: its activity wins, its memory stays the job's; its stale
    // window makes hour 08 present, which no job held: unknown.
    push_at(
        &store,
        &agent,
        &format!(
            r#"{{"samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T06:20:00Z","util_pct":90}}]}}"#
        ),
        t("2026-12-02T07:55:00Z"),
    )
    .await;
    let h = hours(&store).await;
    assert_eq!(
        h[2],
        (
            "06".into(),
            Some(90.0),
            samples.clone(),
            Some(2048.0),
            avg.clone()
        )
    );
    assert_eq!(h[4], ("08".into(), None, None, None, None));
    assert_eq!(team(&store).await, (5, 1, 2, 2));
    // A late sample that measures neither activity nor memory, on hour 05, which the job's
    // averages fill: the hour still has no measured figure, so the fill stays.
    push_at(
        &store,
        &agent,
        &format!(
            r#"{{"samples":[{{"gpu_uuid":"{A}","ts":"2026-12-02T05:40:00Z","power_w":95}}]}}"#
        ),
        t("2026-12-02T07:56:00Z"),
    )
    .await;
    let h = hours(&store).await;
    assert_eq!(
        h[1],
        (
            "05".into(),
            Some(3.0),
            avg.clone(),
            Some(2048.0),
            avg.clone()
        )
    );
    assert_eq!(team(&store).await, (5, 1, 2, 2));

    // The job reported again with another average: the filled hours follow it.
    push_at(
        &store,
        &slurm,
        &job(r#","avg_util_pct":40.0"#),
        t("2026-12-02T07:58:00Z"),
    )
    .await;
    let h = hours(&store).await;
    assert_eq!(h[1], ("05".into(), Some(40.0), avg.clone(), None, None));
    assert_eq!(h[3], ("07".into(), Some(40.0), avg.clone(), None, None));
    assert_eq!(team(&store).await, (5, 1, 0, 0));
    // Without averages, the hours no sample measured are unknown again, never 0 %.
    push_at(&store, &slurm, &job(""), t("2026-12-02T07:59:00Z")).await;
    let h = hours(&store).await;
    assert_eq!(h[1], ("05".into(), None, None, None, None));
    assert_eq!(h[3], ("07".into(), None, None, None, None));
    assert_eq!(team(&store).await, (5, 3, 0, 0));

    // On a placeholder: the job's average fills the pool GPU's hours, and moves with the job
    // to the real GPU that takes the placeholder over.
    store
        .observe_host_gpu_count(
            &slurm,
            &HostGpus {
                host: "hpc-2".into(),
                count: 1,
                model: Some("NVIDIA H100 80GB HBM3".into()),
                ..Default::default()
            },
            t("2026-12-02T08:00:00Z"),
        )
        .await
        .unwrap();
    collect_at(
        &store,
        &slurm,
        r#"{"allocations":[{"gpu_uuid":"placeholder:hpc-2:0","start":"2026-12-02T08:05:00Z","end":"2026-12-02T09:30:00Z","workload":"4243","kind":"slurm_job","user":"ana","avg_util_pct":70.0}]}"#,
        t("2026-12-02T09:40:00Z"),
    )
    .await;
    push_at(
        &store,
        &agent,
        &format!(
            r#"{{"gpus":[{{"uuid":"{B}","model":"NVIDIA H100 80GB HBM3","host":"hpc-2","observed_at":"2026-12-02T09:45:00Z"}}]}}"#
        ),
        t("2026-12-02T09:45:00Z"),
    )
    .await;
    let d = store.gpu_detail(B, dec2(), now()).await.unwrap().unwrap();
    let filled: Vec<(String, Option<f64>, Option<String>)> = d
        .hours
        .iter()
        .map(|h| {
            (
                h.hour.format("%H").to_string(),
                h.activity_pct,
                h.activity_origin.clone(),
            )
        })
        .collect();
    assert_eq!(
        filled,
        vec![
            ("08".into(), Some(70.0), avg.clone()),
            ("09".into(), Some(70.0), avg.clone()),
            ("10".into(), None, None),
            ("11".into(), None, None),
        ]
    );
}

/// Hourly samples of `uuid` from `from` to `to` (exclusive), at half past each hour.
fn hourly_samples(uuid: &str, from: &str, to: &str) -> String {
    let (mut at, to) = (t(from), t(to));
    let mut out = Vec::new();
    while at < to {
        out.push(format!(
            r#"{{"gpu_uuid":"{uuid}","ts":"{}","util_pct":50.0}}"#,
            at.format("%Y-%m-%dT%H:%M:%SZ")
        ));
        at += Duration::hours(1);
    }
    out.join(",")
}

/// The forecast's inputs are the summary's rows: its month so far equals the summary's cost,
/// GPU-hours and unpriced hours of the same days, per team and in total, with and without a
/// filter, across a change of owner inside the month. A team with under a week of history has
/// no projection.
async fn forecast_month_so_far_equals_the_summary(store: Store) {
    let p = who("hand", None);
    let gpu = |uuid: &str, model: &str, team: &str, at: &str| {
        format!(
            r#"{{"uuid":"{uuid}","model":"{model}","labels":{{"team":"{team}","env":"prod"}},"observed_at":"{at}"}}"#
        )
    };
    for (uuid, model, team, from) in [
        (A, "NVIDIA H100 80GB HBM3", "nlp", "2026-11-22T00:30:00Z"),
        (B, "Tesla T4", "vision", "2026-11-28T00:30:00Z"),
        (C, "Mystery GPU", "nlp", "2026-11-25T00:30:00Z"),
    ] {
        let body = format!(
            r#"{{"gpus":[{}],"samples":[{}]}}"#,
            gpu(uuid, model, team, from),
            hourly_samples(uuid, from, "2026-12-02T12:00:00Z")
        );
        let out = push(&store, &p, &body).await;
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    }
    // A moves to vision from 2026-12-01 06:00.
    push(
        &store,
        &p,
        &format!(
            r#"{{"gpus":[{}]}}"#,
            gpu(A, "NVIDIA H100 80GB HBM3", "vision", "2026-12-01T06:10:00Z")
        ),
    )
    .await;
    let month = hours_window("2026-12-01T00:00:00Z", "2026-12-02T12:00:00Z");
    for filters in [
        Filters::default(),
        Filters {
            team: vec!["nlp".into()],
            ..Default::default()
        },
        Filters {
            model: vec!["Tesla T4".into()],
            ..Default::default()
        },
    ] {
        let s = store
            .summary(month, &filters, GroupBy::Team, now())
            .await
            .unwrap();
        let (groups, total) = store
            .forecast(&filters, GroupBy::Team, now())
            .await
            .unwrap();
        // The pages' total alone (without the owner periods when no team or environment
        // filter needs them) is the same forecast.
        assert_eq!(
            store.forecast_total(&filters, now()).await.unwrap(),
            total,
            "{filters:?}"
        );
        assert!(s.total.cost_usd > 0.0);
        assert_eq!(total.month_to_date_usd, s.total.cost_usd, "{filters:?}");
        assert_eq!(total.unpriced_gpu_hours, s.total.unpriced_gpu_hours);
        for g in &s.groups {
            let f = groups.iter().find(|f| f.key == g.key).unwrap();
            assert_eq!(
                (f.month_to_date_usd, f.unpriced_gpu_hours),
                (g.cost_usd, g.unpriced_gpu_hours),
                "{}",
                g.key
            );
        }
        let rows = store.forecast_days(month, &filters, now()).await.unwrap();
        let hours: i64 = rows.iter().map(|r| r.gpu_hours).sum();
        assert_eq!(hours, s.total.gpu_hours);
    }
    let (groups, _) = store
        .forecast(&Filters::default(), GroupBy::Team, now())
        .await
        .unwrap();
    let nlp = groups.iter().find(|f| f.key == "nlp").unwrap();
    // nlp's history starts 2026-11-22 00:30, a partial day: its basis is 2026-11-23 ..=
    // 2026-12-01, nine complete days.
    assert_eq!(nlp.basis.days, 9);
    let me = nlp.month_end_usd.clone().unwrap();
    assert!(me.low <= me.expected && me.expected <= me.high, "{me:?}");
    assert!(me.expected > nlp.month_to_date_usd);
    // nlp's own unpriced hours: C's 36 hours of December.
    assert_eq!(nlp.unpriced_gpu_hours, 36);
    // vision since 2026-11-28 00:30: three complete days after its partial first, no
    // projection (never $0).
    let vision = groups.iter().find(|f| f.key == "vision").unwrap();
    assert_eq!(vision.basis.days, 3);
    assert_eq!(vision.month_end_usd, None);
    assert!(vision
        .note
        .as_deref()
        .unwrap()
        .contains("not enough history"));
}

both!(forecast_month_so_far_equals_the_summary);

/// The Overview's one read of today (`windows_trend_forecast`) gives the figures of the
/// separate reads: the per-GPU windows, the daily and hourly trends and the total's forecast,
/// for windows that run to now (today's part shared), start today, or end before now (read
/// apart), with and without filters, across a change of owner today and a GPU without a rate;
/// each time while the days before today are read and while they are kept.
async fn overview_reads_today_once_with_the_same_figures(store: Store) {
    let p = who("hand", None);
    let gpu = |uuid: &str, model: &str, team: &str, at: &str| {
        format!(
            r#"{{"uuid":"{uuid}","model":"{model}","labels":{{"team":"{team}","env":"prod"}},"observed_at":"{at}"}}"#
        )
    };
    for (uuid, model, team, from, to) in [
        (
            A,
            "NVIDIA H100 80GB HBM3",
            "nlp",
            "2026-11-20T00:30:00Z",
            "2026-12-02T12:00:00Z",
        ),
        (
            B,
            "Tesla T4",
            "vision",
            "2026-11-28T00:30:00Z",
            "2026-12-02T07:00:00Z",
        ),
        (
            C,
            "Mystery GPU",
            "nlp",
            "2026-11-25T00:30:00Z",
            "2026-12-02T12:00:00Z",
        ),
    ] {
        let body = format!(
            r#"{{"gpus":[{}],"samples":[{}]}}"#,
            gpu(uuid, model, team, from),
            hourly_samples(uuid, from, to)
        );
        let out = push(&store, &p, &body).await;
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    }
    // A moves to vision today at 06:10; C is idle this morning, held by a pod since
    // yesterday.
    let out = push(
        &store,
        &p,
        &format!(
            r#"{{"gpus":[{}],"samples":[{{"gpu_uuid":"{C}","ts":"2026-12-02T09:20:00Z","util_pct":0}}],
              "allocations":[{{"gpu_uuid":"{C}","start":"2026-12-01T20:00:00Z","workload":"train-1","kind":"pod","team":"nlp"}}]}}"#,
            gpu(A, "NVIDIA H100 80GB HBM3", "vision", "2026-12-02T06:10:00Z")
        ),
    )
    .await;
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let f = |k: &str, v: &str| {
        let mut f = Filters::default();
        *f.values_mut(k).unwrap() = vec![v.to_string()];
        f
    };
    let windows = [
        ("2026-11-02T12:00:00Z", "2026-12-02T12:00:00Z"),
        ("2026-11-25T07:00:00Z", "2026-12-03T00:00:00Z"),
        ("2026-12-02T03:00:00Z", "2026-12-02T12:00:00Z"),
        ("2026-11-27T05:00:00Z", "2026-12-02T09:00:00Z"),
    ];
    let mut shared = 0;
    for round in ["read", "kept"] {
        for (from, to) in windows {
            let w = hours_window(from, to);
            for filters in [
                Filters::default(),
                f("team", "vision"),
                f("team", "nlp"),
                f("env", "prod"),
                f("model", "Mystery GPU"),
            ] {
                for daily in [true, false] {
                    let at = format!("{round} {from}..{to} {filters:?} daily {daily}");
                    let one = store
                        .windows_trend_forecast(w, &filters, daily, now())
                        .await
                        .unwrap();
                    let apart = (
                        store.gpu_windows(w, &filters, now()).await.unwrap(),
                        store.series(w, &filters, daily, now()).await.unwrap(),
                        store.forecast_total(&filters, now()).await.unwrap(),
                    );
                    assert_close_debug(&one, &apart, &at);
                    if daily {
                        // The Teams page's reads at once (today's rows read once for all that
                        // run to now) give each read's figures, against a window that runs
                        // to now and one that may not.
                        let next =
                            windows[(windows.iter().position(|x| *x == (from, to)).unwrap() + 1)
                                % windows.len()];
                        for other in [next, (from, to)] {
                            let w2 = hours_window(other.0, other.1);
                            let at = format!("{at} with {other:?}");
                            let once = store
                                .summary_and_series_by_team(w, [w2, w], &filters, now())
                                .await
                                .unwrap();
                            let apart = (
                                store
                                    .summary(w, &filters, GroupBy::Team, now())
                                    .await
                                    .unwrap(),
                                [
                                    store
                                        .daily_series_by_team(w2, &filters, now())
                                        .await
                                        .unwrap(),
                                    store
                                        .daily_series_by_team(w, &filters, now())
                                        .await
                                        .unwrap(),
                                ],
                            );
                            assert_close_debug(&once, &apart, &at);
                        }
                        // The trend per team (today's points summed from the shared rows
                        // where the window runs to now): each team's points are the trend
                        // filtered to that team.
                        let by_team = store
                            .daily_series_by_team(w, &filters, now())
                            .await
                            .unwrap();
                        let mut teams: Vec<&String> = by_team.iter().map(|(t, _)| t).collect();
                        teams.dedup();
                        teams.sort();
                        teams.dedup();
                        assert!(!teams.is_empty() || filters.model.len() == 1, "{at}");
                        for team in teams {
                            let mine: Vec<_> = by_team
                                .iter()
                                .filter(|(t, _)| t == team)
                                .map(|(_, p)| p.clone())
                                .collect();
                            let mut only = filters.clone();
                            only.team = vec![team.clone()];
                            let series = store.series(w, &only, true, now()).await.unwrap();
                            assert_close_debug(&mine, &series, &format!("{at}: team {team}"));
                        }
                    }
                    let today = t("2026-12-02T00:00:00Z");
                    if daily && w.to >= now().timestamp() && w.from < today.timestamp() {
                        // Today's point is there, summed from the shared rows.
                        let last = one.1.last().unwrap();
                        assert_eq!(last.start, today, "{at}");
                        assert!(last.gpu_hours > 0, "{at}");
                        shared += 1;
                    }
                }
            }
        }
        store.refresh_groups(now().timestamp()).await.unwrap();
    }
    assert_eq!(shared, 20);
}

both!(overview_reads_today_once_with_the_same_figures);

/// On PostgreSQL, pushes that rewrote enough GPU rows (each push rewrites the last sighting of
/// every GPU it names) vacuum and analyze `gpus` in the background, whether or not autovacuum
/// runs; pushes short of the threshold do not. (SQLite keeps no dead row versions.)
#[tokio::test]
async fn pushes_vacuum_the_gpu_rows_they_rewrite_on_postgres() {
    let name = "vacuum_gpus";
    let Some(url) = pg_url(name) else {
        return;
    };
    let schema = format!("t_{name}_{}", std::process::id());
    Store::drop_schema(&url, &schema).await.unwrap();
    let store = Store::open_in_schema(&url, Some(&schema), Settings::default())
        .await
        .unwrap();
    let stats = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    // Manual vacuums and analyzes only: autovacuum counts apart.
    let counts = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT vacuum_count, analyze_count FROM pg_stat_user_tables \
             WHERE schemaname = $1 AND relname = 'gpus'",
        )
        .bind(schema.clone())
        .fetch_one(&stats)
        .await
        .unwrap()
    };
    let vacuums = || async { counts().await.0 };
    let body = |minute: u32| {
        format!(
            r#"{{"gpus": [{{"uuid": "{A}", "model": "NVIDIA H100 80GB HBM3", "host": "n1",
                 "labels": {{"team": "nlp"}}, "observed_at": "2026-12-02T11:{minute:02}:00Z"}}],
               "samples": [{{"gpu_uuid": "{A}", "ts": "2026-12-02T11:{minute:02}:00Z", "util_pct": 50}}]}}"#
        )
    };
    // Two rewrites a push (the record and its sighting): three pushes stay under ten.
    store.set_vacuum_gpus_after(10);
    for minute in 0..3 {
        push(&store, &who("rack", None), &body(minute)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(counts().await, (0, 0), "vacuumed before the threshold");
    // The next two reach it.
    for minute in 3..5 {
        push(&store, &who("rack", None), &body(minute)).await;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while vacuums().await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "gpus not vacuumed 20 s after the threshold"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(counts().await.1, 1, "analyzed with the vacuum");
    stats.close().await;
    Store::drop_schema(&url, &schema).await.unwrap();
}

/// On PostgreSQL, pushes that stored enough samples analyze the tables pushes grow in the
/// background, so that a bulk load is planned from statistics before autovacuum or the hourly
/// maintenance comes; pushes short of the threshold do not.
#[tokio::test]
async fn pushes_vacuum_and_analyze_the_tables_they_grow_on_postgres() {
    let Some((store, stats, url, schema)) = postgres_schema(
        "pushes_vacuum_and_analyze_the_tables_they_grow",
        "t_analyze_pushed",
    )
    .await
    else {
        return;
    };
    // Manual vacuums and analyzes of the allocations and the day rows (autovacuum's count
    // apart): the least of the four counts.
    let analyzed = || async {
        sqlx::query_as::<_, (i64,)>(
            "SELECT CAST(MIN(LEAST(analyze_count, vacuum_count)) AS BIGINT) \
             FROM pg_stat_user_tables \
             WHERE schemaname = $1 AND relname IN ('allocations', 'gpu_days')",
        )
        .bind(schema.clone())
        .fetch_one(&stats)
        .await
        .unwrap()
        .0
    };
    let body = |minutes: std::ops::Range<u32>| {
        let samples: Vec<String> = minutes
            .map(|m| {
                format!(
                    r#"{{"gpu_uuid": "{A}", "ts": "2026-12-02T11:{m:02}:00Z", "util_pct": 50}}"#
                )
            })
            .collect();
        format!(
            r#"{{"gpus": [{{"uuid": "{A}", "model": "NVIDIA H100 80GB HBM3", "host": "n1",
                 "labels": {{"team": "nlp"}}, "observed_at": "2026-12-02T11:00:00Z"}}],
               "samples": [{}]}}"#,
            samples.join(",")
        )
    };
    store.set_analyze_after(10);
    push(&store, &who("rack", None), &body(0..6)).await;
    // Samples already stored are not new.
    push(&store, &who("rack", None), &body(0..6)).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(analyzed().await, 0, "analyzed before the threshold");
    push(&store, &who("rack", None), &body(6..10)).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while analyzed().await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "not vacuumed and analyzed 20 s after the threshold"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    stats.close().await;
    Store::drop_schema(&url, &schema).await.unwrap();
}

/// Hours and days past the planner's last analysis are counted from the index, not taken for
/// one row: a week's partition (made by the server, after the migrations) analyzed with 20
/// distinct hours, and `gpu_days` with 20 distinct days, then given one more of each; the
/// planner's estimate for the new one must be near the 300 rows it holds. With the default
/// statistics target the 20 values are kept as a list and the new one is estimated at 1 row,
/// and the re-rolls of a push then read every GPU's rows of the hour by the index by time.
#[tokio::test]
async fn the_planner_counts_hours_and_days_past_its_analysis_on_postgres() {
    use sqlx::Executor;
    let Some((store, pool, url, schema)) = postgres_schema(
        "the_planner_counts_hours_and_days_past_its_analysis",
        "t_time_stats",
    )
    .await
    else {
        return;
    };
    // A week's partition made as the server makes them, whole ahead of the clock.
    let week = 7 * 86_400;
    let clock = t("2027-03-03T12:00:00Z").timestamp();
    assert!(store.ensure_partitions(clock).await.unwrap() > 0);
    let monday = clock.div_euclid(week) * week + 86_400;
    let estimate = |sql: String| {
        let pool = pool.clone();
        async move {
            // The top line: `Append  (cost=0.00..1.00 rows=1 width=8)`.
            let (plan,): (String,) = sqlx::query_as(&format!("EXPLAIN {sql}"))
                .fetch_one(&pool)
                .await
                .unwrap();
            let rows = plan
                .split(" rows=")
                .nth(1)
                .and_then(|r| r.split(' ').next());
            rows.and_then(|r| r.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no row estimate in {plan:?}"))
        }
    };
    let hours = |from: i64, n: i64| {
        format!(
            "INSERT INTO gpu_hours (gpu_id, hour) SELECT g, h FROM generate_series(1, 300) g, \
             generate_series({from}, {}, 3600) h",
            from + (n - 1) * 3600
        )
    };
    let days = |from: i64, n: i64| {
        format!(
            "INSERT INTO gpu_days (gpu_id, day, present_hours, known_hours, act_sum, \
             idle_hours, allocated_hours, allocated_idle_hours) SELECT g, d, 24, 24, 0, 0, 0, 0 \
             FROM generate_series(1, 300) g, generate_series({from}, {}, 86400) d",
            from + (n - 1) * 86_400
        )
    };
    pool.execute(hours(monday, 20).as_str()).await.unwrap();
    pool.execute(days(monday - 20 * 86_400, 20).as_str())
        .await
        .unwrap();
    pool.execute("ANALYZE gpu_hours, gpu_days").await.unwrap();
    let (new_hour, new_day) = (monday + 20 * 3600, monday);
    pool.execute(hours(new_hour, 1).as_str()).await.unwrap();
    pool.execute(days(new_day, 1).as_str()).await.unwrap();
    let rows = estimate(format!(
        "SELECT gpu_id FROM gpu_hours WHERE hour >= {new_hour} AND hour < {}",
        new_hour + 3600
    ))
    .await;
    assert!(rows >= 30.0, "a new hour's 300 rows estimated at {rows}");
    let rows = estimate(format!(
        "SELECT gpu_id FROM gpu_days WHERE day >= {new_day}"
    ))
    .await;
    assert!(rows >= 30.0, "a new day's 300 rows estimated at {rows}");
    pool.close().await;
    Store::drop_schema(&url, &schema).await.unwrap();
}
