//! The `slurm` collector: GPU nodes (GRES counts and types, MIG profiles, node state) and the
//! jobs that held GPUs ("who used which GPU when"), read from a Slurm cluster's own commands —
//! run on this machine or over SSH — or from slurmrestd's JSON API, with a read-only user.
//!
//! Each run reads `scontrol show node --oneliner` (inventory), `scontrol show job -d
//! --oneliner` (the GPU indexes of running jobs) and `sacct` over a window that starts where
//! the previous run stopped (less an overlap for accounting records that arrive late), or the
//! same from slurmrestd (`/slurm/<version>/nodes`, `/slurm/<version>/jobs`,
//! `/slurmdb/<version>/jobs`, API versions v0.0.38 to v0.0.42). The
//! cursor and the jobs already reported are kept in a state file, so a restart neither reads a
//! finished job twice nor misses one; after downtime the window catches up in steps of at most
//! `max_window_hours`. Output formats are pinned (`--format=`, `--parsable2`, `LC_ALL=C`,
//! `TZ=UTC`, `SLURM_TIME_FORMAT=%s`) so a locale or a site's default format cannot change what
//! is read. Parsing lives in [`parse`].
//!
//! ```toml
//! [[collectors]]
//! type = "slurm"
//! name = "hpc"
//! # cluster = "hpc"                        # the cluster name GPUs carry; defaults to the name
//! # state_file = "/var/lib/gpuledger/slurm-hpc.json"  # default: $STATE_DIRECTORY or
//! #                                        # /var/lib/gpuledger, file slurm-<name>.json
//! # ssh_host = "login1.hpc.example.org"    # run the commands there (BatchMode, never prompts)
//! # ssh_user = "gpuledger"
//! # ssh_key = "/etc/gpuledger/slurm_ed25519"
//! # ssh_port = 22
//! # ssh_known_hosts = "/etc/gpuledger/slurm_known_hosts"  # pin the login node's host key
//! # bin_dir = "/opt/slurm/bin"             # where scontrol and sacct are; default: $PATH
//! # restd_url = "http://slurmctl:6820"     # instead of commands: slurmrestd
//! # restd_user = "gpuledger"
//! # restd_token_file = "/etc/gpuledger/slurm.jwt"
//! # restd_api_version = "auto"             # or v0.0.38 … v0.0.42; auto: the newest served
//! # timeout_secs = 60                      # per command
//! # lookback_hours = 24                    # how far the first run reads back
//! # overlap_secs = 600                     # re-read for late accounting records
//! # max_window_hours = 24                  # the most one run reads
//! ```

pub mod parse;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use gpuledger_model::{
    mig_placeholder_uuid, placeholder_uuid, AllocationKind, HostGpus, Observation, Provenance,
    PushAllocation, WorkloadContext,
};
use serde::{Deserialize, Serialize};

use crate::{
    in_range, now_secs, CollectError, CollectFuture, CollectReport, Collector, PartProblem,
    ReportFuture,
};
use parse::{JobIndexes, Nodes, Sacct, SacctJob, SlurmNode};

/// The kind string: config `type`, module name, test module.
pub const KIND: &str = "slurm";

/// The most output one command may give.
const MAX_OUTPUT_BYTES: u64 = 256 * 1024 * 1024;
/// The column delimiter asked of `sacct`: a control character no job name or account holds.
pub const SACCT_DELIMITER: &str = "\u{1f}";
/// The environment every command runs with: a fixed locale, UTC, and times in epoch seconds.
pub const COMMAND_ENV: &[(&str, &str)] =
    &[("LC_ALL", "C"), ("TZ", "UTC"), ("SLURM_TIME_FORMAT", "%s")];
/// The version of the state file's layout.
const STATE_VERSION: u32 = 1;

/// The entry's own settings as written (the fields every entry shares are read by
/// [`crate::Entry`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    cluster: Option<String>,
    state_file: Option<PathBuf>,
    ssh_host: Option<String>,
    ssh_user: Option<String>,
    ssh_key: Option<PathBuf>,
    ssh_port: Option<u64>,
    ssh_known_hosts: Option<PathBuf>,
    bin_dir: Option<String>,
    restd_url: Option<String>,
    restd_user: Option<String>,
    restd_token_file: Option<PathBuf>,
    restd_api_version: Option<String>,
    timeout_secs: Option<u64>,
    lookback_hours: Option<u64>,
    overlap_secs: Option<u64>,
    max_window_hours: Option<u64>,
}

/// Where the commands run.
#[derive(Debug, Clone, PartialEq)]
pub enum Access {
    /// On this machine (a login or admin node with Slurm's client commands).
    Local,
    /// On `host` over `ssh -o BatchMode=yes`: a key or an agent, never a password prompt.
    Ssh {
        host: String,
        user: Option<String>,
        key: Option<PathBuf>,
        port: Option<u16>,
        /// A known_hosts file of its own (`UserKnownHostsFile`); `None`: ssh's default.
        known_hosts: Option<PathBuf>,
    },
    /// slurmrestd's JSON API at `url`, with a JWT read from `token_file` on every request (so
    /// a rotated token needs no restart) and sent as `X-SLURM-USER-TOKEN`.
    Restd {
        url: String,
        user: Option<String>,
        token_file: PathBuf,
        /// The API version asked for (one of [`parse::RESTD_APIS`]); `None` (`auto`): the
        /// newest slurmrestd answers, found on the first request.
        api_version: Option<&'static str>,
    },
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmConfig {
    /// The cluster name GPUs carry; `None`: the entry's name.
    pub cluster: Option<String>,
    pub access: Access,
    /// Where the cursor is kept; `None`: `$STATE_DIRECTORY` or `/var/lib/gpuledger`, file
    /// `slurm-<name>.json`.
    pub state_file: Option<PathBuf>,
    /// The folder holding `scontrol` and `sacct`; `None`: found on `$PATH`.
    pub bin_dir: Option<String>,
    pub timeout_secs: u64,
    pub lookback_hours: u64,
    pub overlap_secs: u64,
    pub max_window_hours: u64,
}

fn non_empty(key: &str, v: Option<String>) -> Result<Option<String>, CollectError> {
    match v.map(|s| s.trim().to_string()) {
        Some(s) if s.is_empty() => Err(CollectError::Config(format!("{key}: must not be empty"))),
        v => Ok(v),
    }
}

impl SlurmConfig {
    /// Read and check a `[[collectors]]` entry's TOML text.
    pub fn from_toml(text: &str) -> Result<SlurmConfig, CollectError> {
        SlurmConfig::from_settings(&crate::own_settings(text)?)
    }

