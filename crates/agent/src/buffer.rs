//! The disk buffer: every body is written here before it is sent and removed only when the
//! server has acknowledged it, so an outage, a crash or a restart loses nothing that was read.
//!
//! One body per file, named by a sequence number (`00000001099511627776.json`), plain JSON so an
//! operator can read exactly what is waiting. Files are written to a temporary name and renamed,
//! so a crash never leaves half a body. The total size is capped; over the cap the oldest bodies
//! are dropped first, counted and logged. Memory holds only the list of sequence numbers and
//! sizes (16 bytes a body), never the bodies themselves.

use std::collections::VecDeque;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Sequence numbers start here so that [`Queue::push_front`] has room below the first body.
const FIRST_SEQ: u64 = 1 << 40;

/// A bounded, ordered, on-disk queue of bodies.
#[derive(Debug)]
pub struct Queue {
    dir: PathBuf,
    max_bytes: u64,
    /// (sequence number, size in bytes), oldest first.
    entries: VecDeque<(u64, u64)>,
    total_bytes: u64,
    next_seq: u64,
    dropped: u64,
}

/// Why the buffer directory cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("buffer directory {dir}: {source}; pass --buffer-dir to a directory the agent's user can write (the systemd unit uses StateDirectory=, the DaemonSet an emptyDir or hostPath)")]
pub struct BufferError {
    pub dir: String,
    #[source]
    pub source: io::Error,
}

fn file_name(seq: u64) -> String {
    format!("{seq:020}.json")
}

fn seq_of(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".json")?;
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .then(|| stem.parse().ok())
        .flatten()
}

