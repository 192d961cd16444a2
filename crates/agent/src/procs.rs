//! Who a GPU process is: its user (from `/proc/<pid>/status` and `/etc/passwd`), its container
//! and Kubernetes pod UID (from `/proc/<pid>/cgroup`), and its start time (from
//! `/proc/<pid>/stat` and the boot time in `/proc/stat`).
//!
//! The start time is what makes an allocation's key stable: the server keys allocations by
//! (GPU, workload, start), so a process reported again, after a lost acknowledgement or an agent
//! restart, lands on the same record. Everything here only reads files; an unreadable file makes
//! that fact unknown, never an error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use chrono::{DateTime, Utc};

/// Clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`). Linux fixes it at 100 for user
/// space on every mainstream architecture (x86, arm64, ppc64le, s390x), whatever the kernel's
/// internal HZ.
pub const USER_HZ: u64 = 100;

/// What the agent learned about one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcInfo {
    pub uid: Option<u32>,
    /// The user name, or the numeric uid when `/etc/passwd` does not name it.
    pub user: Option<String>,
    pub start: Option<DateTime<Utc>>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// The short command name (`comm`), used when the GPU source gave no process name.
    pub comm: Option<String>,
}

/// Container and pod of a process, from its cgroup path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupInfo {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

/// The real uid from `/proc/<pid>/status` (`Uid:\treal\teffective\tsaved\tfs`).
pub fn parse_status_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|u| u.parse().ok())
}

/// `comm` and `starttime` (field 22, in clock ticks since boot) from `/proc/<pid>/stat`. The
/// command name sits in parentheses and may itself contain spaces and parentheses, so fields
/// are counted from the last `)`.
pub fn parse_stat(stat: &str) -> (Option<String>, Option<u64>) {
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return (None, None);
    };
    let comm = (close > open).then(|| stat[open + 1..close].to_string());
    // After ")" come field 3 (state) onwards; starttime is field 22, the 20th of those.
    let start = stat[close + 1..]
        .split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok());
    (comm, start)
}

