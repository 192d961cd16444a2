//! Turning reads into push API v1 bodies: inventory on the first read, every `inventory_secs`
//! and whenever it changes; one sample per GPU per read; an allocation of kind `process` opened
//! when a process appears on a GPU and closed when it is gone.
//!
//! Time comes in as an argument, so tests drive this with any clock they like.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpuledger_model::{AllocationKind, Cloud, PushAllocation, PushBody, PushGpu, PushSample};
use serde::{Deserialize, Serialize};

use crate::procs::{ProcInfo, ProcReader};
use crate::source::{GpuReading, ProcessReading, Snapshot};

/// The longest workload text; the server refuses more than 256 bytes.
const MAX_WORKLOAD_BYTES: usize = 200;

/// What the agent says about the host its GPUs are in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostInfo {
    pub host: Option<String>,
    pub cluster: Option<String>,
    pub cloud: Option<Cloud>,
    pub region: Option<String>,
    pub instance_type: Option<String>,
    /// The cloud account, project or subscription (from the instance metadata service).
    pub account: Option<String>,
    /// `team` and `env` here set owner and environment on the server.
    pub labels: BTreeMap<String, String>,
}

/// An allocation the agent has reported as running and must close when the process is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenAllocation {
    pub gpu_uuid: String,
    pub pid: u32,
    pub workload: String,
    pub start: DateTime<Utc>,
    pub user: Option<String>,
    pub last_seen: DateTime<Utc>,
}

impl OpenAllocation {
    fn record(&self, end: Option<DateTime<Utc>>) -> PushAllocation {
        PushAllocation {
            context: Default::default(),
            gpu_uuid: self.gpu_uuid.clone(),
            start: self.start,
            end: end.map(|e| e.max(self.start)),
            workload: self.workload.clone(),
            kind: AllocationKind::Process,
            user: self.user.clone(),
            team: None,
            owner: None,
            avg_util_pct: None,
            avg_mem_used_mib: None,
        }
    }
}

/// Looks processes up; [`ProcReader`] on a real host, anything in tests.
pub trait ProcLookup {
    fn inspect(&mut self, pid: u32) -> ProcInfo;
}

impl ProcLookup for ProcReader {
    fn inspect(&mut self, pid: u32) -> ProcInfo {
        ProcReader::inspect(self, pid)
    }
}

/// No process lookup (`--no-processes`, or nothing to read): every fact stays unknown.
pub struct NoProcs;

impl ProcLookup for NoProcs {
    fn inspect(&mut self, _pid: u32) -> ProcInfo {
        ProcInfo::default()
    }
}

/// The workload text of a process: its name and PID, and its pod and container when it runs in
/// one, e.g. `python pid=5762 pod=2b9a6c3a-… container=9ec39b91f3d7`.
pub fn workload(p: &ProcessReading, info: &ProcInfo) -> String {
    let name = p
        .name
        .as_deref()
        .or(info.comm.as_deref())
        .map(|n| n.trim())
        .filter(|n| !n.is_empty());
    let mut w = String::new();
    if let Some(n) = name {
        let mut cut = n.len().min(120);
        while !n.is_char_boundary(cut) {
            cut -= 1;
        }
        w.push_str(&n[..cut]);
        w.push(' ');
    }
    w.push_str(&format!("pid={}", p.pid));
    if let Some(pod) = &info.pod_uid {
        w.push_str(&format!(" pod={pod}"));
    }
    if let Some(c) = &info.container_id {
        w.push_str(&format!(" container={}", &c[..c.len().min(12)]));
    }
    let mut cut = w.len().min(MAX_WORKLOAD_BYTES);
    while !w.is_char_boundary(cut) {
        cut -= 1;
    }
    w.truncate(cut);
    w
}

/// Builds bodies from reads and remembers what it reported.
#[derive(Debug)]
pub struct Reporter {
    host: HostInfo,
    inventory_every_secs: i64,
    /// When the inventory was last put in a body, and what it was (observed_at left out).
    last_inventory: Option<(DateTime<Utc>, String)>,
    /// The latest inventory record of every GPU seen, to re-send when the server has lost it.
    gpus_seen: BTreeMap<String, PushGpu>,
    /// Running allocations by (GPU, PID).
    open: BTreeMap<(String, u32), OpenAllocation>,
    /// The last sample time, so that no two reads share a second (the server keys samples by GPU
    /// and whole second).
    last_ts: Option<DateTime<Utc>>,
    report_processes: bool,
    open_changed: bool,
}

