//! Parsing `nvidia-smi -L`: the only nvidia-smi output that names MIG instances by their
//! `MIG-…` UUID and profile (`-q -x` gives neither, `--query-gpu` does not list instances).
//!
//! ```text
//! GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-…)
//!   MIG 1g.10gb     Device  0: (UUID: MIG-…)
//!   MIG 3g.40gb     Device  1: (UUID: MIG-…)
//! ```

/// One MIG instance as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedMig {
    /// The MIG device index on its GPU (`<mig_device><index>` in `-q -x`).
    pub index: u32,
    pub profile: String,
    pub uuid: String,
}

/// One physical GPU as listed, with its MIG instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGpu {
    pub uuid: String,
    pub name: String,
    pub migs: Vec<ListedMig>,
}

/// The UUID in `(UUID: X)`, if the line has one.
fn uuid_in(line: &str) -> Option<&str> {
    let start = line.find("(UUID:")? + "(UUID:".len();
    let rest = &line[start..];
    let end = rest.find(')')?;
    let uuid = rest[..end].trim();
    (!uuid.is_empty()).then_some(uuid)
}

/// Parse `nvidia-smi -L`. Lines that do not match are ignored; a MIG line before any GPU line
/// has no parent and is dropped.
pub fn parse(text: &str) -> Vec<ListedGpu> {
    let mut out: Vec<ListedGpu> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("GPU ") {
            let Some(uuid) = uuid_in(t) else { continue };
            let name = rest
                .split_once(':')
                .map(|(_, n)| n)
                .unwrap_or_default()
                .split("(UUID:")
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            out.push(ListedGpu {
                uuid: uuid.to_string(),
                name,
                migs: Vec::new(),
            });
        } else if let Some(rest) = t.strip_prefix("MIG ") {
            let (Some(uuid), Some(gpu)) = (uuid_in(t), out.last_mut()) else {
                continue;
            };
            let Some((profile, after)) = rest.split_once("Device") else {
                continue;
            };
            let Some(index) = after
                .split(':')
                .next()
                .and_then(|i| i.trim().parse::<u32>().ok())
            else {
                continue;
            };
            gpu.migs.push(ListedMig {
                index,
                profile: profile.trim().to_string(),
                uuid: uuid.to_string(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // The layout of `nvidia-smi -L` on a MIG-enabled A100 as shown in NVIDIA's MIG user guide;
    // UUIDs made up for this test.
    const LIST: &str = "\
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)
  MIG 1g.10gb     Device  0: (UUID: MIG-11111111-2222-5333-8444-555555555555)
  MIG 1c.3g.40gb  Device  1: (UUID: MIG-66666666-7777-5888-9999-aaaaaaaaaaaa)
GPU 1: Tesla T4 (UUID: GPU-d37e67a5-91dd-3774-a5cb-99096249601a)
";

    #[test]
    fn gpus_and_mig_instances_with_profiles() {
        let l = parse(LIST);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].name, "NVIDIA A100-SXM4-80GB");
        assert_eq!(l[0].uuid, "GPU-513536b6-7d19-9063-b049-1e69664bb298");
        assert_eq!(
            l[0].migs,
            vec![
                ListedMig {
                    index: 0,
                    profile: "1g.10gb".into(),
                    uuid: "MIG-11111111-2222-5333-8444-555555555555".into()
                },
                ListedMig {
                    index: 1,
                    profile: "1c.3g.40gb".into(),
                    uuid: "MIG-66666666-7777-5888-9999-aaaaaaaaaaaa".into()
                }
            ]
        );
        assert_eq!(l[1].name, "Tesla T4");
        assert!(l[1].migs.is_empty());
    }

    #[test]
    fn junk_is_ignored() {
        assert!(parse("No devices were found\n").is_empty());
        assert!(parse("  MIG 1g.5gb Device 0: (UUID: MIG-x)\nGPU 0: x (UUID: )").is_empty());
    }
}