    /// Read and check an entry's own settings (the entry without [`crate::COMMON_KEYS`]).
    pub fn from_settings(own: &toml_edit::Table) -> Result<SlurmConfig, CollectError> {
        let raw: FileConfig = crate::read_settings(own)?;
        let host = non_empty("ssh_host", raw.ssh_host)?;
        let restd_url = non_empty("restd_url", raw.restd_url)?;
        if restd_url.is_some() && host.is_some() {
            return Err(CollectError::Config(
                "set either `ssh_host` (run the commands on a login node) or `restd_url` (ask \
                 slurmrestd), not both"
                    .into(),
            ));
        }
        if restd_url.is_none()
            && (raw.restd_user.is_some()
                || raw.restd_token_file.is_some()
                || raw.restd_api_version.is_some())
        {
            return Err(CollectError::Config(
                "restd_user, restd_token_file and restd_api_version need `restd_url = \
                 \"http://HOST:6820\"`"
                    .into(),
            ));
        }
        if let Some(url) = restd_url {
            if raw.ssh_user.is_some()
                || raw.ssh_key.is_some()
                || raw.ssh_port.is_some()
                || raw.ssh_known_hosts.is_some()
                || raw.bin_dir.is_some()
            {
                return Err(CollectError::Config(
                    "ssh_user, ssh_key, ssh_port, ssh_known_hosts and bin_dir are for commands; \
                     with `restd_url` leave them out"
                        .into(),
                ));
            }
            let url = restd_url_checked(&url)?;
            let token_file = raw.restd_token_file.ok_or_else(|| {
                CollectError::Config(
                    "restd_url needs `restd_token_file`: a file holding a JWT for a read-only \
                     user (`scontrol token username=gpuledger lifespan=...`)"
                        .into(),
                )
            })?;
            return Ok(SlurmConfig {
                cluster: non_empty("cluster", raw.cluster)?,
                access: Access::Restd {
                    url,
                    user: non_empty("restd_user", raw.restd_user)?,
                    token_file,
                    api_version: restd_api_version(raw.restd_api_version)?,
                },
                state_file: raw.state_file,
                bin_dir: None,
                timeout_secs: in_range("timeout_secs", raw.timeout_secs, 60, 1, 600)?,
                lookback_hours: in_range("lookback_hours", raw.lookback_hours, 24, 1, 24 * 90)?,
                overlap_secs: in_range("overlap_secs", raw.overlap_secs, 600, 0, 86_400)?,
                max_window_hours: in_range(
                    "max_window_hours",
                    raw.max_window_hours,
                    24,
                    1,
                    24 * 31,
                )?,
            });
        }
        let access = match host {
            Some(host) => {
                // A host that could be read as an option would change what ssh does.
                if host.starts_with('-') || host.contains(char::is_whitespace) {
                    return Err(CollectError::Config(format!(
                        "ssh_host: `{host}` is not a host name"
                    )));
                }
                let user = non_empty("ssh_user", raw.ssh_user)?;
                if user
                    .as_deref()
                    .is_some_and(|u| u.starts_with('-') || u.contains(char::is_whitespace))
                {
                    return Err(CollectError::Config("ssh_user: not a user name".into()));
                }
                let port = match raw.ssh_port {
                    None => None,
                    Some(p) => Some(in_range("ssh_port", Some(p), 22, 1, 65535)? as u16),
                };
                Access::Ssh {
                    host,
                    user,
                    key: raw.ssh_key,
                    port,
                    known_hosts: raw.ssh_known_hosts,
                }
            }
            None => {
                let set: Vec<&str> = [
                    ("ssh_user", raw.ssh_user.is_some()),
                    ("ssh_key", raw.ssh_key.is_some()),
                    ("ssh_port", raw.ssh_port.is_some()),
                    ("ssh_known_hosts", raw.ssh_known_hosts.is_some()),
                ]
                .into_iter()
                .filter(|(_, s)| *s)
                .map(|(k, _)| k)
                .collect();
                if !set.is_empty() {
                    return Err(CollectError::Config(format!(
                        "{} set without `ssh_host`; set `ssh_host = \"login-node\"` to run the \
                         commands over SSH, or remove them to run them here",
                        set.join(", ")
                    )));
                }
                Access::Local
            }
        };
        let bin_dir = non_empty("bin_dir", raw.bin_dir)?;
        if bin_dir.as_deref().is_some_and(|d| d.contains(['\'', '\n'])) {
            return Err(CollectError::Config(
                "bin_dir: must not hold quotes or newlines".into(),
            ));
        }
        if let Some(f) = &raw.state_file {
            if f.as_os_str().is_empty() {
                return Err(CollectError::Config("state_file: must not be empty".into()));
            }
        }
        Ok(SlurmConfig {
            cluster: non_empty("cluster", raw.cluster)?,
            access,
            state_file: raw.state_file,
            bin_dir,
            timeout_secs: in_range("timeout_secs", raw.timeout_secs, 60, 1, 600)?,
            lookback_hours: in_range("lookback_hours", raw.lookback_hours, 24, 1, 24 * 90)?,
            overlap_secs: in_range("overlap_secs", raw.overlap_secs, 600, 0, 86_400)?,
            max_window_hours: in_range("max_window_hours", raw.max_window_hours, 24, 1, 24 * 31)?,
        })
    }

    /// The hosts this collector connects to, for the server's `collector_hosts` allow-list.
    pub fn hosts(&self) -> Result<Vec<String>, CollectError> {
        Ok(match &self.access {
            Access::Local => Vec::new(),
            Access::Ssh { host, .. } => vec![host.clone()],
            Access::Restd { url, .. } => reqwest::Url::parse(url)
                .ok()
                .and_then(|u| u.host_str().map(String::from))
                .into_iter()
                .collect(),
        })
    }
}

/// `restd_api_version`: `None` for `auto` (the default), else one of [`parse::RESTD_APIS`]
/// (`v0.0.40` or `0.0.40`).
fn restd_api_version(v: Option<String>) -> Result<Option<&'static str>, CollectError> {
    let Some(v) = v.map(|v| v.trim().to_ascii_lowercase()) else {
        return Ok(None);
    };
    if v == "auto" {
        return Ok(None);
    }
    let bare = v.strip_prefix('v').unwrap_or(&v);
    match parse::RESTD_APIS.iter().find(|a| a[1..] == *bare) {
        Some(a) => Ok(Some(*a)),
        None => Err(CollectError::Config(format!(
            "restd_api_version: `{v}` is not a slurmrestd API version gpuledger reads; use \
             \"auto\" (the default: the newest slurmrestd serves) or one of {}",
            parse::RESTD_APIS.join(", ")
        ))),
    }
}

/// Whether slurmrestd answered 404, which for a whole API version means it does not serve
/// that version (the error text is [`crate::http::get_bytes`]'s).
fn is_not_found(e: &CollectError) -> bool {
    matches!(e, CollectError::Config(m) if m.contains(": answered HTTP 404"))
}

