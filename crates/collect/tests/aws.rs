//! Tests of the `aws` collector against a real AWS API emulator: moto in server mode (from
//! PyPI), started on 127.0.0.1 by each test. Its instances are made with boto3, the official
//! AWS SDK for Python, which moto's venv carries; the collector then reads them over the EC2
//! Query API with SigV4-signed requests, as it reads AWS. moto answers `DescribeInstanceTypes`
//! with AWS's recorded `GpuInfo` (the corpus's `aws/ec2-describe-instance-types-gpu-moto.json`
//! is that data file).
//!
//! moto's server is found at `$GPULEDGER_MOTO` (scripts/test.sh installs it into
//! `target/moto-venv`), else `<repo>/target/moto-venv/bin/moto_server`; without it these tests
//! say they were skipped, unless `GPULEDGER_REQUIRE_MOTO` is set.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuledger_collect::collectors::aws::{AwsCollector, AwsConfig};
use gpuledger_collect::collectors::cloud::{CloudInstance, InstanceState, Lifecycle};
use gpuledger_collect::{CollectError, Collector};
use gpuledger_model::{Cloud, Observation};

fn moto_server() -> Option<PathBuf> {
    let bin = std::env::var_os("GPULEDGER_MOTO")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/moto-venv/bin/moto_server")
        });
    if bin.is_file() {
        Some(bin)
    } else if std::env::var_os("GPULEDGER_REQUIRE_MOTO").is_some() {
        panic!(
            "GPULEDGER_REQUIRE_MOTO is set but there is no moto_server at {}; run scripts/test.sh",
            bin.display()
        );
    } else {
        eprintln!("skipped: no moto_server at {}", bin.display());
        None
    }
}

struct Moto {
    child: Child,
    url: String,
    python: PathBuf,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_moto(bin: &Path) -> Moto {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(bin)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto_server");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    Moto {
        child,
        url,
        python: bin.parent().unwrap().join("python"),
    }
}

/// The credentials moto accepts (it checks none); the collector reads them from the
/// environment, the first link of its chain. Every test sets the same values.
fn test_credentials() {
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_SESSION_TOKEN", "testing"),
    ] {
        std::env::set_var(k, v);
    }
}

/// Make the fleet with boto3: p4d, p5 (one spot, one stopped), g5, g6, a fractional g6f, a
/// machine without GPUs, in two regions, with tags. Prints the stopped instance's ID.
const SEED: &str = r#"
import sys, boto3
url = sys.argv[1]
def ec2(region):
    return boto3.client("ec2", region_name=region, endpoint_url=url,
                        aws_access_key_id="testing", aws_secret_access_key="testing")
