//! Every command and curl example in the docs runs here: each fenced shell block (```sh,
//! ```bash, ```shell, ```console) of README.md and docs/**/*.md is run with
//! `bash -euo pipefail` against a real `gpuledger serve`, or is marked not run, with a reason,
//! by the line just before its fence:
//!
//! ```text
//! <!-- not run in tests: needs a Kubernetes cluster -->
//! ```
//!
//! A block neither run nor marked fails the test, and so does a run block that exits non-zero
//! (with its file, line, text, stdout and stderr). The summary (blocks run and blocks marked not
//! run, per file, with the reasons) is printed; `-- --nocapture` shows it on success.
//!
//! Each run block gets a folder of its own, a copy of one prepared folder:
//! - `gpuledger.db`: two days of the demo fleet and tokens up to id 7 (the docs rotate and
//!   revoke token 7); `GPULEDGER_TOKEN` is an ingest token for source `nlp-cron`, team `nlp`.
//! - `gpuledger.toml`: HTTPS with a self-signed certificate (`CURL_CA_BUNDLE` trusts it) and a
//!   `dcgm` collector over a corpus scrape served on 127.0.0.1.
//! - `focus-2026-11.csv` and `.csv.gz`: a FOCUS export with GPU lines for two demo hosts.
//! - `./target/release/gpuledger` and `gpuledger` on `PATH`: the binary under test (the docs
//!   build it in release first; those build lines are marked), `deploy/` the repository's.
//! - `nvidia-smi` on `PATH`: prints the corpus Tesla T4 `-q -x` file, a stand-in GPU host.
//!
//! A server `gpuledger serve --config gpuledger.toml` runs on that folder on a free port of
//! 127.0.0.1, and `GPULEDGER_URL` is its `https://` address. A block naming the local
//! PostgreSQL (`127.0.0.1:5432`) runs where `GPULEDGER_TEST_PG_URL` is set (scripts/test.sh);
//! elsewhere it prints `skipped`, and fails under `GPULEDGER_REQUIRE_POSTGRES`. Without the
//! corpus the blocks are checked for markers but not run (`skipped`), unless
//! `GPULEDGER_REQUIRE_CORPUS` is set. `bash`, `curl`, `jq` and `openssl` must be on PATH.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The marker, on the line just before a fence: `<!-- not run in tests: REASON -->`.
const MARKER: &str = "<!-- not run in tests:";
const SHELLS: [&str; 4] = ["sh", "bash", "shell", "console"];
/// Longest a block may run (a debug build on a busy machine).
const BLOCK_LIMIT: Duration = Duration::from_secs(240);

mod common;

use common::{bin, serve_file, tempdir, Server};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One fenced shell block of a markdown file.
struct Block {
    /// Relative to the repository root.
    file: String,
    /// The fence's line, from 1.
    line: usize,
    /// The commands (a `console` block's `$ ` lines, without the prompt).
    script: String,
    /// `Some(reason)` when marked not run; `Some("")` when marked without a reason.
    not_run: Option<String>,
}

/// The fenced shell blocks of one markdown text.
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let lang = info.split_whitespace().next().unwrap_or("").to_string();
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            let l = lines[i];
            let cut = l.len() - l.trim_start().len();
            body.push(&l[cut.min(indent)..]);
            i += 1;
        }
        i += 1;
        if !SHELLS.contains(&lang.as_str()) {
            continue;
        }
        let script = if lang == "console" {
            let mut cmds = Vec::new();
            let mut continued = false;
            for l in body {
                if let Some(c) = l.strip_prefix("$ ") {
                    cmds.push(c);
                } else if continued {
                    cmds.push(l);
                } else {
                    continue;
                }
                continued = l.trim_end().ends_with('\\');
            }
            cmds.join("\n")
        } else {
            body.join("\n")
        };
        let before = if start > 0 {
            lines[start - 1].trim()
        } else {
            ""
        };
        let not_run = before.strip_prefix(MARKER).map(|rest| {
            rest.strip_suffix("-->")
                .map(|r| r.trim().to_string())
                .unwrap_or_default()
        });
        out.push(Block {
            file: file.to_string(),
            line: start + 1,
            script: script + "\n",
            not_run,
        });
    }
    out
}