fn restd_url_checked(s: &str) -> Result<String, CollectError> {
    match reqwest::Url::parse(s) {
        Ok(u) if crate::http::is_link_local(&u) => Err(CollectError::Config(format!(
            "restd_url: `{s}` is a link-local address, where clouds serve instance metadata and \
             credentials; a collector never reads it"
        ))),
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            let base = s.trim_end_matches('/');
            if base.contains("/slurm/") || base.contains("/slurmdb/") {
                return Err(CollectError::Config(format!(
                    "restd_url: give slurmrestd's address without an API path (`{}`)",
                    base.split("/slurm").next().unwrap_or(base)
                )));
            }
            Ok(base.to_string())
        }
        _ => Err(CollectError::Config(format!(
            "restd_url: `{s}` is not an http:// or https:// URL; write it like http://HOST:6820"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// The persisted cursor

/// What the state file keeps between runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CursorState {
    version: u32,
    /// `sacct` was read up to here (seconds since 1970).
    cursor: Option<i64>,
    /// Jobs reported and still open, or ended after `cursor - overlap`: by job ID.
    jobs: BTreeMap<String, Reported>,
}

/// A job as it was last reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reported {
    start: i64,
    end: Option<i64>,
    /// The GPU (placeholder) UUIDs it was given, so that its end lands on the same rows.
    gpus: Vec<String>,
    /// When `sacct` last listed it (seconds): an open job it has not listed for
    /// [`FORGET_OPEN_SECS`] (its record purged) is forgotten.
    #[serde(default)]
    seen: Option<i64>,
}

/// How long the state keeps a running job that accounting no longer lists.
const FORGET_OPEN_SECS: i64 = 7 * 86_400;

fn load_state(path: &Path) -> Result<CursorState, CollectError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let s: CursorState = serde_json::from_slice(&bytes).map_err(|e| {
                CollectError::Config(format!(
                    "state file {}: {e}; it is not a slurm collector's cursor. Move it away to \
                     start over from lookback_hours",
                    path.display()
                ))
            })?;
            if s.version != STATE_VERSION {
                return Err(CollectError::Config(format!(
                    "state file {}: layout version {}, this build reads {STATE_VERSION}",
                    path.display(),
                    s.version
                )));
            }
            Ok(s)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CursorState {
            version: STATE_VERSION,
            ..CursorState::default()
        }),
        Err(e) => Err(CollectError::Config(format!(
            "state file {}: cannot read it: {e}",
            path.display()
        ))),
    }
}

/// Write the state beside itself and rename it into place, so a crash leaves the old or the
/// new cursor, never half of one.
fn save_state(path: &Path, state: &CursorState) -> Result<(), CollectError> {
    let fail = |e: std::io::Error| {
        CollectError::Config(format!(
            "state file {}: cannot write it: {e}; the next run reads the same window again",
            path.display()
        ))
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| CollectError::Data(e.to_string()))?;
    std::fs::write(&tmp, bytes).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

// ---------------------------------------------------------------------------------------------
// Running commands

/// Quote `s` for a POSIX shell (the remote side of `ssh`).
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,%@+".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Run a program and give its standard output; stdin is closed, so nothing can prompt.
fn run_blocking(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<Vec<u8>, CollectError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            CollectError::Config(format!(
                "`{program}` is not installed here (or not on $PATH); install Slurm's client \
                 commands, set `bin_dir`, or set `ssh_host` to run them on a login node"
            ))
        } else {
            CollectError::Transient(format!("cannot start `{program}`: {e}"))
        }
    })?;
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(MAX_OUTPUT_BYTES + 1).read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CollectError::Transient(format!(
                    "`{program}` did not finish within {} s (timeout_secs)",
                    timeout.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                return Err(CollectError::Transient(format!(
                    "waiting for `{program}`: {e}"
                )))
            }
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if stdout.len() as u64 > MAX_OUTPUT_BYTES {
        return Err(CollectError::Data(format!(
            "`{program}` wrote more than {MAX_OUTPUT_BYTES} bytes; lower max_window_hours"
        )));
    }
    if status.success() {
        return Ok(stdout);
    }
    let text = String::from_utf8_lossy(&stderr);
    let text = text.trim();
    let tail: String = text
        .chars()
        .rev()
        .take(400)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let msg = format!("`{program}` failed ({status}): {tail}");
    let lower = text.to_ascii_lowercase();
    // Refusals need a person (a key, a grant); everything else may pass by the next run.
    if lower.contains("permission denied")
        || lower.contains("access denied")
        || lower.contains("host key verification failed")
        || lower.contains("invalid user")
        || lower.contains("command not found")
    {
        Err(CollectError::Config(msg))
    } else {
        Err(CollectError::Transient(msg))
    }
}

/// The collector's runtime pieces: the configuration plus where the state lives.
pub struct SlurmCollector {
    name: String,
    config: SlurmConfig,
    cluster: String,
    state_file: PathBuf,
    /// One run at a time touches the state file.
    run_lock: tokio::sync::Mutex<()>,
    /// The last inventory, for jobs when `scontrol show node` fails once.
    last_nodes: Mutex<Option<BTreeMap<String, SlurmNode>>>,
    /// The HTTP client for slurmrestd.
    client: Option<reqwest::Client>,
    /// The slurmrestd API version found with `restd_api_version = "auto"`.
    restd_api: Mutex<Option<&'static str>>,
}

impl SlurmCollector {
    pub fn new(name: &str, config: SlurmConfig) -> Result<SlurmCollector, CollectError> {
        let state_file = match &config.state_file {
            Some(f) => f.clone(),
            None => {
                let dir = std::env::var_os("STATE_DIRECTORY")
                    .and_then(|d| {
                        d.to_string_lossy()
                            .split(':')
                            .next()
                            .filter(|d| !d.is_empty())
                            .map(PathBuf::from)
                    })
                    .unwrap_or_else(|| PathBuf::from("/var/lib/gpuledger"));
                let safe: String = name
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                dir.join(format!("slurm-{safe}.json"))
            }
        };
        let client = match &config.access {
            Access::Restd { .. } => Some(
                reqwest::Client::builder()
                    .timeout(Duration::from_secs(config.timeout_secs))
                    .connect_timeout(Duration::from_secs(config.timeout_secs.min(5)))
                    .user_agent(concat!("gpuledger-slurm/", env!("CARGO_PKG_VERSION")))
                    .redirect(crate::http::same_origin_redirects())
                    .build()
                    .map_err(|e| {
                        CollectError::Config(format!("cannot set up the HTTP client: {e}"))
                    })?,
            ),
            _ => None,
        };
        Ok(SlurmCollector {
            client,
            name: name.to_string(),
            cluster: config.cluster.clone().unwrap_or_else(|| name.to_string()),
            config,
            state_file,
            run_lock: tokio::sync::Mutex::new(()),
            last_nodes: Mutex::new(None),
            restd_api: Mutex::new(None),
        })
    }

    /// The state file this collector keeps its cursor in.
    pub fn state_file(&self) -> &Path {
        &self.state_file
    }