impl Reporter {
    pub fn new(host: HostInfo, inventory_every_secs: u64, report_processes: bool) -> Reporter {
        Reporter {
            host,
            inventory_every_secs: inventory_every_secs.max(1) as i64,
            last_inventory: None,
            gpus_seen: BTreeMap::new(),
            open: BTreeMap::new(),
            last_ts: None,
            report_processes,
            open_changed: false,
        }
    }

    /// The time to stamp a read made at `now`: whole seconds, and later than the previous one.
    /// `None` when a read at `now` would share the previous read's second.
    pub fn sample_time(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let ts = DateTime::from_timestamp(now.timestamp(), 0)?;
        match self.last_ts {
            Some(last) if ts <= last => None,
            _ => Some(ts),
        }
    }

    fn record(&self, g: &GpuReading, now: DateTime<Utc>) -> PushGpu {
        let mut labels = self.host.labels.clone();
        if let Some(v) = &g.driver_version {
            labels.insert("driver_version".into(), v.clone());
        }
        if let Some(v) = &g.cuda_version {
            labels.insert("cuda_version".into(), v.clone());
        }
        if let Some(v) = &g.card_vendor {
            labels.insert("card_vendor".into(), v.clone());
        }
        if let Some(m) = g.mig_enabled {
            labels.insert(
                "mig_mode".into(),
                if m { "enabled" } else { "disabled" }.into(),
            );
        }
        PushGpu {
            account: self.host.account.clone(),
            uuid: g.uuid.clone(),
            model: g.model.clone().unwrap_or_else(|| "unknown".into()),
            memory_mib: g.memory_mib,
            host: self.host.host.clone(),
            cluster: self.host.cluster.clone(),
            cloud: self.host.cloud,
            region: self.host.region.clone(),
            instance_type: self.host.instance_type.clone(),
            serial: g.serial.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
            mig_parent_uuid: g.mig_parent_uuid.clone(),
            mig_profile: g.mig_profile.clone(),
            labels,
            observed_at: now,
        }
    }

    /// The body for one read at `ts` (from [`Reporter::sample_time`]).
    pub fn build(
        &mut self,
        snap: &Snapshot,
        procs: &mut dyn ProcLookup,
        ts: DateTime<Utc>,
    ) -> PushBody {
        self.last_ts = Some(ts);
        let mut body = PushBody::default();

        let records: Vec<PushGpu> = snap.gpus.iter().map(|g| self.record(g, ts)).collect();
        let fingerprint = {
            let mut r = records.clone();
            for g in &mut r {
                g.observed_at = DateTime::UNIX_EPOCH;
            }
            serde_json::to_string(&r).unwrap_or_default()
        };
        let due = match &self.last_inventory {
            None => true,
            Some((at, fp)) => {
                *fp != fingerprint || (ts - *at).num_seconds() >= self.inventory_every_secs
            }
        };
        if due && !records.is_empty() {
            self.last_inventory = Some((ts, fingerprint));
            body.gpus = records.clone();
        }
        for r in records {
            self.gpus_seen.insert(r.uuid.clone(), r);
        }

        for g in &snap.gpus {
            if g.util_pct.is_none()
                && g.mem_used_mib.is_none()
                && g.power_w.is_none()
                && g.sm_active.is_none()
            {
                // Nothing measured: an empty sample would say nothing the inventory does not.
                continue;
            }
            body.samples.push(PushSample {
                gpu_uuid: g.uuid.clone(),
                ts,
                util_pct: g.util_pct,
                mem_used_mib: g.mem_used_mib,
                power_w: g.power_w,
                sm_active: g.sm_active,
            });
        }

        if self.report_processes && !snap.processes_failed {
            self.allocations(snap, procs, ts, &mut body);
        }
        body
    }

    fn allocations(
        &mut self,
        snap: &Snapshot,
        procs: &mut dyn ProcLookup,
        ts: DateTime<Utc>,
        body: &mut PushBody,
    ) {
        let mut seen: BTreeMap<(String, u32), ()> = BTreeMap::new();
        for p in &snap.processes {
            if p.is_graphics_only() {
                continue;
            }
            let key = (p.gpu_uuid.clone(), p.pid);
            if seen.insert(key.clone(), ()).is_some() {
                continue;
            }
            let info = procs.inspect(p.pid);
            if let Some(open) = self.open.get_mut(&key) {
                // Same PID, but a different start: the PID was reused by a new process.
                let reused = info.start.is_some_and(|s| s != open.start);
                if !reused {
                    open.last_seen = ts;
                    continue;
                }
                let old = self.open.remove(&key).map(|o| o.record(Some(o.last_seen)));
                body.allocations.extend(old);
            }
            let open = OpenAllocation {
                gpu_uuid: p.gpu_uuid.clone(),
                pid: p.pid,
                workload: workload(p, &info),
                // Without /proc the first sighting stands in for the start; it is remembered
                // across restarts in the state file, so re-sends still hit the same record.
                start: info.start.unwrap_or(ts),
                user: info.user.clone(),
                last_seen: ts,
            };
            body.allocations.push(open.record(None));
            self.open.insert(key, open);
            self.open_changed = true;
        }
        let gone: Vec<(String, u32)> = self
            .open
            .keys()
            .filter(|k| !seen.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(o) = self.open.remove(&k) {
                body.allocations.push(o.record(Some(o.last_seen)));
                self.open_changed = true;
            }
        }
    }