/// README.md and every docs/**/*.md, in a stable order.
fn markdown_files() -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let root = repo();
    let mut files = Vec::new();
    walk(&root.join("docs"), &root, &mut files);
    files.sort();
    files.insert(0, "README.md".to_string());
    files
}

/// Whether `tool` is an executable on PATH.
fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .any(|d| d.join(tool).is_file())
}

/// The corpus root: `$GPULEDGER_CORPUS`, else `<repo>/../shared/fixtures`.
fn corpus_dir() -> PathBuf {
    std::env::var_os("GPULEDGER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared/fixtures"))
}

/// `gpuledger serve --config gpuledger.toml` on a free port in `dir`; returns it with the
/// base URL of its start-up line.
fn serve(dir: &Path) -> (Server, String) {
    let mut child = bin()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            "gpuledger.toml",
        ])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().rsplit(' ').next().unwrap_or("").to_string();
    assert!(
        url.starts_with("https://127.0.0.1:"),
        "serve did not start: {line:?}; {}",
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    );
    (Server(child), url)
}

/// The folder every block's folder is copied from, and what the blocks' environment names.
struct Prepared {
    dir: PathBuf,
    token: String,
}

fn prepare(corpus: &Path) -> Prepared {
    let dir = tempdir("docs", "prepared");
    // HTTPS: a self-signed certificate for 127.0.0.1, which curl trusts through CURL_CA_BUNDLE.
    run_ok(
        Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=localhost"])
            .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
            .arg("-keyout")
            .arg(dir.join("tls.key"))
            .arg("-out")
            .arg(dir.join("tls.crt")),
    );
    let scrape =
        std::fs::read_to_string(corpus.join("dcgm/aws-kops-nvidia-l4-full-scrape.prom")).unwrap();
    let endpoint = serve_file(scrape);
    std::fs::write(
        dir.join("gpuledger.toml"),
        format!(
            "# What the examples' gpuledger.toml holds in the docs test.\n\
             [server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n\n\
             [[collectors]]\ntype = \"dcgm\"\nname = \"dcgm-lab\"\nendpoints = [\"{endpoint}\"]\n",
            dir.join("tls.crt").display(),
            dir.join("tls.key").display()
        ),
    )
    .unwrap();
    run_ok(
        bin()
            .args(["demo", "--load-only", "--days", "2", "--database-url"])
            .arg(dir.join("gpuledger.db")),
    );
    let create = |args: &[&str]| {
        let out = run_ok(bin().args(["token", "create"]).args(args).current_dir(&dir));
        out.lines().last().unwrap().trim().to_string()
    };
    let token = create(&["--source", "nlp-cron", "--team", "nlp"]);
    // The docs rotate and revoke token 7: more sources, until it exists.
    let has_7 = || {
        run_ok(bin().args(["token", "list", "--json"]).current_dir(&dir))
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .any(|t| t["id"] == 7 && t["state"] == "active")
    };
    for n in 1.. {
        if has_7() {
            break;
        }
        assert!(n <= 7, "no active token 7");
        create(&["--source", &format!("lab-{n}")]);
    }
    // A FOCUS export with GPU lines for two demo hosts (yesterday), plain and gzip.
    let day = (chrono::Utc::now() - chrono::Duration::days(1)).format("%Y-%m-%d 00:00:00");
    let focus = format!(
        "BillingPeriodStart,ChargePeriodStart,BilledCost,EffectiveCost,ResourceId,ChargeDescription,ServiceName,ProviderName\n\
         x,{day},2359.68,1500.00,arn:aws:ec2:us-east-1:1:instance/ip-10-1-0-01,$98.32 per On Demand Linux p5.48xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
         x,{day},786.54,786.54,ip-10-1-0-02,$98.32 per On Demand Linux p5.48xlarge Instance Hour,Amazon Elastic Compute Cloud,AWS\n\
         x,{day},0.20,0.20,ip-10-1-0-01,$0.09 per GB data transfer out,Amazon Elastic Compute Cloud,AWS\n"
    );
    std::fs::write(dir.join("focus-2026-11.csv"), &focus).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(focus.as_bytes()).unwrap();
    std::fs::write(dir.join("focus-2026-11.csv.gz"), gz.finish().unwrap()).unwrap();
    // PATH: the binary under test and a stand-in nvidia-smi.
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gpuledger"), bin_dir.join("gpuledger")).unwrap();
    let smi = bin_dir.join("nvidia-smi");
    std::fs::write(
        &smi,
        format!(
            "#!/bin/sh\n# A stand-in GPU host: the corpus Tesla T4.\n\
             case \"$1\" in\n  -q) cat '{}' ;;\n  *) echo \"nvidia-smi (test stand-in): unsupported: $*\" >&2; exit 9 ;;\nesac\n",
            corpus.join("nvidia-smi/tesla-t4.xml").display()
        ),
    )
    .unwrap();
    run_ok(Command::new("chmod").arg("+x").arg(&smi));
    Prepared { dir, token }
}