    /// The program and arguments that run `tool` with `args`, here or over SSH.
    fn command(
        &self,
        tool: &str,
        args: &[String],
    ) -> (String, Vec<String>, Vec<(&'static str, &'static str)>) {
        let tool = match &self.config.bin_dir {
            Some(d) => format!("{}/{tool}", d.trim_end_matches('/')),
            None => tool.to_string(),
        };
        match &self.config.access {
            Access::Local => (tool, args.to_vec(), COMMAND_ENV.to_vec()),
            Access::Ssh {
                host,
                user,
                key,
                port,
                known_hosts,
            } => {
                // Never a prompt: no password, no question about an unknown host key.
                let mut a: Vec<String> = [
                    "-T",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "StrictHostKeyChecking=yes",
                    "-o",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                a.push(format!(
                    "ConnectTimeout={}",
                    self.config.timeout_secs.min(60)
                ));
                if let Some(p) = port {
                    a.extend(["-p".into(), p.to_string()]);
                }
                if let Some(k) = known_hosts {
                    a.extend(["-o".into(), format!("UserKnownHostsFile={}", k.display())]);
                }
                if let Some(k) = key {
                    a.extend([
                        "-i".into(),
                        k.display().to_string(),
                        "-o".into(),
                        "IdentitiesOnly=yes".into(),
                    ]);
                }
                if let Some(u) = user {
                    a.extend(["-l".into(), u.clone()]);
                }
                a.push(host.clone());
                a.push("--".into());
                // The remote shell sees one line: the environment, then the quoted command.
                let mut remote: Vec<String> = vec!["env".into()];
                remote.extend(
                    COMMAND_ENV
                        .iter()
                        .map(|(k, v)| shell_quote(&format!("{k}={v}"))),
                );
                remote.push(shell_quote(&tool));
                remote.extend(args.iter().map(|x| shell_quote(x)));
                a.push(remote.join(" "));
                ("ssh".into(), a, vec![("LC_ALL", "C")])
            }
            // Never reached: with slurmrestd no command runs.
            Access::Restd { .. } => (tool, args.to_vec(), COMMAND_ENV.to_vec()),
        }
    }

    /// GET `path` from slurmrestd with the token, as bytes.
    async fn restd_get(&self, path: &str) -> Result<Vec<u8>, CollectError> {
        let (
            Access::Restd {
                url,
                user,
                token_file,
                ..
            },
            Some(client),
        ) = (&self.config.access, &self.client)
        else {
            return Err(CollectError::Config("not a slurmrestd source".into()));
        };
        let token = std::fs::read_to_string(token_file).map_err(|e| {
            CollectError::Config(format!(
                "restd_token_file {}: cannot read it: {e}",
                token_file.display()
            ))
        })?;
        let token = token.trim();
        let token = token.strip_prefix("SLURM_JWT=").unwrap_or(token);
        let full = format!("{url}{path}");
        let mut req = client.get(&full).header("X-SLURM-USER-TOKEN", token);
        if let Some(u) = user {
            req = req.header("X-SLURM-USER-NAME", u);
        }
        crate::http::get_bytes(req, &format!("GET {full}"), MAX_OUTPUT_BYTES as usize).await
    }

    /// GET `path(version)` from slurmrestd: in `restd_api_version`, or (`auto`) in the version
    /// found before, else in the newest of [`parse::RESTD_APIS`] it answers — a version it does
    /// not serve answers 404. Returns the path asked and the answer.
    async fn restd_get_api(
        &self,
        path: impl Fn(&str) -> String,
    ) -> Result<(String, Vec<u8>), CollectError> {
        let Access::Restd { api_version, .. } = &self.config.access else {
            return Err(CollectError::Config("not a slurmrestd source".into()));
        };
        if let Some(v) = api_version {
            let p = path(v);
            return match self.restd_get(&p).await {
                Ok(bytes) => Ok((p, bytes)),
                Err(e) if is_not_found(&e) => Err(CollectError::Config(format!(
                    "GET {p}: slurmrestd answered 404: it does not serve API {v} (or this path in \
                     it). Set `restd_api_version` to a version it serves (gpuledger reads {}; \
                     `GET /openapi/v3` lists what slurmrestd serves), or to \"auto\" to find one",
                    parse::RESTD_APIS.join(", ")
                ))),
                Err(e) => Err(e),
            };
        }
        let found = *self.restd_api.lock().unwrap_or_else(|e| e.into_inner());
        let order = found.into_iter().chain(
            parse::RESTD_APIS
                .iter()
                .copied()
                .filter(|v| Some(*v) != found),
        );
        for v in order {
            let p = path(v);
            match self.restd_get(&p).await {
                Ok(bytes) => {
                    *self.restd_api.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
                    return Ok((p, bytes));
                }
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        *self.restd_api.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Err(CollectError::Config(format!(
            "GET {}: slurmrestd answered 404 in every API version gpuledger reads ({}): check \
             `restd_url`, and that slurmrestd loads the plugin for this path (openapi/slurmctld \
             for /slurm/, openapi/slurmdbd for /slurmdb/); Slurm before 22.05 serves none of \
             them",
            path("<version>"),
            parse::RESTD_APIS.join(", ")
        )))
    }

    /// The nodes, from `scontrol show node` or slurmrestd.
    async fn inventory(&self) -> Result<(String, Nodes), CollectError> {
        if let Access::Restd { .. } = self.config.access {
            let (path, bytes) = self.restd_get_api(|v| format!("/slurm/{v}/nodes")).await?;
            return parse::parse_restd_nodes(&bytes)
                .map(|n| (format!("GET {path}"), n))
                .map_err(|e| CollectError::Data(format!("GET {path}: {e}")));
        }
        let text = self
            .run_tool(
                "scontrol",
                vec![
                    "--oneliner".into(),
                    "--all".into(),
                    "show".into(),
                    "node".into(),
                ],
            )
            .await?;
        Ok((
            "scontrol show node".into(),
            parse::parse_scontrol_nodes(&text),
        ))
    }

    /// Running jobs' exact GPUs, from `scontrol show job -d` or slurmrestd.
    async fn running(
        &self,
    ) -> (
        String,
        Result<(Vec<JobIndexes>, Vec<parse::Problem>), CollectError>,
    ) {
        if let Access::Restd { .. } = self.config.access {
            return match self.restd_get_api(|v| format!("/slurm/{v}/jobs")).await {
                Ok((path, bytes)) => {
                    let got = parse::parse_restd_running(&bytes)
                        .map_err(|e| CollectError::Data(format!("GET {path}: {e}")));
                    (format!("GET {path}"), got)
                }
                Err(e) => ("GET /slurm/<version>/jobs".into(), Err(e)),
            };
        }
        let got = self
            .run_tool(
                "scontrol",
                vec![
                    "--oneliner".into(),
                    "--details".into(),
                    "show".into(),
                    "job".into(),
                ],
            )
            .await
            .map(|t| parse::parse_scontrol_jobs(&t));
        ("scontrol show job".into(), got)
    }

    /// Accounting from `from` to `to` (seconds), from `sacct` or slurmrestd; `now` is this
    /// run's time, which slurmrestd's relative times count back from.
    async fn accounting(&self, from: i64, to: i64, now: i64) -> Result<Sacct, CollectError> {
        if let Access::Restd { .. } = self.config.access {
            // slurmrestd reads absolute times in its own time zone; `now-N` is the same
            // instant anywhere.
            let ago = |t: i64| {
                let secs = (now - t).max(0);
                if secs == 0 {
                    "now".to_string()
                } else {
                    format!("now-{secs}seconds")
                }
            };
            let (from, to) = (ago(from), ago(to));
            let (path, bytes) = self
                .restd_get_api(|v| format!("/slurmdb/{v}/jobs?start_time={from}&end_time={to}"))
                .await?;
            return parse::parse_restd_accounting(&bytes)
                .map_err(|e| CollectError::Data(format!("GET {path}: {e}")));
        }
        let text = self.run_tool("sacct", sacct_args(from, to)).await?;
        Ok(parse::parse_sacct(
            &text,
            parse::SACCT_FIELDS,
            SACCT_DELIMITER,
        ))
    }

    async fn run_tool(&self, tool: &str, args: Vec<String>) -> Result<String, CollectError> {
        let (program, args, env) = self.command(tool, &args);
        let timeout = Duration::from_secs(self.config.timeout_secs);
        let bytes =
            tokio::task::spawn_blocking(move || run_blocking(&program, &args, &env, timeout))
                .await
                .map_err(|e| CollectError::Transient(format!("running {tool}: {e}")))??;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn provenance(&self, raw_key: String, now: DateTime<Utc>) -> Provenance {
        Provenance {
            source: self.name.clone(),
            observed_at: now,
            raw_key: Some(raw_key),
        }
    }

    /// The inventory's observations: placeholder GPUs per node with its state and partitions.
    pub fn node_observations(&self, nodes: &Nodes, now: DateTime<Utc>) -> Vec<Observation> {
        nodes
            .gpu_nodes()
            .filter(|n| n.physical_gpus() > 0)
            .map(|n| {
                let mut labels = BTreeMap::new();
                if !n.partitions.is_empty() {
                    labels.insert("slurm.partitions".to_string(), n.partitions.join(","));
                }
                if let Some(s) = &n.state {
                    labels.insert("slurm.state".to_string(), s.text.clone());
                    if let Some(a) = s.available {
                        labels.insert("slurm.available".to_string(), a.to_string());
                    }
                }
                let by_type: Vec<String> = n
                    .gpus_by_type()
                    .iter()
                    .map(|(t, c)| format!("{t}:{c}"))
                    .collect();
                labels.insert("slurm.gres".to_string(), by_type.join(","));
                Observation::HostGpuCount {
                    gpus: HostGpus {
                        host: n.name.clone(),
                        count: n.physical_gpus(),
                        model: n.model(),
                        cluster: Some(self.cluster.clone()),
                        labels,
                        mig_instances: n.mig_instances(),
                        ..HostGpus::default()
                    },
                    provenance: self.provenance(format!("scontrol show node {}", n.name), now),
                }
            })
            .collect()
    }

    async fn run(&self) -> Result<CollectReport, CollectError> {
        let _one = self.run_lock.lock().await;
        let now = now_secs();
        let mut report = CollectReport::default();
        let mut failed = 0usize;
        // Inventory.
        let inventory = self.inventory().await;
        let nodes: Option<BTreeMap<String, SlurmNode>> = match inventory {
            Ok((part, nodes)) => {
                for p in &nodes.problems {
                    report.problems.push(PartProblem {
                        part: part.clone(),
                        error: CollectError::Data(p.to_string()),
                    });
                }
                report
                    .observations
                    .extend(self.node_observations(&nodes, now));
                let map: BTreeMap<String, SlurmNode> = nodes
                    .nodes
                    .into_iter()
                    .map(|n| (n.name.clone(), n))
                    .collect();
                *self.last_nodes.lock().unwrap_or_else(|e| e.into_inner()) = Some(map.clone());
                Some(map)
            }
            Err(e) => {
                failed += 1;
                report.problems.push(PartProblem {
                    part: "inventory".into(),
                    error: e,
                });
                self.last_nodes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            }
        };
        // Jobs: without any inventory their GPUs cannot be placed, and the cursor stays.
        match nodes {
            Some(nodes) => {
                if let Err(p) = self.read_jobs(&nodes, now, &mut report).await {
                    failed += 1;
                    report.problems.push(p);
                }
            }
            None => {
                failed += 1;
                report.problems.push(PartProblem {
                    part: "sacct".into(),
                    error: CollectError::Transient(
                        "jobs not read: no node inventory yet to place their GPUs on; the cursor \
                         stays where it was"
                            .into(),
                    ),
                });
            }
        }
        if failed >= 2 && report.observations.is_empty() {
            let text: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
            let config = report
                .problems
                .iter()
                .any(|p| matches!(p.error, CollectError::Config(_)));
            let text = text.join("; ");
            return Err(if config {
                CollectError::Config(text)
            } else {
                CollectError::Transient(text)
            });
        }
        Ok(report)
    }

    /// Read `sacct` from the cursor, turn the jobs into allocations and move the cursor.
    async fn read_jobs(
        &self,
        nodes: &BTreeMap<String, SlurmNode>,
        now: DateTime<Utc>,
        report: &mut CollectReport,
    ) -> Result<(), PartProblem> {
        let what = match self.config.access {
            Access::Restd { .. } => "slurmrestd accounting",
            _ => "sacct",
        };
        let part = |e: CollectError| PartProblem {
            part: what.into(),
            error: e,
        };
        let mut state = load_state(&self.state_file).map_err(part)?;
        let now_s = now.timestamp();
        let from = match state.cursor {
            Some(c) => c - self.config.overlap_secs as i64,
            None => now_s - self.config.lookback_hours as i64 * 3600,
        };
        let to = now_s.min(from + self.config.max_window_hours as i64 * 3600);
        let window = format!("{what} {} .. {}", iso(from), iso(to));
        let sacct = self
            .accounting(from, to, now_s)
            .await
            .map_err(|e| PartProblem {
                part: window.clone(),
                error: e,
            })?;
        for p in &sacct.problems {
            report.problems.push(PartProblem {
                part: window.clone(),
                error: CollectError::Data(p.to_string()),
            });
        }
        // Exact GPU indexes of running jobs; without them, GPUs are slots of the node's pool.
        let (running_part, running) = self.running().await;
        let indexes = match running {
            Ok((jobs, problems)) => {
                for p in problems {
                    report.problems.push(PartProblem {
                        part: running_part.clone(),
                        error: CollectError::Data(p.to_string()),
                    });
                }
                jobs
            }
            Err(e) => {
                report.problems.push(PartProblem {
                    part: running_part,
                    error: e,
                });
                Vec::new()
            }
        };
        let mapped = allocate(&sacct, nodes, &indexes, &mut state);
        for p in mapped.problems {
            report.problems.push(PartProblem {
                part: window.clone(),
                error: CollectError::Data(p),
            });
        }
        for (job, allocations) in mapped.allocations {
            let key = raw_key(job);
            for a in allocations {
                report.observations.push(Observation::Allocation {
                    allocation: a,
                    provenance: self.provenance(key.clone(), now),
                });
            }
        }
        state.cursor = Some(to);
        // Ended jobs are kept while a later window may list them again; running ones while
        // accounting lists them. (A job can be missing from one answer just after it ends:
        // forgetting it then would give its end other GPUs than its start.)
        let listed: BTreeSet<&str> = sacct.jobs.iter().map(|j| j.id.as_str()).collect();
        for (id, r) in state.jobs.iter_mut() {
            if listed.contains(id.as_str()) || r.seen.is_none() {
                r.seen = Some(now_s);
            }
        }
        let keep_after = to - self.config.overlap_secs as i64;
        state.jobs.retain(|_, r| match r.end {
            Some(e) => e >= keep_after,
            None => now_s - r.seen.unwrap_or(now_s) <= FORGET_OPEN_SECS,
        });
        save_state(&self.state_file, &state).map_err(part)?;
        Ok(())
    }
}

fn iso(secs: i64) -> String {
    Utc.timestamp_opt(secs, 0)
        .single()
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S").to_string())
        .unwrap_or_default()
}

/// `sacct`'s arguments for the window `from..to` (seconds, read as UTC with `TZ=UTC`).
pub fn sacct_args(from: i64, to: i64) -> Vec<String> {
    vec![
        "--allusers".into(),
        "--parsable2".into(),
        "--noheader".into(),
        format!("--delimiter={SACCT_DELIMITER}"),
        format!("--format={}", parse::SACCT_FIELDS.join(",")),
        format!("--starttime={}", iso(from)),
        format!("--endtime={}", iso(to)),
    ]
}

/// The provenance key of a job's allocations: what the source said of it beyond the
/// allocation's fields (its name, QOS, state, and the GPU usage Slurm measured).
fn raw_key(job: &SacctJob) -> String {
    let mut parts = vec![format!("state={}", job.state)];
    if job.display_id != job.id {
        parts.push(format!("array_id={}", job.display_id));
    }
    if let Some(n) = &job.name {
        parts.push(format!("name={n}"));
    }
    if let Some(q) = &job.qos {
        parts.push(format!("qos={q}"));
    }
    parts.push(format!("gres/gpu={}", job.gpus.total));
    if let Some(u) = job.gpu_util_pct {
        parts.push(format!("gres/gpuutil={u:.1}"));
    }
    if let Some(m) = job.gpu_mem_mib {
        parts.push(format!("gres/gpumem_mib={m:.0}"));
    }
    format!("slurm job {} ({})", job.id, parts.join(", "))
}

/// The allocations `sacct`'s jobs make on `nodes`' GPU pools as a first run would make them
/// (no job reported before), with a message for each job that could not be placed. Pure: for
/// tests, fuzzing and `check-config`-like dry runs.
pub fn job_allocations(
    sacct: &Sacct,
    nodes: &Nodes,
    indexes: &[JobIndexes],
) -> (Vec<PushAllocation>, Vec<String>) {
    let nodes: BTreeMap<String, SlurmNode> = nodes
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.clone()))
        .collect();
    let mut state = CursorState::default();
    let m = allocate(sacct, &nodes, indexes, &mut state);
    (
        m.allocations.into_iter().flat_map(|(_, a)| a).collect(),
        m.problems,
    )
}

/// Jobs turned into allocations.
struct Mapped<'a> {
    allocations: Vec<(&'a SacctJob, Vec<PushAllocation>)>,
    problems: Vec<String>,
}

/// A node's GPU pools: whole GPUs (`None`) and each MIG profile.
fn pool_size(node: &SlurmNode, pool: &Option<String>) -> u32 {
    match pool {
        None => node.physical_gpus(),
        Some(p) => node.mig_instances().get(p).copied().unwrap_or(0),
    }
}

fn pool_uuid(node: &str, pool: &Option<String>, slot: u32) -> String {
    match pool {
        None => placeholder_uuid(node, slot),
        Some(p) => mig_placeholder_uuid(node, p, slot),
    }
}

/// Which pool a job's GPUs of one TRES type come from: a MIG profile's, else whole GPUs.
fn pool_of(gpu_type: &Option<String>) -> Option<String> {
    gpu_type.clone().filter(|t| parse::is_mig_profile(t))
}

/// Turn `sacct`'s GPU jobs into allocations on their nodes' GPU pools, skipping finished jobs
/// already reported, and record what was reported in `state`.
fn allocate<'a>(
    sacct: &'a Sacct,
    nodes: &BTreeMap<String, SlurmNode>,
    indexes: &[JobIndexes],
    state: &mut CursorState,
) -> Mapped<'a> {
    let mut out = Mapped {
        allocations: Vec::new(),
        problems: Vec::new(),
    };
    let idx: BTreeMap<&str, &JobIndexes> = indexes.iter().map(|j| (j.job_id.as_str(), j)).collect();
    let mut jobs: Vec<&SacctJob> = sacct.jobs.iter().filter(|j| j.start.is_some()).collect();
    // Who holds which slot when, by node: what the state remembers, then each job placed.
    let mut holds: Holds = BTreeMap::new();
    for r in state.jobs.values() {
        hold(&mut holds, r.start, r.end, &r.gpus);
    }
    // Jobs whose exact GPUs are known are placed first, so the others' slots avoid them.
    jobs.sort_by_key(|j| (!idx.contains_key(j.id.as_str()), j.start, j.id.clone()));
    for job in jobs {
        let Some(start) = job.start else { continue };
        let (start_s, end_s) = (start.timestamp(), job.end.map(|e| e.timestamp()));
        let known = state
            .jobs
            .get(&job.id)
            .filter(|r| r.start == start_s)
            .cloned();
        if let Some(r) = &known {
            if r.end.is_some() && r.end == end_s {
                continue; // Reported with this end already.
            }
        }
        let gpus = match &known {
            Some(r) => r.gpus.clone(),
            None => match place(job, nodes, idx.get(job.id.as_str()).copied(), &holds) {
                Ok(g) => {
                    hold(&mut holds, start_s, end_s, &g);
                    g
                }
                Err(e) => {
                    out.problems.push(format!("job {}: {e}", job.id));
                    continue;
                }
            },
        };
        let allocations = gpus
            .iter()
            .map(|uuid| PushAllocation {
                gpu_uuid: uuid.clone(),
                start,
                end: job.end.map(|e| e.max(start)),
                workload: job.id.clone(),
                kind: AllocationKind::SlurmJob,
                user: job.user.clone(),
                team: None,
                owner: None,
                context: WorkloadContext {
                    slurm_account: job.account.clone(),
                    slurm_partition: job.partition.clone(),
                    slurm_qos: job.qos.clone().filter(|q| !q.trim().is_empty()),
                    slurm_job_name: job.name.clone().filter(|n| !n.trim().is_empty()),
                    slurm_state: Some(job.state.clone()).filter(|s| !s.trim().is_empty()),
                    ..WorkloadContext::default()
                },
                avg_util_pct: job.gpu_util_pct,
                avg_mem_used_mib: job.gpu_mem_mib,
            })
            .collect();
        state.jobs.insert(
            job.id.clone(),
            Reported {
                start: start_s,
                end: end_s,
                gpus,
                seen: None,
            },
        );
        out.allocations.push((job, allocations));
    }
    out
}

