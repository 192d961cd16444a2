//! What the binary's integration tests share: the binary itself, a server process that is
//! killed when dropped, a throwaway folder, a file served over HTTP.
//!
//! Each test file includes this module and uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The `gpuledger` binary, without the environment that would point it elsewhere.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuledger"));
    c.env_remove("GPULEDGER_DATABASE_URL")
        .env_remove("GPULEDGER_CONFIG");
    c
}

/// An empty folder for one test: `gpuledger-<kind>-<name>-<pid>` in the temp directory.
pub fn tempdir(kind: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuledger-{kind}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A server process, killed when dropped.
pub struct Server(pub Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `gpuledger serve` on a free port in `dir` with `extra` arguments and `env`; returns it
/// with the base URL its start-up line gives (`http://` or, with TLS configured, `https://`).
pub fn serve_in(dir: &Path, extra: &[&str], env: &[(&str, String)]) -> (Server, String) {
    let mut child = bin()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("serving on"), "serve did not start: {line:?}");
    let url = line.trim().rsplit(' ').next().unwrap().to_string();
    (Server(child), url)
}

/// `gpuledger token create ARGS` in `dir`: the token it prints.
pub fn token(dir: &Path, args: &[&str]) -> String {
    let out = bin()
        .args(["token", "create"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout.lines().last().unwrap().trim().to_string()
}

/// Serve one file over HTTP on a free port from a thread, for as long as the test runs; the
/// URL ends in `/metrics`.
pub fn serve_file(body: String) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}/metrics")
}