impl Queue {
    /// Open (creating) the queue in `dir`, picking up bodies a previous run left.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Queue, BufferError> {
        let dir = dir.into();
        let err = |source| BufferError {
            dir: dir.display().to_string(),
            source,
        };
        // Only the agent's user reads what it buffers.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(err)?;
        let mut entries = Vec::new();
        for entry in fs::read_dir(&dir).map_err(err)? {
            let entry = entry.map_err(err)?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                // A write that a crash interrupted; its body was never acknowledged as queued.
                let _ = fs::remove_file(entry.path());
                continue;
            }
            if let Some(seq) = seq_of(&name) {
                let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                entries.push((seq, size));
            }
        }
        entries.sort_unstable();
        // Prove the directory is writable now rather than at the first outage.
        let probe = dir.join(".write-test.tmp");
        fs::write(&probe, b"").map_err(err)?;
        let _ = fs::remove_file(&probe);
        let next_seq = entries.last().map(|(s, _)| s + 1).unwrap_or(FIRST_SEQ);
        let mut q = Queue {
            total_bytes: entries.iter().map(|(_, s)| s).sum(),
            entries: entries.into(),
            dir,
            max_bytes,
            next_seq,
            dropped: 0,
        };
        q.enforce_cap();
        Ok(q)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Bodies dropped because the buffer was full, since this process started.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn write(&self, seq: u64, bytes: &[u8]) -> io::Result<()> {
        let path = self.dir.join(file_name(seq));
        let tmp = self.dir.join(format!("{}.tmp", file_name(seq)));
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    }

    /// Append a body at the back.
    pub fn push(&mut self, bytes: &[u8]) -> io::Result<()> {
        let seq = self.next_seq;
        self.write(seq, bytes)?;
        self.next_seq += 1;
        self.entries.push_back((seq, bytes.len() as u64));
        self.total_bytes += bytes.len() as u64;
        self.enforce_cap();
        Ok(())
    }

    /// Put a body in front of every other, to be sent next (a repair of the head body).
    pub fn push_front(&mut self, bytes: &[u8]) -> io::Result<()> {
        let seq = match self.entries.front() {
            Some((s, _)) if *s > 1 => s - 1,
            Some(_) => return self.push(bytes),
            None => self.next_seq,
        };
        self.write(seq, bytes)?;
        if self.entries.is_empty() {
            self.next_seq += 1;
        }
        self.entries.push_front((seq, bytes.len() as u64));
        self.total_bytes += bytes.len() as u64;
        Ok(())
    }

    fn enforce_cap(&mut self) {
        // The newest body always stays, even alone over the cap.
        while self.total_bytes > self.max_bytes && self.entries.len() > 1 {
            let Some((seq, size)) = self.entries.pop_front() else {
                break;
            };
            let _ = fs::remove_file(self.dir.join(file_name(seq)));
            self.total_bytes -= size;
            self.dropped += 1;
            tracing::warn!(
                dropped_total = self.dropped,
                seq,
                buffer_bytes = self.total_bytes,
                buffer_max_bytes = self.max_bytes,
                "buffer full: dropped the oldest unsent body; raise --buffer-max-mib to keep longer outages"
            );
        }
    }

    /// The oldest bodies, in order, up to `max_bytes` together (at least one) and `max_count`.
    /// A body that cannot be read is removed and logged rather than blocking the queue.
    pub fn peek(&mut self, max_bytes: u64, max_count: usize) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut bytes = 0u64;
        let mut i = 0;
        while i < self.entries.len() && out.len() < max_count.max(1) {
            let (seq, size) = self.entries[i];
            if !out.is_empty() && bytes + size > max_bytes {
                break;
            }
            match fs::read(self.dir.join(file_name(seq))) {
                Ok(b) => {
                    bytes += b.len() as u64;
                    out.push((seq, b));
                    i += 1;
                }
                Err(e) => {
                    tracing::warn!(seq, error = %e, "a buffered body could not be read; dropping it");
                    self.entries.remove(i);
                    self.total_bytes -= size;
                }
            }
        }
        out
    }

    /// Remove acknowledged bodies.
    pub fn ack(&mut self, seqs: &[u64]) {
        for seq in seqs {
            if let Some(pos) = self.entries.iter().position(|(s, _)| s == seq) {
                if let Some((_, size)) = self.entries.remove(pos) {
                    self.total_bytes -= size;
                }
                if let Err(e) = fs::remove_file(self.dir.join(file_name(*seq))) {
                    tracing::warn!(seq, error = %e, "could not remove an acknowledged body; it may be sent again (the server ignores repeats)");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("gpuledger-buffer-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn order_survives_reopen_and_acks_remove() {
        let d = dir("order");
        let mut q = Queue::open(&d, 1 << 20).unwrap();
        for i in 0..5 {
            q.push(format!("{{\"n\":{i}}}").as_bytes()).unwrap();
        }
        drop(q);
        // A crash mid-write leaves a temporary file; it is cleaned up, not sent.
        fs::write(d.join("00000000000000000001.json.tmp"), b"{").unwrap();
        let mut q = Queue::open(&d, 1 << 20).unwrap();
        assert_eq!(q.len(), 5);
        let batch = q.peek(1 << 20, 2);
        let texts: Vec<String> = batch
            .iter()
            .map(|(_, b)| String::from_utf8(b.clone()).unwrap())
            .collect();
        assert_eq!(texts, ["{\"n\":0}", "{\"n\":1}"]);
        q.ack(&batch.iter().map(|(s, _)| *s).collect::<Vec<_>>());
        assert_eq!(q.len(), 3);
        q.push_front(b"{\"fix\":1}").unwrap();
        q.push(b"{\"n\":5}").unwrap();
        let all = q.peek(1 << 20, 100);
        assert_eq!(all[0].1, b"{\"fix\":1}");
        assert_eq!(all.last().unwrap().1, b"{\"n\":5}");
        assert_eq!(all.len(), 5);
        assert!(!d.join("00000000000000000001.json.tmp").exists());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn cap_drops_oldest_first_and_counts() {
        let d = dir("cap");
        let mut q = Queue::open(&d, 100).unwrap();
        for i in 0..10 {
            q.push(format!("{i:0>30}").as_bytes()).unwrap();
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.dropped(), 7);
        assert!(q.total_bytes() <= 100);
        let first = q.peek(1000, 1);
        assert_eq!(first[0].1, format!("{:0>30}", 7).as_bytes());
        assert_eq!(fs::read_dir(&d).unwrap().count(), 3);
        // The byte budget of one batch is respected, but never below one body.
        assert_eq!(q.peek(10, 100).len(), 1);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn unwritable_directory_says_what_to_do() {
        let err = Queue::open("/proc/gpuledger-cannot-be-here", 100).unwrap_err();
        assert!(err.to_string().contains("--buffer-dir"), "{err}");
    }
}