/// Slots held, by node: (start, end or `i64::MAX` while open, placeholder UUID).
type Holds = BTreeMap<String, Vec<(i64, i64, String)>>;

fn hold(holds: &mut Holds, start: i64, end: Option<i64>, gpus: &[String]) {
    for uuid in gpus {
        let Some((host, _)) = uuid
            .strip_prefix("placeholder:")
            .and_then(|r| r.rsplit_once(':'))
        else {
            continue;
        };
        holds.entry(host.to_string()).or_default().push((
            start,
            end.unwrap_or(i64::MAX),
            uuid.clone(),
        ));
    }
}

/// The placeholder UUIDs a new job's GPUs take: the exact indexes where `scontrol` gave them,
/// else the lowest slots of each node's pool that no job overlapping it in time holds.
fn place(
    job: &SacctJob,
    nodes: &BTreeMap<String, SlurmNode>,
    indexes: Option<&JobIndexes>,
    holds: &Holds,
) -> Result<Vec<String>, String> {
    if job.nodes.is_empty() {
        return Err("holds GPUs but names no node".into());
    }
    let n_nodes = job.nodes.len() as u32;
    let mut per_node: BTreeMap<Option<String>, u32> = BTreeMap::new();
    for (t, c) in job.gpus.pools() {
        let pool = pool_of(&t);
        if c % n_nodes != 0 {
            return Err(format!(
                "{c} GPU(s) of type {} over {n_nodes} nodes do not split evenly, and sacct does \
                 not say how they were spread; not recorded",
                t.as_deref().unwrap_or("(untyped)")
            ));
        }
        *per_node.entry(pool).or_default() += c / n_nodes;
    }
    let (start, end) = (
        job.start.map_or(0, |t| t.timestamp()),
        job.end.map_or(i64::MAX, |t| t.timestamp()),
    );
    let mut out = Vec::new();
    for name in &job.nodes {
        let Some(node) = nodes.get(name) else {
            return Err(format!(
                "node {name} is not in the inventory (`scontrol show node`); its GPUs cannot be \
                 placed"
            ));
        };
        for (pool, need) in &per_node {
            let size = pool_size(node, pool);
            if size == 0 {
                return Err(format!(
                    "node {name} has no {} GPUs in the inventory",
                    pool.as_deref().unwrap_or("whole")
                ));
            }
            if *need > size {
                return Err(format!(
                    "holds {need} {} GPU(s) on node {name}, which has {size}",
                    pool.as_deref().unwrap_or("whole")
                ));
            }
            // Exact indexes of whole GPUs, from scontrol show job -d.
            if pool.is_none() {
                if let Some(exact) = indexes.and_then(|j| j.nodes.get(name)) {
                    let mut idx: Vec<u32> = exact
                        .iter()
                        .filter(|(t, _)| pool_of(t).is_none())
                        .flat_map(|(_, v)| v.iter().copied())
                        .collect::<BTreeSet<u32>>()
                        .into_iter()
                        .collect();
                    if idx.len() == *need as usize && idx.iter().all(|i| *i < size) {
                        idx.sort_unstable();
                        out.extend(idx.iter().map(|i| pool_uuid(name, pool, *i)));
                        continue;
                    }
                }
            }
            let busy: BTreeSet<&str> = holds
                .get(name)
                .into_iter()
                .flatten()
                .filter(|(s, e, _)| *s < end && *e > start)
                .map(|(_, _, u)| u.as_str())
                .collect();
            let mut free: Vec<String> = (0..size)
                .map(|s| pool_uuid(name, pool, s))
                .filter(|u| !busy.contains(u.as_str()))
                .collect();
            // More GPUs held than the pool has free (a record that arrived late overlapping
            // others): the remaining ones share slots rather than invent GPUs.
            let mut s = 0;
            while free.len() < *need as usize {
                free.push(pool_uuid(name, pool, s % size));
                s += 1;
            }
            out.extend(free.into_iter().take(*need as usize));
        }
    }
    Ok(out)
}