def run(client, itype, n=1, tags=None, spot=False):
    kw = dict(ImageId="ami-12c6146b", InstanceType=itype, MinCount=n, MaxCount=n)
    if tags:
        kw["TagSpecifications"] = [{"ResourceType": "instance",
            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    if spot:
        kw["InstanceMarketOptions"] = {"MarketType": "spot"}
    return [i["InstanceId"] for i in client.run_instances(**kw)["Instances"]]
east = ec2("us-east-1")
run(east, "p4d.24xlarge", 2, {"team": "nlp", "env": "prod", "Name": "trainer"})
run(east, "p5.48xlarge", 1, {"team": "research"}, spot=True)
stopped = run(east, "p5.48xlarge", 1, {"team": "research"})[0]
east.stop_instances(InstanceIds=[stopped])
run(east, "g5.xlarge", 3, {"team": "vision"})
run(east, "g6f.large", 1, {"team": "graphics", "lifecycle": "from-a-tag"})
run(east, "m5.large", 2)
west = ec2("us-west-2")
run(west, "g6.xlarge", 2, {"team": "speech"})
print(stopped)
"#;

fn seed(moto: &Moto) -> String {
    let out = Command::new(&moto.python)
        .args(["-c", SEED, &moto.url])
        .output()
        .expect("run boto3");
    assert!(
        out.status.success(),
        "seeding moto failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn config(moto: &Moto, extra: &str) -> AwsConfig {
    AwsConfig::from_toml(&format!(
        "regions = [\"us-east-1\", \"us-west-2\"]\nendpoint = \"{0}\"\nsts_endpoint = \"{0}\"\npage_size = 5\n{extra}",
        moto.url
    ))
    .unwrap()
}

fn by_type<'a>(all: &'a [CloudInstance], t: &str) -> Vec<&'a CloudInstance> {
    all.iter().filter(|i| i.instance_type == t).collect()
}

/// Every instance of both regions is read across pages of five, with its GPUs from
/// `DescribeInstanceTypes`, tags, lifecycle and state; a stopped instance is stopped, and only
/// running GPU instances become hosts.
#[tokio::test(flavor = "multi_thread")]
async fn moto_instances_with_gpus_tags_paging_and_a_stopped_one() {
    let Some(bin) = moto_server() else { return };
    test_credentials();
    let moto = start_moto(&bin);
    let stopped_id = seed(&moto);
    let c = AwsCollector::new("aws-test", config(&moto, "")).unwrap();
    let (all, problems) = c.instances().await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(all.len(), 12, "{all:#?}");

    let p4d = by_type(&all, "p4d.24xlarge");
    assert_eq!(p4d.len(), 2);
    let g = p4d[0].gpus.as_ref().unwrap();
    assert_eq!(
        (g.model.as_str(), g.count, g.memory_mib),
        ("A100", 8, Some(40_960))
    );
    assert_eq!(p4d[0].tags["team"], "nlp");
    assert_eq!(p4d[0].cloud, Cloud::Aws);
    assert_eq!(p4d[0].account, "123456789012", "the reservation's owner");
    assert_eq!(p4d[0].region.as_deref(), Some("us-east-1"));
    assert!(p4d[0].zone.as_deref().unwrap().starts_with("us-east-1"));
    assert!(p4d[0].launch_time.is_some());

    let p5 = by_type(&all, "p5.48xlarge");
    assert_eq!(p5.len(), 2);
    let stopped = p5.iter().find(|i| i.instance_id == stopped_id).unwrap();
    assert!(
        matches!(&stopped.state, InstanceState::Stopped { state, .. } if state == "stopped"),
        "{stopped:?}"
    );
    let spot = p5.iter().find(|i| i.instance_id != stopped_id).unwrap();
    assert_eq!(spot.lifecycle, Lifecycle::Spot);
    assert_eq!(spot.gpus.as_ref().unwrap().count, 8);
    assert_eq!(spot.gpus.as_ref().unwrap().model, "H100");

    let g6f = by_type(&all, "g6f.large");
    let share = g6f[0].gpus.as_ref().unwrap();
    assert_eq!(
        (share.model.as_str(), share.count, share.fraction),
        ("L4", 1, Some(0.125))
    );
    assert_eq!(
        by_type(&all, "g5.xlarge")[0].gpus.as_ref().unwrap().model,
        "A10G"
    );
    let g6 = by_type(&all, "g6.xlarge");
    assert_eq!(g6.len(), 2);
    assert_eq!(g6[0].region.as_deref(), Some("us-west-2"));
    assert!(by_type(&all, "m5.large").iter().all(|i| i.gpus.is_none()));

    // The collector's run: hosts for the 9 running GPU instances, none for the stopped p5 or
    // the two m5s.
    let report = c.collect_report().await.unwrap();
    let hosts: Vec<_> = report
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::HostGpuCount { gpus, .. } => Some(gpus),
            _ => None,
        })
        .collect();
    assert_eq!(hosts.len(), 9, "{hosts:#?}");
    // The stopped one says since when (moto's `User initiated (… GMT)` reason, as AWS's).
    let stopped: Vec<_> = report
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::HostStopped {
                instance_id, at, ..
            } => Some((instance_id.clone(), *at)),
            _ => None,
        })
        .collect();
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(stopped[0].0.as_deref(), Some(stopped_id.as_str()));
    assert!(
        (chrono::Utc::now() - stopped[0].1).num_minutes().abs() < 10,
        "{stopped:?}"
    );
    assert!(hosts
        .iter()
        .all(|h| h.labels["instance_id"] != stopped_id && h.labels["instance_state"] == "running"));
    let gpus: u32 = hosts.iter().map(|h| h.count).sum();
    assert_eq!(
        gpus,
        2 * 8 + 8 + 3 + 1 + 2,
        "p4d, the running p5, g5, g6f, g6"
    );
    let frac = hosts
        .iter()
        .find(|h| h.instance_type.as_deref() == Some("g6f.large"))
        .unwrap();
    assert_eq!(frac.labels["gpu_fraction"], "0.125");
    assert_eq!(
        frac.labels["tag.lifecycle"], "from-a-tag",
        "a tag never overwrites"
    );
    assert_eq!(frac.labels["lifecycle"], "on-demand");
    for h in &hosts {
        eprintln!(
            "{} {} {}x {} {:?} MiB, {} {}, tags team={}",
            h.host,
            h.instance_type.as_deref().unwrap_or("-"),
            h.count,
            h.model.as_deref().unwrap_or("-"),
            h.memory_mib,
            h.region.as_deref().unwrap_or("-"),
            h.labels["lifecycle"],
            h.labels.get("team").map(String::as_str).unwrap_or("-"),
        );
    }
}

