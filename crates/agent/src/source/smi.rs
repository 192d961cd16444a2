//! Running a vendor's tool (`nvidia-smi`, `amd-smi`, `rocm-smi`, `hl-smi`): a bounded wait and a
//! bounded output, so a hung driver call can neither stall the agent forever nor grow its memory.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::SourceError;

/// Output beyond this is cut off; `nvidia-smi -q -x` for 8 GPUs with many processes is well
/// under 1 MiB, and so is `amd-smi static --json` for 8 GPUs.
const MAX_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;
const MAX_STDERR_BYTES: u64 = 64 * 1024;

/// How to run one tool.
#[derive(Debug, Clone)]
pub struct Smi {
    /// The program: a name looked up on PATH (`nvidia-smi`) or a full path.
    pub program: PathBuf,
    /// Longest a run may take before it is killed.
    pub timeout: Duration,
    /// The agent flag that names the program, for error messages (`--nvidia-smi`).
    pub flag: &'static str,
}

impl Default for Smi {
    /// `nvidia-smi` on PATH.
    fn default() -> Self {
        Smi::new("nvidia-smi", "--nvidia-smi")
    }
}

impl Smi {
    /// `program` (a name on PATH or a path), named by the agent flag `flag`, with the default
    /// timeout of 20 s.
    pub fn new(program: impl Into<PathBuf>, flag: &'static str) -> Smi {
        Smi {
            program: program.into(),
            timeout: Duration::from_secs(20),
            flag,
        }
    }

    fn command_line(&self, args: &[&str]) -> String {
        let mut s = self.program.display().to_string();
        for a in args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }

    /// Run with `args` and return stdout, or say why not.
    pub fn run(&self, args: &[&str]) -> Result<String, SourceError> {
        let cmd = self.command_line(args);
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => SourceError::NotInstalled {
                    program: self.program.display().to_string(),
                    flag: self.flag,
                },
                _ => SourceError::Command {
                    cmd: cmd.clone(),
                    reason: e.to_string(),
                    flag: self.flag,
                },
            })?;
        let stdout = child.stdout.take();
        // Read stdout on a helper thread so that a large output cannot fill the pipe and block
        // the child while this thread waits for it to exit.
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(out) = stdout {
                let _ = out.take(MAX_OUTPUT_BYTES).read_to_end(&mut buf);
            }
            buf
        });
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() >= self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = reader.join();
                    return Err(SourceError::Command {
                        cmd,
                        reason: format!(
                            "did not finish within {} s and was stopped",
                            self.timeout.as_secs()
                        ),
                        flag: self.flag,
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => {
                    let _ = child.kill();
                    return Err(SourceError::Command {
                        cmd,
                        reason: e.to_string(),
                        flag: self.flag,
                    });
                }
            }
        };
        let out = reader.join().unwrap_or_default();
        let out = String::from_utf8_lossy(&out).into_owned();
        if !status.success() {
            let mut err = String::new();
            if let Some(e) = child.stderr.take() {
                let _ = e.take(MAX_STDERR_BYTES).read_to_string(&mut err);
            }
            let text = if err.trim().is_empty() { &out } else { &err };
            let text: String = text.trim().chars().take(500).collect();
            return Err(SourceError::Exit {
                cmd,
                status: status.to_string(),
                stderr: text,
            });
        }
        Ok(out)
    }
}