/// A fresh folder for one block: a copy of the prepared one, `./target/release/gpuledger`
/// and `deploy/`.
fn block_dir(prepared: &Path, n: usize) -> PathBuf {
    let dir = prepared.with_file_name(format!(
        "{}-block{n}",
        prepared.file_name().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("target/release")).unwrap();
    for e in std::fs::read_dir(prepared).unwrap().flatten() {
        if e.path().is_file() {
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_gpuledger"),
        dir.join("target/release/gpuledger"),
    )
    .unwrap();
    std::os::unix::fs::symlink(repo().join("deploy"), dir.join("deploy")).unwrap();
    dir
}

struct Outcome {
    ok: bool,
    status: String,
    stdout: String,
    stderr: String,
}

/// Run `script` with `bash -euo pipefail` in `dir`, in a process group of its own that is
/// killed afterwards (a server a block started in the background goes with it).
fn run_block(dir: &Path, script: &str, bin_dir: &Path, env: &[(&str, String)]) -> Outcome {
    std::fs::write(dir.join("block.sh"), script).unwrap();
    let (out, err) = (dir.join("block.stdout"), dir.join("block.stderr"));
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "block.sh"])
        .current_dir(dir)
        .env_remove("GPULEDGER_DATABASE_URL")
        .env_remove("GPULEDGER_CONFIG")
        .env_remove("GPULEDGER_SERVER")
        .env_remove("GPULEDGER_TOKEN_FILE")
        .env("PATH", path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let started = Instant::now();
    let (ok, status) = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break (s.success(), s.to_string());
        }
        if started.elapsed() > BLOCK_LIMIT {
            break (
                false,
                format!("still running after {} s", BLOCK_LIMIT.as_secs()),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    Outcome {
        ok,
        status,
        stdout: std::fs::read_to_string(out).unwrap_or_default(),
        stderr: std::fs::read_to_string(err).unwrap_or_default(),
    }
}

/// The last `n` characters of `s`.
fn tail(s: &str, n: usize) -> &str {
    let cut = s.len().saturating_sub(n);
    let cut = (cut..=s.len()).find(|&i| s.is_char_boundary(i)).unwrap();
    &s[cut..]
}

#[derive(Default)]
struct Tally {
    run: usize,
    failed: usize,
    skipped: usize,
    not_run: Vec<(usize, String)>,
}

#[test]
fn every_shell_example_in_the_docs_runs_or_says_why_not() {
    for tool in ["bash", "curl", "jq", "openssl"] {
        assert!(
            on_path(tool),
            "`{tool}` is not on PATH: the docs' examples need it (Debian package `{tool}`; scripts/test.sh installs it)"
        );
    }
    let root = repo();
    let mut all = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(root.join(&file)).unwrap();
        all.extend(blocks(&file, &text));
    }
    let mut failures = Vec::new();
    for b in &all {
        if b.not_run.as_deref() == Some("") {
            failures.push(format!(
                "{}:{}: marked not run without a reason; write `{MARKER} REASON -->`",
                b.file, b.line
            ));
        }
    }

    let corpus = corpus_dir();
    let have_corpus = corpus.join("nvidia-smi").is_dir() && corpus.join("dcgm").is_dir();
    if !have_corpus {
        assert!(
            std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_none(),
            "GPULEDGER_REQUIRE_CORPUS is set but there is no corpus at {}; set GPULEDGER_CORPUS to the fixtures folder",
            corpus.display()
        );
    }
    let pg = std::env::var("GPULEDGER_TEST_PG_URL").is_ok();
    let prepared = have_corpus.then(|| prepare(&corpus));

    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    for (n, b) in all.iter().enumerate() {
        let t = tally.entry(b.file.clone()).or_default();
        if let Some(reason) = &b.not_run {
            t.not_run.push((b.line, reason.clone()));
            continue;
        }
        let Some(prepared) = &prepared else {
            eprintln!(
                "skipped: {}:{} (no corpus at {})",
                b.file,
                b.line,
                corpus.display()
            );
            t.skipped += 1;
            continue;
        };
        if b.script.contains("127.0.0.1:5432") && !pg {
            assert!(
                std::env::var_os("GPULEDGER_REQUIRE_POSTGRES").is_none(),
                "GPULEDGER_REQUIRE_POSTGRES is set but GPULEDGER_TEST_PG_URL is not ({}:{} needs PostgreSQL on 127.0.0.1:5432)",
                b.file,
                b.line
            );
            eprintln!(
                "skipped: {}:{} (needs PostgreSQL on 127.0.0.1:5432: set GPULEDGER_TEST_PG_URL)",
                b.file, b.line
            );
            t.skipped += 1;
            continue;
        }
        if b.script.contains("127.0.0.1:8080") {
            // The block serves there itself; a server already there would answer instead.
            assert!(
                std::net::TcpListener::bind("0.0.0.0:8080").is_ok(),
                "{}:{} serves on port 8080, which another process holds",
                b.file,
                b.line
            );
        }
        let dir = block_dir(&prepared.dir, n);
        let (server, url) = serve(&dir);
        let env = [
            ("GPULEDGER_URL", url),
            ("GPULEDGER_TOKEN", prepared.token.clone()),
            (
                "CURL_CA_BUNDLE",
                prepared.dir.join("tls.crt").display().to_string(),
            ),
        ];
        let started = Instant::now();
        let o = run_block(&dir, &b.script, &prepared.dir.join("bin"), &env);
        drop(server);
        eprintln!(
            "{}:{}: {} in {:.1} s",
            b.file,
            b.line,
            if o.ok { "ok" } else { "FAILED" },
            started.elapsed().as_secs_f64()
        );
        if o.ok {
            t.run += 1;
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            t.failed += 1;
            failures.push(format!(
                "{}:{}: the block failed ({}) in {}\n--- block\n{}--- stdout (end)\n{}\n--- stderr (end)\n{}",
                b.file,
                b.line,
                o.status,
                dir.display(),
                b.script,
                tail(&o.stdout, 3000),
                tail(&o.stderr, 3000)
            ));
        }
    }

    let mut summary = String::from("docs examples: blocks run / marked not run, per file\n");
    for (file, t) in &tally {
        let mut line = format!("{file}: {} run, {} not run", t.run, t.not_run.len());
        for (n, what) in [(t.failed, "FAILED"), (t.skipped, "skipped")] {
            if n > 0 {
                line += &format!(", {n} {what}");
            }
        }
        summary += &line;
        summary.push('\n');
        for (line, reason) in &t.not_run {
            summary += &format!("    {file}:{line} not run: {reason}\n");
        }
    }
    println!("{summary}");
    if failures.is_empty() {
        if let Some(prepared) = &prepared {
            let _ = std::fs::remove_dir_all(&prepared.dir);
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\n{summary}\nA shell block in the docs runs in this test unless the line just before its fence says why not: `{MARKER} REASON -->` (docs/testing.md).",
        failures.join("\n\n")
    );
}