/// An account with a role is read with credentials from STS `AssumeRole`; an endpoint that
/// does not answer fails the run with a passing error naming the account and region.
#[tokio::test(flavor = "multi_thread")]
async fn moto_assumed_role_and_an_unreachable_endpoint() {
    let Some(bin) = moto_server() else { return };
    test_credentials();
    let moto = start_moto(&bin);
    seed(&moto);
    let c = AwsCollector::new(
        "aws-roles",
        config(
            &moto,
            "accounts = [{ id = \"123456789012\", role_arn = \"arn:aws:iam::123456789012:role/gpuledger-reader\", external_id = \"gl\" }]\n",
        ),
    )
    .unwrap();
    let (all, problems) = c.instances().await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(all.len(), 12);
    assert!(all.iter().all(|i| i.account == "123456789012"));

    let dead = AwsCollector::new(
        "aws-dead",
        AwsConfig::from_toml(
            "regions = [\"us-east-1\", \"eu-west-1\"]\nendpoint = \"http://127.0.0.1:9\"\ntimeout_secs = 2\n",
        )
        .unwrap(),
    )
    .unwrap();
    let e = dead.collect().await.unwrap_err();
    assert!(matches!(e, CollectError::Transient(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("region us-east-1") && text.contains("1 more account/region parts failed"),
        "{text}"
    );
}

/// An account whose role cannot be assumed fails every region of it: with no other account,
/// the run fails (the source turns `error`), naming the account.
#[tokio::test(flavor = "multi_thread")]
async fn a_role_that_cannot_be_assumed_fails_the_run() {
    test_credentials();
    let c = AwsCollector::new(
        "aws-no-sts",
        AwsConfig::from_toml(
            "regions = [\"us-east-1\", \"eu-west-1\"]\nendpoint = \"http://127.0.0.1:9\"\n\
             sts_endpoint = \"http://127.0.0.1:9\"\ntimeout_secs = 2\n\
             accounts = [{ id = \"111122223333\", role_arn = \"arn:aws:iam::111122223333:role/r\" }]\n",
        )
        .unwrap(),
    )
    .unwrap();
    let e = c.collect().await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("account 111122223333") && text.contains("STS AssumeRole"),
        "{text}"
    );
}