    /// Inventory records for `uuids`, to send again when the server answered that it does not
    /// know those GPUs.
    pub fn inventory_for<'a>(&self, uuids: impl IntoIterator<Item = &'a str>) -> Vec<PushGpu> {
        let mut out: Vec<PushGpu> = uuids
            .into_iter()
            .filter_map(|u| self.gpus_seen.get(u).cloned())
            .collect();
        // A MIG instance needs its parent known first.
        let parents: Vec<PushGpu> = out
            .iter()
            .filter_map(|g| g.mig_parent_uuid.as_deref())
            .filter_map(|p| self.gpus_seen.get(p).cloned())
            .collect();
        for p in parents.into_iter().rev() {
            if !out.iter().any(|g| g.uuid == p.uuid) {
                out.insert(0, p);
            }
        }
        out
    }

    /// Make the next read send the inventory whatever its age.
    pub fn force_inventory(&mut self) {
        self.last_inventory = None;
    }

    /// The running allocations, to save across restarts, if they changed since the last call.
    pub fn take_open_if_changed(&mut self) -> Option<Vec<OpenAllocation>> {
        if !self.open_changed {
            return None;
        }
        self.open_changed = false;
        Some(self.open.values().cloned().collect())
    }

    /// Running allocations saved by an earlier run: still-running ones continue with the same
    /// start, the others are closed by the next read.
    pub fn restore_open(&mut self, open: Vec<OpenAllocation>) {
        for o in open {
            self.open.insert((o.gpu_uuid.clone(), o.pid), o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn gpu(uuid: &str, util: Option<f64>) -> GpuReading {
        GpuReading {
            uuid: uuid.into(),
            model: Some("Tesla T4".into()),
            memory_mib: Some(15360),
            util_pct: util,
            driver_version: Some("515.105.01".into()),
            mig_enabled: None,
            ..Default::default()
        }
    }

    struct Fake(BTreeMap<u32, ProcInfo>);
    impl ProcLookup for Fake {
        fn inspect(&mut self, pid: u32) -> ProcInfo {
            self.0.get(&pid).cloned().unwrap_or_default()
        }
    }

    fn host() -> HostInfo {
        HostInfo {
            host: Some("node-1".into()),
            labels: [("team".to_string(), "nlp".to_string())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn inventory_first_then_on_change_then_every_interval() {
        let mut r = Reporter::new(host(), 600, true);
        let snap = Snapshot {
            gpus: vec![gpu("GPU-a", Some(10.0))],
            ..Default::default()
        };
        let b = r.build(&snap, &mut NoProcs, t("2026-12-02T10:00:00Z"));
        assert_eq!(b.gpus.len(), 1);
        assert_eq!(b.gpus[0].labels["driver_version"], "515.105.01");
        assert_eq!(b.gpus[0].labels["team"], "nlp");
        assert_eq!(b.samples.len(), 1);
        let b = r.build(&snap, &mut NoProcs, t("2026-12-02T10:01:00Z"));
        assert!(b.gpus.is_empty());
        // A second GPU appears: inventory at once.
        let two = Snapshot {
            gpus: vec![gpu("GPU-a", Some(10.0)), gpu("GPU-b", None)],
            ..Default::default()
        };
        let b = r.build(&two, &mut NoProcs, t("2026-12-02T10:02:00Z"));
        assert_eq!(b.gpus.len(), 2);
        // GPU-b measured nothing: no sample for it, not a zero.
        assert_eq!(b.samples.len(), 1);
        let b = r.build(&two, &mut NoProcs, t("2026-12-02T10:11:59Z"));
        assert!(b.gpus.is_empty());
        let b = r.build(&two, &mut NoProcs, t("2026-12-02T10:12:00Z"));
        assert_eq!(b.gpus.len(), 2);
    }

    #[test]
    fn sample_times_are_whole_distinct_seconds() {
        let mut r = Reporter::new(host(), 600, true);
        let now = t("2026-12-02T10:00:00.700Z");
        let ts = r.sample_time(now).unwrap();
        assert_eq!(ts, t("2026-12-02T10:00:00Z"));
        r.build(&Snapshot::default(), &mut NoProcs, ts);
        assert_eq!(r.sample_time(t("2026-12-02T10:00:00.900Z")), None);
        assert!(r.sample_time(t("2026-12-02T10:00:01.000Z")).is_some());
    }

    #[test]
    fn allocations_open_close_and_survive_restart_with_the_same_key() {
        let start = t("2026-12-02T09:00:00Z");
        let mut procs = Fake(
            [(
                5762,
                ProcInfo {
                    user: Some("alice".into()),
                    start: Some(start),
                    pod_uid: Some("2b9a6c3a-8e5e-4c0b-9a55-d7c1f3e0e0a1".into()),
                    container_id: Some(
                        "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d".into(),
                    ),
                    ..Default::default()
                },
            )]
            .into(),
        );
        let p = ProcessReading {
            gpu_uuid: "GPU-a".into(),
            pid: 5762,
            name: Some("python".into()),
            process_type: Some("C".into()),
            used_memory_mib: Some(1005),
        };
        let xorg = ProcessReading {
            pid: 675,
            name: Some("/usr/lib/xorg/Xorg".into()),
            process_type: Some("G".into()),
            ..p.clone()
        };
        let with = Snapshot {
            gpus: vec![gpu("GPU-a", Some(50.0))],
            processes: vec![p.clone(), xorg],
            ..Default::default()
        };
        let mut r = Reporter::new(host(), 600, true);
        let b = r.build(&with, &mut procs, t("2026-12-02T10:00:00Z"));
        assert_eq!(
            b.allocations.len(),
            1,
            "graphics-only processes are not workloads"
        );
        let a = &b.allocations[0];
        assert_eq!(
            a.workload,
            "python pid=5762 pod=2b9a6c3a-8e5e-4c0b-9a55-d7c1f3e0e0a1 container=9ec39b91f3d7"
        );
        assert_eq!(
            (a.start, a.end, a.kind),
            (start, None, AllocationKind::Process)
        );
        assert_eq!(a.user.as_deref(), Some("alice"));
        let saved = r.take_open_if_changed().unwrap();
        assert!(r.take_open_if_changed().is_none());
        let b = r.build(&with, &mut procs, t("2026-12-02T10:01:00Z"));
        assert!(
            b.allocations.is_empty(),
            "a running process is reported once"
        );

        // The agent restarts while the process runs, then the process ends.
        let mut r2 = Reporter::new(host(), 600, true);
        r2.restore_open(saved);
        let b = r2.build(&with, &mut procs, t("2026-12-02T10:05:00Z"));
        assert!(b.allocations.is_empty());
        let without = Snapshot {
            gpus: vec![gpu("GPU-a", Some(0.0))],
            ..Default::default()
        };
        let b = r2.build(&without, &mut procs, t("2026-12-02T10:06:00Z"));
        assert_eq!(b.allocations.len(), 1);
        assert_eq!(b.allocations[0].start, start);
        assert_eq!(b.allocations[0].end, Some(t("2026-12-02T10:05:00Z")));
        assert_eq!(b.allocations[0].workload, a.workload);
    }

    #[test]
    fn failed_process_listing_closes_nothing_and_lost_gpus_are_resent_with_parents() {
        let mut r = Reporter::new(host(), 600, true);
        let p = ProcessReading {
            gpu_uuid: "MIG-x".into(),
            pid: 7,
            name: None,
            process_type: None,
            used_memory_mib: None,
        };
        let mut child = gpu("MIG-x", None);
        child.mig_parent_uuid = Some("GPU-a".into());
        let snap = Snapshot {
            gpus: vec![gpu("GPU-a", None), child],
            processes: vec![p],
            ..Default::default()
        };
        let b = r.build(&snap, &mut NoProcs, t("2026-12-02T10:00:00Z"));
        assert_eq!(b.allocations[0].workload, "pid=7");
        let failed = Snapshot {
            gpus: snap.gpus.clone(),
            processes: vec![],
            processes_failed: true,
        };
        let b = r.build(&failed, &mut NoProcs, t("2026-12-02T10:01:00Z"));
        assert!(b.allocations.is_empty());
        let inv = r.inventory_for(["MIG-x"]);
        let uuids: Vec<&str> = inv.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-a", "MIG-x"]);
    }
}
