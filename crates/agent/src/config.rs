//! The agent's settings: flags (and their environment variables) first, then the config file,
//! then defaults. Everything is resolved and checked before the agent reads a GPU, so a typo
//! stops it at once with the key and what to do.
//!
//! ```toml
//! server = "https://gpuledger.example"
//! token_file = "/etc/gpuledger-agent/token"
//! interval_secs = 60
//! inventory_secs = 600
//! source = "auto"            # auto | nvml | smi-xml | smi-csv | amd-smi | rocm-smi | hl-smi
//! nvidia_smi = "/usr/bin/nvidia-smi"   # the vendors' tools, where not on PATH
//! amd_smi = "/opt/rocm/bin/amd-smi"
//! rocm_smi = "/opt/rocm/bin/rocm-smi"
//! hl_smi = "/usr/bin/hl-smi"
//! buffer_dir = "/var/lib/gpuledger-agent"
//! buffer_max_mib = 64
//! cluster = "rdu-ocp-1"
//! cloud = "onprem"           # aws | gcp | azure | onprem | other
//! retry_max_secs = 300
//! [labels]
//! team = "nlp"
//! env = "prod"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use gpuledger_model::Cloud;

use crate::report::HostInfo;
use crate::source::SourceKind;

/// Report this host's GPUs to a gpuledger server: read-only on the GPU, outbound only, buffered
/// on disk.
///
/// The flags of `gpuledger agent` and `gpuledger-agent`. Each can also be set in the config file
/// under the same name with `_` for `-`; flags win.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentArgs {
    /// gpuledger server base URL, e.g. https://gpuledger.example:8080.
    #[arg(long, env = "GPULEDGER_SERVER")]
    pub server: Option<String>,
    /// Ingest token (prefer --token-file: a flag is visible in the process list).
    #[arg(long, env = "GPULEDGER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the ingest token.
    #[arg(long, env = "GPULEDGER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Config file (TOML) with any of these settings; flags win over it.
    #[arg(long, env = "GPULEDGER_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Seconds between reads; each read's samples are sent as one batch [default: 60].
    #[arg(long)]
    pub interval_secs: Option<u64>,
    /// Seconds between inventory reports when nothing changed [default: 600].
    #[arg(long)]
    pub inventory_secs: Option<u64>,
    /// Read once, send (or print) once, and exit.
    #[arg(long)]
    pub once: bool,
    /// Print the JSON bodies instead of sending them; nothing is written to disk.
    #[arg(long)]
    pub dry_run: bool,
    /// How to read GPUs [default: auto = every vendor present: NVIDIA through NVML, then
    /// nvidia-smi -q -x, then nvidia-smi CSV; AMD through amd-smi, then rocm-smi; Intel Gaudi
    /// through hl-smi].
    #[arg(long, value_enum)]
    pub source: Option<SourceKind>,
    /// The nvidia-smi program [default: nvidia-smi on PATH].
    #[arg(long)]
    pub nvidia_smi: Option<PathBuf>,
    /// The amd-smi program [default: amd-smi on PATH].
    #[arg(long)]
    pub amd_smi: Option<PathBuf>,
    /// The rocm-smi program [default: rocm-smi on PATH].
    #[arg(long)]
    pub rocm_smi: Option<PathBuf>,
    /// The hl-smi program (Intel Gaudi) [default: hl-smi on PATH].
    #[arg(long)]
    pub hl_smi: Option<PathBuf>,
    /// Directory of the disk buffer [default: $STATE_DIRECTORY or /var/lib/gpuledger-agent].
    #[arg(long, env = "GPULEDGER_BUFFER_DIR")]
    pub buffer_dir: Option<PathBuf>,
    /// Most MiB the disk buffer may hold; the oldest bodies go first [default: 64].
    #[arg(long)]
    pub buffer_max_mib: Option<u64>,
    /// Host name to report [default: the kernel's host name].
    #[arg(long, env = "GPULEDGER_HOST")]
    pub host: Option<String>,
    /// Cluster name to report.
    #[arg(long, env = "GPULEDGER_CLUSTER")]
    pub cluster: Option<String>,
    /// Cloud: aws, gcp, azure, onprem or other.
    #[arg(long)]
    pub cloud: Option<String>,
    /// Cloud region to report.
    #[arg(long)]
    pub region: Option<String>,
    /// Cloud instance type to report.
    #[arg(long)]
    pub instance_type: Option<String>,
    /// A GPU label KEY=VALUE (repeatable); `team` and `env` set owner and environment.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Do not report GPU processes (no allocations, no /proc reads).
    #[arg(long)]
    pub no_processes: bool,
    /// Do not ask the cloud's instance metadata service for the instance ID, account, region
    /// and instance type at start.
    #[arg(long)]
    pub no_cloud_metadata: bool,
    /// Where /proc is (a container with the host's /proc mounted elsewhere) [default: /proc].
    #[arg(long)]
    pub proc_root: Option<PathBuf>,
    /// The passwd file that names process users [default: /etc/passwd].
    #[arg(long)]
    pub passwd_file: Option<PathBuf>,
    /// Longest wait between two delivery attempts while the server is unreachable [default: 300].
    #[arg(long)]
    pub retry_max_secs: Option<u64>,
    /// PEM file of CA certificates to trust for an https server [default: built-in Mozilla roots].
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

