//! `gpuledger collect --once --dry-run` with an `aws` collector against a real AWS API
//! emulator: moto in server mode on 127.0.0.1 (scripts/test.sh installs it into
//! `target/moto-venv`), its instances made with boto3, the official AWS SDK for Python.
//! Without moto this says it was skipped, unless `GPULEDGER_REQUIRE_MOTO` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{bin, tempdir, Server};

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
            "GPULEDGER_REQUIRE_MOTO is set but there is no moto_server at {}",
            bin.display()
        );
    } else {
        eprintln!("skipped: no moto_server at {}", bin.display());
        None
    }
}

const SEED: &str = r#"
import sys, boto3
c = boto3.client("ec2", region_name="eu-west-1", endpoint_url=sys.argv[1],
                 aws_access_key_id="testing", aws_secret_access_key="testing")
def run(itype, tags, spot=False):
    kw = dict(ImageId="ami-12c6146b", InstanceType=itype, MinCount=1, MaxCount=1,
              TagSpecifications=[{"ResourceType": "instance",
                                  "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}])
    if spot:
        kw["InstanceMarketOptions"] = {"MarketType": "spot"}
    return c.run_instances(**kw)["Instances"][0]["InstanceId"]
run("p5.48xlarge", {"team": "research", "env": "prod"}, spot=True)
run("g6f.large", {"team": "graphics"})
c.stop_instances(InstanceIds=[run("p4d.24xlarge", {"team": "nlp"})])
"#;

/// The config's `aws` entry, checked and run as `serve` would: the running GPU instances become
/// hosts with their GPUs, tags and lifecycle; the stopped one does not.
#[test]
fn collect_dry_run_lists_the_gpu_instances_of_an_aws_account() {
    let Some(moto) = moto_server() else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = Server(
        Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let seeded = Command::new(moto.parent().unwrap().join("python"))
        .args(["-c", SEED, &url])
        .output()
        .unwrap();
    assert!(
        seeded.status.success(),
        "{}",
        String::from_utf8_lossy(&seeded.stderr)
    );

    let dir = tempdir("cloud", "aws-dry-run");
    let cfg = dir.join("gpuledger.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[collectors]]\ntype = \"aws\"\nname = \"aws-research\"\nregions = [\"eu-west-1\"]\nendpoint = \"{url}\"\n"
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        bin()
            .args(args)
            .arg(&cfg)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env_remove("AWS_PROFILE")
            .output()
            .unwrap()
    };
    let checked = run(&["check-config"]);
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let out = run(&["collect", "--once", "--dry-run", "--config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut hosts: Vec<(String, u64, String, String, String)> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|o| o["kind"] == "host_gpu_count")
        .map(|o| {
            let g = &o["gpus"];
            let s = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
            assert_eq!(g["cloud"], "aws");
            assert_eq!(g["account"], "123456789012");
            assert_eq!(g["region"], "eu-west-1");
            assert!(s(&g["labels"]["instance_id"]).starts_with("i-"));
            (
                s(&g["instance_type"]),
                g["count"].as_u64().unwrap(),
                s(&g["model"]),
                s(&g["labels"]["lifecycle"]),
                s(&g["labels"]["team"]),
            )
        })
        .collect();
    hosts.sort();
    let want = |t: &str, n: u64, m: &str, l: &str, team: &str| {
        (
            t.to_string(),
            n,
            m.to_string(),
            l.to_string(),
            team.to_string(),
        )
    };
    assert_eq!(
        hosts,
        vec![
            want("g6f.large", 1, "L4", "on-demand", "graphics"),
            want("p5.48xlarge", 8, "H100", "spot", "research"),
        ]
    );
}