impl Collector for SlurmCollector {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn collect(&self) -> CollectFuture<'_> {
        Box::pin(async move { self.run().await.map(|r| r.observations) })
    }

    fn collect_report(&self) -> ReportFuture<'_> {
        Box::pin(self.run())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        SlurmConfig::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn config_defaults_and_errors() {
        let c = SlurmConfig::from_toml("type = \"slurm\"\nname = \"hpc\"\n").unwrap();
        assert_eq!(c.access, Access::Local);
        assert_eq!(c.hosts().unwrap(), Vec::<String>::new());
        assert_eq!(
            (
                c.timeout_secs,
                c.lookback_hours,
                c.overlap_secs,
                c.max_window_hours
            ),
            (60, 24, 600, 24)
        );
        let c = SlurmConfig::from_toml(
            "ssh_host = \"login1\"\nssh_user = \"gl\"\nssh_port = 2222\nssh_key = \"/k\"\ncluster = \"habrok\"",
        )
        .unwrap();
        assert_eq!(c.hosts().unwrap(), ["login1"]);
        assert_eq!(c.cluster.as_deref(), Some("habrok"));
        assert!(err("ssh_user = \"x\"").contains("without `ssh_host`"));
        assert!(err("ssh_host = \"-oProxyCommand=x\"").contains("not a host name"));
        assert!(err("ssh_host = \"h\"\nssh_port = 0").contains("ssh_port"));
        assert!(err("sacct_format = \"x\"").contains("unknown field"));
        assert!(err("timeout_secs = 0").contains("timeout_secs"));
        let c = SlurmConfig::from_toml(
            "restd_url = \"http://slurmctl:6820/\"\nrestd_token_file = \"/t\"\nrestd_user = \"gl\"",
        )
        .unwrap();
        assert_eq!(
            c.access,
            Access::Restd {
                url: "http://slurmctl:6820".into(),
                user: Some("gl".into()),
                token_file: "/t".into(),
                api_version: None,
            }
        );
        assert_eq!(c.hosts().unwrap(), ["slurmctl"]);
        assert!(err("restd_url = \"http://h:6820\"").contains("restd_token_file"));
        assert!(
            err("restd_url = \"http://h\"\nrestd_token_file = \"/t\"\nssh_host = \"h\"")
                .contains("not both")
        );
        assert!(err("restd_token_file = \"/t\"").contains("need `restd_url"));
        assert!(
            err("restd_url = \"http://h/slurm/v0.0.38\"\nrestd_token_file = \"/t\"")
                .contains("without an API path")
        );
        assert!(
            err("restd_url = \"http://169.254.169.254\"\nrestd_token_file = \"/t\"")
                .contains("link-local")
        );
        assert!(err("restd_url = \"h:6820\"\nrestd_token_file = \"/t\"").contains("not an http"));
        let api = |v: &str| match SlurmConfig::from_toml(&format!(
            "restd_url = \"http://h\"\nrestd_token_file = \"/t\"\nrestd_api_version = \"{v}\""
        ))
        .map(|c| c.access)
        {
            Ok(Access::Restd { api_version, .. }) => Ok(api_version),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(api("v0.0.41"), Ok(Some("v0.0.41")));
        assert_eq!(api(" 0.0.38 "), Ok(Some("v0.0.38")));
        assert_eq!(api("auto"), Ok(None));
        assert!(api("v0.0.37")
            .unwrap_err()
            .contains("restd_api_version: `v0.0.37`"));
        assert!(api("v0.0.4").is_err());
        assert!(err("restd_api_version = \"auto\"").contains("need `restd_url"));
    }

    /// A slurmrestd serving only API v0.0.40 (and no `/slurm/…/jobs`): `auto` finds v0.0.40 and
    /// keeps it; a pinned version it does not serve, and a path no version serves, are
    /// configuration errors saying what to set.
    #[tokio::test]
    async fn restd_api_version_is_found_or_named() {
        use axum::routing::get;
        let nodes = r#"{"nodes": [{"name": "n1", "gres": "gpu:h100:4", "state": ["IDLE"]}],
                        "errors": [], "warnings": []}"#;
        let app = axum::Router::new()
            .route("/slurm/v0.0.40/nodes", get(move || async move { nodes }))
            .route(
                "/slurmdb/v0.0.40/jobs",
                get(|| async { r#"{"jobs": [], "errors": []}"# }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let dir =
            std::env::temp_dir().join(format!("gpuledger-slurm-restd-api-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("jwt");
        std::fs::write(&token, "SLURM_JWT=x\n").unwrap();
        let collector = |extra: &str| {
            let toml = format!(
                "restd_url = \"http://{addr}\"\nrestd_token_file = \"{}\"\n{extra}",
                token.display()
            );
            SlurmCollector::new("t", SlurmConfig::from_toml(&toml).unwrap()).unwrap()
        };
        let auto = collector("");
        let (part, n) = auto.inventory().await.unwrap();
        assert_eq!(
            (part.as_str(), n.nodes.len()),
            ("GET /slurm/v0.0.40/nodes", 1)
        );
        assert_eq!(*auto.restd_api.lock().unwrap(), Some("v0.0.40"));
        assert_eq!(auto.accounting(0, 60, 60).await.unwrap().rows, 0);
        let e = auto.running().await.1.unwrap_err();
        assert!(
            matches!(&e, CollectError::Config(m) if m.contains("every API version")),
            "{e}"
        );
        let pinned = collector("restd_api_version = \"v0.0.41\"");
        let e = pinned.inventory().await.unwrap_err();
        assert!(
            matches!(&e, CollectError::Config(m) if m.contains("does not serve API v0.0.41")
                && m.contains("restd_api_version")),
            "{e}"
        );
        let pinned = collector("restd_api_version = \"v0.0.40\"");
        assert_eq!(pinned.inventory().await.unwrap().1.nodes.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ssh_commands_never_prompt_and_quote_the_remote_side() {
        let c =
            SlurmConfig::from_toml("ssh_host = \"login1\"\nssh_user = \"gl\"\nssh_key = \"/k\"")
                .unwrap();
        let s = SlurmCollector::new("hpc", c).unwrap();
        let (program, args, _) = s.command("sacct", &["--format=A,B".into(), "x y".into()]);
        assert_eq!(program, "ssh");
        assert!(
            args.windows(2).any(|w| w == ["-o", "BatchMode=yes"]),
            "{args:?}"
        );
        assert!(args.windows(2).any(|w| w == ["-i", "/k"]), "{args:?}");
        let remote = args.last().unwrap();
        assert_eq!(
            remote,
            "env LC_ALL=C TZ=UTC SLURM_TIME_FORMAT=%s sacct --format=A,B 'x y'"
        );
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    fn node(name: &str, gpus: u32) -> (String, SlurmNode) {
        (
            name.to_string(),
            SlurmNode {
                name: name.to_string(),
                gpus: BTreeMap::from([(Some("h100".to_string()), gpus)]),
                ..SlurmNode::default()
            },
        )
    }

    fn sacct(lines: &str) -> Sacct {
        let fields = [
            "JobID",
            "User",
            "Account",
            "Partition",
            "State",
            "Start",
            "End",
            "NodeList",
            "AllocTRES",
        ];
        parse::parse_sacct(lines, &fields, "|")
    }

    /// Overlapping jobs on one node take different slots; a job seen running and then ended
    /// keeps its slots, and one already reported ended is not reported again.
    #[test]
    fn jobs_take_free_slots_keep_them_and_are_reported_once() {
        let nodes = BTreeMap::from([node("n1", 4)]);
        let mut state = CursorState::default();
        let first = sacct("1|ana|a|p|RUNNING|100|Unknown|n1|gres/gpu=2\n2|bo|b|p|COMPLETED|110|150|n1|gres/gpu=1\n3|cy|c|p|COMPLETED|160|170|n1|gres/gpu=3\n");
        let m = allocate(&first, &nodes, &[], &mut state);
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        let got: Vec<(String, Vec<String>)> = m
            .allocations
            .iter()
            .map(|(j, a)| (j.id.clone(), a.iter().map(|a| a.gpu_uuid.clone()).collect()))
            .collect();
        assert_eq!(got[0].1, ["placeholder:n1:0", "placeholder:n1:1"]);
        assert_eq!(got[1].1, ["placeholder:n1:2"]);
        assert_eq!(
            got[2].1,
            ["placeholder:n1:2", "placeholder:n1:3", "placeholder:n1:0"],
            "slot 2 is free again after job 2; the fourth is shared"
        );
        let second = sacct(
            "1|ana|a|p|COMPLETED|100|300|n1|gres/gpu=2\n2|bo|b|p|COMPLETED|110|150|n1|gres/gpu=1\n",
        );
        let m = allocate(&second, &nodes, &[], &mut state);
        assert_eq!(m.allocations.len(), 1, "job 2 was reported already");
        let (j, a) = &m.allocations[0];
        assert_eq!(j.id, "1");
        assert_eq!(a[0].gpu_uuid, "placeholder:n1:0");
        assert_eq!(a[0].end.map(|e| e.timestamp()), Some(300));
        assert_eq!(a[0].context.slurm_account.as_deref(), Some("a"));
    }

    #[test]
    fn exact_indexes_and_problems() {
        let nodes = BTreeMap::from([node("n1", 4), node("n2", 4)]);
        let mut state = CursorState::default();
        let idx = JobIndexes {
            job_id: "7".into(),
            nodes: BTreeMap::from([(
                "n1".to_string(),
                BTreeMap::from([(Some("h100".to_string()), vec![1, 3])]),
            )]),
        };
        let s = sacct("7|ana|a|p|RUNNING|100|Unknown|n1|gres/gpu=2\n8|bo|b|p|RUNNING|100|Unknown|n[1-2]|gres/gpu=3\n9|bo|b|p|RUNNING|100|Unknown|n9|gres/gpu=1\n");
        let m = allocate(&s, &nodes, &[idx], &mut state);
        assert_eq!(m.allocations.len(), 1);
        let uuids: Vec<&str> = m.allocations[0]
            .1
            .iter()
            .map(|a| a.gpu_uuid.as_str())
            .collect();
        assert_eq!(uuids, ["placeholder:n1:1", "placeholder:n1:3"]);
        assert_eq!(m.problems.len(), 2, "{:?}", m.problems);
        assert!(
            m.problems[0].contains("do not split evenly"),
            "{:?}",
            m.problems
        );
        assert!(
            m.problems[1].contains("node n9 is not in the inventory"),
            "{:?}",
            m.problems
        );
    }

    /// What the model has no field for yet travels in the provenance key; a step that measured
    /// nothing leaves the utilization out rather than writing 0.
    #[test]
    fn raw_keys_carry_name_qos_state_and_measured_use() {
        let fields = [
            "JobID",
            "JobName",
            "QOS",
            "State",
            "Start",
            "End",
            "NodeList",
            "NTasks",
            "AllocTRES",
            "TRESUsageInTot",
        ];
        let s = parse::parse_sacct(
            "7946767|LFWW|normal|COMPLETED|100|200|n1||gres/gpu:v100=1,gres/gpu=1|\n\
             7946767.batch|batch||COMPLETED|100|200|n1|1|gres/gpu=1|gres/gpumem=7954688K,gres/gpuutil=54\n\
             9|x||RUNNING|100|Unknown|n1||gres/gpu=1|\n",
            &fields,
            "|",
        );
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        assert_eq!(
            raw_key(&s.jobs[0]),
            "slurm job 7946767 (state=COMPLETED, name=LFWW, qos=normal, gres/gpu=1, \
             gres/gpuutil=54.0, gres/gpumem_mib=7768)"
        );
        assert_eq!(
            raw_key(&s.jobs[1]),
            "slurm job 9 (state=RUNNING, name=x, gres/gpu=1)"
        );
    }

    #[test]
    fn state_files_round_trip_and_refuse_strangers() {
        let dir =
            std::env::temp_dir().join(format!("gpuledger-slurm-state-{}", std::process::id()));
        let path = dir.join("s.json");
        let _ = std::fs::remove_dir_all(&dir);
        let fresh = load_state(&path).unwrap();
        assert_eq!((fresh.version, fresh.cursor), (STATE_VERSION, None));
        let mut s = fresh.clone();
        s.cursor = Some(5);
        s.jobs.insert(
            "1".into(),
            Reported {
                start: 1,
                end: None,
                gpus: vec!["placeholder:n:0".into()],
                seen: Some(1),
            },
        );
        save_state(&path, &s).unwrap();
        assert_eq!(load_state(&path).unwrap(), s);
        std::fs::write(&path, "{\"nope\": 1}").unwrap();
        assert!(load_state(&path)
            .unwrap_err()
            .to_string()
            .contains("Move it away"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