/// Fully resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub server: Option<String>,
    pub token: Option<String>,
    pub interval_secs: u64,
    pub inventory_secs: u64,
    pub once: bool,
    pub dry_run: bool,
    pub source: SourceKind,
    pub nvidia_smi: PathBuf,
    pub amd_smi: PathBuf,
    pub rocm_smi: PathBuf,
    pub hl_smi: PathBuf,
    pub buffer_dir: PathBuf,
    pub buffer_max_bytes: u64,
    pub host: HostInfo,
    pub processes: bool,
    pub proc_root: PathBuf,
    pub passwd_file: PathBuf,
    pub ca_file: Option<PathBuf>,
    pub retry_max_secs: u64,
    /// Where to ask the cloud's instance metadata service at start; `None`: not at all.
    pub cloud_metadata: Option<String>,
}

/// The config file's values, all optional.
#[derive(Debug, Default)]
struct FileValues {
    server: Option<String>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    interval_secs: Option<u64>,
    inventory_secs: Option<u64>,
    source: Option<SourceKind>,
    nvidia_smi: Option<PathBuf>,
    amd_smi: Option<PathBuf>,
    rocm_smi: Option<PathBuf>,
    hl_smi: Option<PathBuf>,
    buffer_dir: Option<PathBuf>,
    buffer_max_mib: Option<u64>,
    host: Option<String>,
    cluster: Option<String>,
    cloud: Option<String>,
    region: Option<String>,
    instance_type: Option<String>,
    labels: BTreeMap<String, String>,
    processes: Option<bool>,
    proc_root: Option<PathBuf>,
    passwd_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    retry_max_secs: Option<u64>,
    cloud_metadata: Option<bool>,
    metadata_url: Option<String>,
}

const KEYS: &[&str] = &[
    "server",
    "token",
    "token_file",
    "interval_secs",
    "inventory_secs",
    "source",
    "nvidia_smi",
    "amd_smi",
    "rocm_smi",
    "hl_smi",
    "buffer_dir",
    "buffer_max_mib",
    "host",
    "cluster",
    "cloud",
    "region",
    "instance_type",
    "labels",
    "processes",
    "proc_root",
    "passwd_file",
    "ca_file",
    "retry_max_secs",
    "cloud_metadata",
    "metadata_url",
];