/// Boot time (seconds since the epoch) from `/proc/stat`'s `btime` line.
pub fn parse_btime(proc_stat: &str) -> Option<i64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// uid → name from an `/etc/passwd` file.
pub fn parse_passwd(passwd: &str) -> HashMap<u32, String> {
    passwd
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let _password = f.next()?;
            let uid = f.next()?.parse().ok()?;
            (!name.is_empty()).then(|| (uid, name.to_string()))
        })
        .collect()
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The container ID in one cgroup path segment: `docker-<id>.scope`, `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `libpod-<id>.scope`, or a bare 64-hex-digit ID (cgroupfs driver).
fn container_in(segment: &str) -> Option<&str> {
    let s = segment.strip_suffix(".scope").unwrap_or(segment);
    let id = s.rsplit('-').next().unwrap_or(s);
    // `crio-conmon-<id>` is the runtime's monitor process, not the container.
    if s.contains("conmon") {
        return None;
    }
    is_container_id(id).then_some(id)
}

/// The pod UID in one cgroup path segment: `pod<uid>` (cgroupfs driver) or
/// `kubepods[-<qos>]-pod<uid with _ for ->.slice` (systemd driver).
fn pod_in(segment: &str) -> Option<String> {
    let s = segment.strip_suffix(".slice").unwrap_or(segment);
    let at = s.rfind("pod")?;
    if at > 0 && !s[..at].ends_with('-') {
        return None;
    }
    let uid = s[at + 3..].replace('_', "-");
    let ok = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        });
    ok.then_some(uid)
}

/// Container ID and pod UID from `/proc/<pid>/cgroup` (cgroup v1 or v2). A process outside any
/// container gives neither.
pub fn parse_cgroup(text: &str) -> CgroupInfo {
    let mut info = CgroupInfo::default();
    // Every line names the same container in practice; the unified (v2) line `0::` comes last
    // on hybrid hosts, so look at all lines and keep the first find of each.
    for line in text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for seg in path.split('/') {
            if info.pod_uid.is_none() {
                info.pod_uid = pod_in(seg);
            }
            if info.container_id.is_none() {
                info.container_id = container_in(seg).map(str::to_string);
            }
        }
        if info.container_id.is_some() && info.pod_uid.is_some() {
            break;
        }
    }
    info
}

/// Reads process facts under a proc root, caching what rarely changes.
#[derive(Debug)]
pub struct ProcReader {
    proc_root: PathBuf,
    passwd_file: PathBuf,
    btime: Option<i64>,
    users: HashMap<u32, String>,
    passwd_mtime: Option<SystemTime>,
}

impl ProcReader {
    pub fn new(proc_root: impl Into<PathBuf>, passwd_file: impl Into<PathBuf>) -> ProcReader {
        let proc_root = proc_root.into();
        let btime = std::fs::read_to_string(proc_root.join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_btime);
        ProcReader {
            proc_root,
            passwd_file: passwd_file.into(),
            btime,
            users: HashMap::new(),
            passwd_mtime: None,
        }
    }

    fn refresh_users(&mut self) {
        let mtime = std::fs::metadata(&self.passwd_file)
            .and_then(|m| m.modified())
            .ok();
        if mtime.is_some() && mtime == self.passwd_mtime {
            return;
        }
        self.passwd_mtime = mtime;
        self.users = std::fs::read_to_string(&self.passwd_file)
            .map(|t| parse_passwd(&t))
            .unwrap_or_default();
    }

    fn read(&self, pid: u32, file: &str) -> Option<String> {
        std::fs::read_to_string(self.proc_root.join(pid.to_string()).join(file)).ok()
    }

    /// Everything readable about `pid`; unknown parts stay `None`.
    pub fn inspect(&mut self, pid: u32) -> ProcInfo {
        self.refresh_users();
        let uid = self
            .read(pid, "status")
            .as_deref()
            .and_then(parse_status_uid);
        let (comm, ticks) = self
            .read(pid, "stat")
            .as_deref()
            .map(parse_stat)
            .unwrap_or_default();
        let start = match (self.btime, ticks) {
            (Some(boot), Some(t)) => {
                DateTime::from_timestamp(boot.saturating_add((t / USER_HZ) as i64), 0)
            }
            _ => None,
        };
        let cg = self
            .read(pid, "cgroup")
            .as_deref()
            .map(parse_cgroup)
            .unwrap_or_default();
        ProcInfo {
            uid,
            user: uid.map(|u| self.users.get(&u).cloned().unwrap_or_else(|| u.to_string())),
            start,
            container_id: cg.container_id,
            pod_uid: cg.pod_uid,
            comm,
        }
    }

    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d";

    #[test]
    fn cgroup_v2_systemd_kubernetes() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod2b9a6c3a_8e5e_4c0b_9a55_d7c1f3e0e0a1.slice/cri-containerd-{CID}.scope\n"
        );
        assert_eq!(
            parse_cgroup(&text),
            CgroupInfo {
                container_id: Some(CID.into()),
                pod_uid: Some("2b9a6c3a-8e5e-4c0b-9a55-d7c1f3e0e0a1".into())
            }
        );
        // Guaranteed QoS has no class in the slice name.
        let text = format!(
            "0::/kubepods.slice/kubepods-pod2b9a6c3a_8e5e_4c0b_9a55_d7c1f3e0e0a1.slice/crio-{CID}.scope\n"
        );
        assert_eq!(
            parse_cgroup(&text).pod_uid.as_deref(),
            Some("2b9a6c3a-8e5e-4c0b-9a55-d7c1f3e0e0a1")
        );
    }

    #[test]
    fn cgroup_v1_cgroupfs_kubernetes_docker_and_host() {
        let text = format!(
            "11:devices:/kubepods/besteffort/pod74c13223-5a00-11e9-b385-42010a80018d/{CID}\n\
             10:perf_event:/kubepods/besteffort/pod74c13223-5a00-11e9-b385-42010a80018d/{CID}\n"
        );
        let info = parse_cgroup(&text);
        assert_eq!(info.container_id.as_deref(), Some(CID));
        assert_eq!(
            info.pod_uid.as_deref(),
            Some("74c13223-5a00-11e9-b385-42010a80018d")
        );
        let docker = format!("4:memory:/system.slice/docker-{CID}.scope\n");
        assert_eq!(
            parse_cgroup(&docker),
            CgroupInfo {
                container_id: Some(CID.into()),
                pod_uid: None
            }
        );
        let host = "0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(parse_cgroup(host), CgroupInfo::default());
        assert_eq!(
            parse_cgroup("garbage\n::\n0::/podx\n"),
            CgroupInfo::default()
        );
    }

    #[test]
    fn stat_status_passwd_btime() {
        let stat = "5762 (python3 (x) y) S 1 5762 5762 0 -1 4194560 1 0 0 0 10 2 0 0 20 0 4 0 123456 1000 100";
        let (comm, start) = parse_stat(stat);
        assert_eq!(comm.as_deref(), Some("python3 (x) y"));
        assert_eq!(start, Some(123456));
        assert_eq!(parse_stat("garbage"), (None, None));
        assert_eq!(
            parse_status_uid("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n"),
            Some(1000)
        );
        assert_eq!(parse_status_uid("Name: x\n"), None);
        let users = parse_passwd(
            "root:x:0:0:root:/root:/bin/bash\n# c\nalice:x:1000:1000::/home/alice:/bin/sh\nbad\n",
        );
        assert_eq!(users.get(&1000).map(String::as_str), Some("alice"));
        assert_eq!(users.len(), 2);
        assert_eq!(
            parse_btime("cpu 1 2 3\nbtime 1764662400\n"),
            Some(1764662400)
        );
    }

    #[test]
    fn inspect_reads_a_fake_proc_tree() {
        let dir = std::env::temp_dir().join(format!("gpuledger-procs-{}", std::process::id()));
        let pid_dir = dir.join("proc/4242");
        std::fs::create_dir_all(&pid_dir).unwrap();
        std::fs::write(dir.join("proc/stat"), "cpu 0\nbtime 1764662400\n").unwrap();
        std::fs::write(pid_dir.join("status"), "Uid:\t1000\t1000\t1000\t1000\n").unwrap();
        std::fs::write(
            pid_dir.join("stat"),
            "4242 (train) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 360000 0 0",
        )
        .unwrap();
        std::fs::write(
            pid_dir.join("cgroup"),
            format!("0::/system.slice/docker-{CID}.scope\n"),
        )
        .unwrap();
        std::fs::write(dir.join("passwd"), "alice:x:1000:1000::/:/bin/sh\n").unwrap();
        let mut r = ProcReader::new(dir.join("proc"), dir.join("passwd"));
        let info = r.inspect(4242);
        assert_eq!(info.user.as_deref(), Some("alice"));
        assert_eq!(info.comm.as_deref(), Some("train"));
        assert_eq!(info.container_id.as_deref(), Some(CID));
        assert_eq!(info.start, DateTime::from_timestamp(1764662400 + 3600, 0));
        // A process that is gone is all unknown, not an error.
        assert_eq!(r.inspect(1), ProcInfo::default());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