fn parse_file(text: &str, path: &Path) -> anyhow::Result<FileValues> {
    let where_ = path.display();
    let doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("{where_} is not valid TOML"))?;
    let mut v = FileValues::default();
    for (key, item) in doc.iter() {
        if !KEYS.contains(&key) {
            bail!(
                "{where_}: unknown key `{key}`; known keys are {}",
                KEYS.join(", ")
            );
        }
        let string = || -> anyhow::Result<String> {
            item.as_str()
                .map(str::to_string)
                .with_context(|| format!("{where_}: `{key}` must be a string"))
        };
        let integer = || -> anyhow::Result<u64> {
            item.as_integer()
                .and_then(|i| u64::try_from(i).ok())
                .with_context(|| format!("{where_}: `{key}` must be a non-negative integer"))
        };
        match key {
            "server" => v.server = Some(string()?),
            "token" => v.token = Some(string()?),
            "token_file" => v.token_file = Some(string()?.into()),
            "interval_secs" => v.interval_secs = Some(integer()?),
            "inventory_secs" => v.inventory_secs = Some(integer()?),
            "source" => {
                let s = string()?;
                v.source = Some(SourceKind::parse(&s).with_context(|| {
                    let kinds: Vec<&str> = SourceKind::ALL.iter().map(|k| k.as_str()).collect();
                    format!(
                        "{where_}: `source` must be one of {}, got `{s}`",
                        kinds.join(", ")
                    )
                })?)
            }
            "nvidia_smi" => v.nvidia_smi = Some(string()?.into()),
            "amd_smi" => v.amd_smi = Some(string()?.into()),
            "rocm_smi" => v.rocm_smi = Some(string()?.into()),
            "hl_smi" => v.hl_smi = Some(string()?.into()),
            "buffer_dir" => v.buffer_dir = Some(string()?.into()),
            "buffer_max_mib" => v.buffer_max_mib = Some(integer()?),
            "host" => v.host = Some(string()?),
            "cluster" => v.cluster = Some(string()?),
            "cloud" => v.cloud = Some(string()?),
            "region" => v.region = Some(string()?),
            "instance_type" => v.instance_type = Some(string()?),
            "processes" => {
                v.processes = Some(
                    item.as_bool()
                        .with_context(|| format!("{where_}: `processes` must be true or false"))?,
                )
            }
            "proc_root" => v.proc_root = Some(string()?.into()),
            "passwd_file" => v.passwd_file = Some(string()?.into()),
            "ca_file" => v.ca_file = Some(string()?.into()),
            "retry_max_secs" => v.retry_max_secs = Some(integer()?),
            "cloud_metadata" => {
                v.cloud_metadata =
                    Some(item.as_bool().with_context(|| {
                        format!("{where_}: `cloud_metadata` must be true or false")
                    })?)
            }
            "metadata_url" => v.metadata_url = Some(string()?),
            "labels" => {
                let table = item
                    .as_table_like()
                    .with_context(|| format!("{where_}: `labels` must be a table"))?;
                for (k, val) in table.iter() {
                    let s = val
                        .as_str()
                        .with_context(|| format!("{where_}: labels.{k} must be a string"))?;
                    v.labels.insert(k.to_string(), s.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(v)
}

/// The kernel's host name, without calling into libc.
fn kernel_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let t = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let t = t.trim().to_string();
    if t.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(t)
}

impl Settings {
    /// Merge flags, config file and defaults, and check the result.
    pub fn resolve(args: &AgentArgs) -> anyhow::Result<Settings> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the config file {}", path.display()))?;
                parse_file(&text, path)?
            }
            None => FileValues::default(),
        };
        let token = match (&args.token, &args.token_file, &file.token, &file.token_file) {
            (Some(t), _, _, _) => Some(t.trim().to_string()),
            (None, Some(p), _, _) => Some(read_token(p)?),
            (None, None, Some(t), _) => Some(t.trim().to_string()),
            (None, None, None, Some(p)) => Some(read_token(p)?),
            _ => None,
        };
        let server = args.server.clone().or(file.server);
        let dry_run = args.dry_run;
        if !dry_run {
            if server.is_none() {
                bail!("no server: pass --server URL (or GPULEDGER_SERVER, or `server` in the config file); use --dry-run to only print what would be sent");
            }
            if token.as_deref().is_none_or(str::is_empty) {
                bail!("no token: pass --token-file FILE or --token TOKEN (or GPULEDGER_TOKEN); mint one with `gpuledger token create --source NAME`");
            }
        }
        let interval_secs = args.interval_secs.or(file.interval_secs).unwrap_or(60);
        if interval_secs == 0 {
            bail!("--interval-secs must be at least 1");
        }
        let inventory_secs = args.inventory_secs.or(file.inventory_secs).unwrap_or(600);
        let cloud_text = args.cloud.clone().or(file.cloud);
        let cloud = match cloud_text.as_deref() {
            None => None,
            Some(c) => Some(Cloud::parse(c).with_context(|| {
                format!("cloud must be one of aws, gcp, azure, onprem, other; got `{c}`")
            })?),
        };
        let mut labels = file.labels;
        for l in &args.labels {
            let (k, v) = l
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .with_context(|| format!("--label must be KEY=VALUE, got `{l}`"))?;
            labels.insert(k.trim().to_string(), v.trim().to_string());
        }
        let buffer_dir = args
            .buffer_dir
            .clone()
            .or(file.buffer_dir)
            .or_else(|| {
                // systemd's StateDirectory= sets this (a colon-separated list).
                std::env::var("STATE_DIRECTORY")
                    .ok()
                    .and_then(|s| s.split(':').next().map(PathBuf::from))
                    .filter(|p| !p.as_os_str().is_empty())
            })
            .unwrap_or_else(|| PathBuf::from("/var/lib/gpuledger-agent"));
        let buffer_max_mib = args.buffer_max_mib.or(file.buffer_max_mib).unwrap_or(64);
        if buffer_max_mib == 0 {
            bail!("--buffer-max-mib must be at least 1");
        }
        Ok(Settings {
            server,
            token,
            interval_secs,
            inventory_secs,
            once: args.once,
            dry_run,
            source: args.source.or(file.source).unwrap_or(SourceKind::Auto),
            nvidia_smi: args
                .nvidia_smi
                .clone()
                .or(file.nvidia_smi)
                .unwrap_or_else(|| PathBuf::from("nvidia-smi")),
            amd_smi: args
                .amd_smi
                .clone()
                .or(file.amd_smi)
                .unwrap_or_else(|| PathBuf::from("amd-smi")),
            rocm_smi: args
                .rocm_smi
                .clone()
                .or(file.rocm_smi)
                .unwrap_or_else(|| PathBuf::from("rocm-smi")),
            hl_smi: args
                .hl_smi
                .clone()
                .or(file.hl_smi)
                .unwrap_or_else(|| PathBuf::from("hl-smi")),
            buffer_dir,
            buffer_max_bytes: buffer_max_mib.saturating_mul(1024 * 1024),
            host: HostInfo {
                host: args.host.clone().or(file.host).or_else(kernel_hostname),
                cluster: args.cluster.clone().or(file.cluster),
                cloud,
                region: args.region.clone().or(file.region),
                instance_type: args.instance_type.clone().or(file.instance_type),
                account: None,
                labels,
            },
            processes: !args.no_processes && file.processes.unwrap_or(true),
            proc_root: args
                .proc_root
                .clone()
                .or(file.proc_root)
                .unwrap_or_else(|| PathBuf::from("/proc")),
            passwd_file: args
                .passwd_file
                .clone()
                .or(file.passwd_file)
                .unwrap_or_else(|| PathBuf::from("/etc/passwd")),
            ca_file: args.ca_file.clone().or(file.ca_file),
            retry_max_secs: args
                .retry_max_secs
                .or(file.retry_max_secs)
                .unwrap_or(300)
                .max(1),
            cloud_metadata: (!args.no_cloud_metadata && file.cloud_metadata.unwrap_or(true)).then(
                || {
                    file.metadata_url
                        .unwrap_or_else(|| crate::metadata::DEFAULT_URL.to_string())
                },
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("gpuledger-agent-cfg-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn flags_win_over_the_file_and_defaults_fill_the_rest() {
        let cfg = write(
            "ok.toml",
            "server = \"http://file\"\ntoken = \"t-file\"\ninterval_secs = 30\ncloud = \"aws\"\n\
             processes = false\nsource = \"rocm-smi\"\nrocm_smi = \"/opt/rocm/bin/rocm-smi\"\n\
             hl_smi = \"/usr/bin/hl-smi\"\n[labels]\nteam = \"nlp\"\n",
        );
        let args = AgentArgs {
            config: Some(cfg.clone()),
            server: Some("http://flag".into()),
            labels: vec!["env=prod".into()],
            hl_smi: Some("/flag/hl-smi".into()),
            ..Default::default()
        };
        let s = Settings::resolve(&args).unwrap();
        assert_eq!(s.server.as_deref(), Some("http://flag"));
        assert_eq!(s.token.as_deref(), Some("t-file"));
        assert_eq!(s.interval_secs, 30);
        assert_eq!(s.inventory_secs, 600);
        assert_eq!(s.host.cloud, Some(Cloud::Aws));
        assert_eq!(s.host.labels["team"], "nlp");
        assert_eq!(s.host.labels["env"], "prod");
        assert!(!s.processes);
        assert_eq!(s.buffer_max_bytes, 64 * 1024 * 1024);
        assert_eq!(s.source, SourceKind::RocmSmi);
        assert_eq!(s.rocm_smi, PathBuf::from("/opt/rocm/bin/rocm-smi"));
        assert_eq!(s.hl_smi, PathBuf::from("/flag/hl-smi"));
        assert_eq!(s.amd_smi, PathBuf::from("amd-smi"));
        assert_eq!(s.nvidia_smi, PathBuf::from("nvidia-smi"));
        let _ = std::fs::remove_file(cfg);
    }

    #[test]
    fn mistakes_name_the_key_and_the_fix() {
        let cfg = write("typo.toml", "intervall_secs = 5\n");
        let err = Settings::resolve(&AgentArgs {
            config: Some(cfg.clone()),
            dry_run: true,
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            err.to_string().contains("unknown key `intervall_secs`"),
            "{err}"
        );
        let _ = std::fs::remove_file(cfg);
        let cfg = write("kind.toml", "source = \"rocm\"\n");
        let err = Settings::resolve(&AgentArgs {
            config: Some(cfg.clone()),
            dry_run: true,
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            err.to_string().contains("amd-smi, rocm-smi, hl-smi"),
            "{err}"
        );
        let _ = std::fs::remove_file(cfg);
        let err = Settings::resolve(&AgentArgs::default()).unwrap_err();
        assert!(err.to_string().contains("--server"), "{err}");
        let err = Settings::resolve(&AgentArgs {
            server: Some("http://x".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("--token-file"), "{err}");
        let err = Settings::resolve(&AgentArgs {
            dry_run: true,
            cloud: Some("moon".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("aws, gcp"), "{err}");
        // Dry runs need neither server nor token.
        assert!(Settings::resolve(&AgentArgs {
            dry_run: true,
            ..Default::default()
        })
        .is_ok());
    }
}
