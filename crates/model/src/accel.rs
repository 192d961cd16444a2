//! Accelerator vendors and the identity each vendor's GPUs get in gpuledger.
//!
//! A GPU's `uuid` names its vendor by its prefix, so every source that sees the same device
//! arrives at the same identity without a lookup:
//!
//! | vendor | `uuid` | from |
//! | --- | --- | --- |
//! | `nvidia` | `GPU-…`, `MIG-…` | the UUID NVML, nvidia-smi and dcgm-exporter print |
//! | `amd` | `AMD-SN-<serial>` | the board serial (rocm-smi, amd-smi, AMD's metrics exporter) |
//! | `amd` | `AMD-UID-<hex>` | the ASIC unique ID, where the serial is unknown or masked |
//! | `amd` | `AMD-UUID-<uuid>` | the exporter's `gpu_uuid` label, where neither is given |
//! | `amd` | `AMD-PCI-<host>-<bus>` | the PCI address on its host, where nothing else is |
//! | `intel` | `HL-SN-<serial>` | a Gaudi's serial (hl-smi, the Gaudi metric exporter) |
//! | `intel` | `HL-UUID-<uuid>` | a Gaudi's UUID, where the serial is unknown |
//! | `intel` | `HL-PCI-<host>-<bus>` | the PCI address on its host, where nothing else is |
//! | `other` | `ACC-<id>` | any other accelerator, with an ID its sender keeps stable |
//!
//! The board serial comes first for AMD because the node tools and the exporter all give it;
//! the unique ID is read by the node tools only. A partition of an AMD GPU (a compute partition
//! such as CPX) is a child of its GPU the way a MIG instance is: `<parent uuid>/P<n>` with
//! `mig_parent_uuid` set to the GPU's identity and `mig_profile` naming the partition mode.

use serde::{Deserialize, Serialize};

/// Who made an accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Amd,
    Intel,
    Other,
}

impl Vendor {
    pub const ALL: [Vendor; 4] = [Vendor::Nvidia, Vendor::Amd, Vendor::Intel, Vendor::Other];

    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
            Vendor::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<Vendor> {
        Vendor::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The vendor a GPU identity names by its prefix (see the module table); `None` for a
    /// string that is no GPU identity (a placeholder, a typo).
    pub fn of_uuid(uuid: &str) -> Option<Vendor> {
        if uuid.starts_with("GPU-") || uuid.starts_with("MIG-") {
            Some(Vendor::Nvidia)
        } else if uuid.starts_with("AMD-") {
            Some(Vendor::Amd)
        } else if uuid.starts_with("HL-") {
            Some(Vendor::Intel)
        } else if uuid.starts_with("ACC-") {
            Some(Vendor::Other)
        } else {
            None
        }
    }
}

/// An identifier a tool printed that names nothing: empty, `N/A`, `0`, all zeros, or masked
/// (`xxxx`, as sites redact serials before sharing output). Such a value is unknown, and an
/// identity is never built from it.
pub fn is_usable_id(s: &str) -> bool {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    !(t.is_empty()
        || matches!(
            lower.as_str(),
            "n/a" | "na" | "none" | "null" | "unknown" | "not supported" | "[n/a]"
        )
        || lower
            .trim_start_matches("0x")
            .chars()
            .all(|c| c == '0' || c == '-')
        || lower.contains("xxxx"))
}

/// The longest identity the push API takes.
pub const MAX_IDENTITY_LEN: usize = 128;

/// `id` when it fits the push API, else `None` (a serial that long is no serial).
fn fitting(id: String) -> Option<String> {
    (id.len() <= MAX_IDENTITY_LEN).then_some(id)
}

/// FNV-1a, 64 bits: a stable short stand-in for a host name too long to keep whole.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Characters kept in an identity's free part: letters, digits, `-`, `.`, `:` and `_`;
/// anything else becomes `_`.
fn clean(s: &str) -> String {
    s.trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// An AMD GPU's identity from what a reader knows of it, best first: board serial, ASIC unique
/// ID (`0x…` or bare hex), the exporter's GPU UUID, the PCI address on `host`. `None` when
/// nothing usable is known.
pub fn amd_uuid(
    serial: Option<&str>,
    unique_id: Option<&str>,
    gpu_uuid: Option<&str>,
    host: Option<&str>,
    pci_bus_id: Option<&str>,
) -> Option<String> {
    let by_serial = serial
        .filter(|s| is_usable_id(s))
        .and_then(|s| fitting(format!("AMD-SN-{}", clean(s))));
    let by_unique_id = || {
        unique_id.filter(|s| is_usable_id(s)).and_then(|u| {
            let hex = u.trim().to_ascii_lowercase();
            fitting(format!("AMD-UID-{}", clean(hex.trim_start_matches("0x"))))
        })
    };
    let by_uuid = || {
        gpu_uuid
            .filter(|s| is_usable_id(s))
            .and_then(|u| fitting(format!("AMD-UUID-{}", clean(&u.to_ascii_lowercase()))))
    };
    by_serial
        .or_else(by_unique_id)
        .or_else(by_uuid)
        .or_else(|| pci_uuid("AMD", host, pci_bus_id))
}

/// An Intel Gaudi's identity, best first: serial, UUID, the PCI address on `host`.
pub fn gaudi_uuid(
    serial: Option<&str>,
    uuid: Option<&str>,
    host: Option<&str>,
    pci_bus_id: Option<&str>,
) -> Option<String> {
    serial
        .filter(|s| is_usable_id(s))
        .and_then(|s| fitting(format!("HL-SN-{}", clean(s))))
        .or_else(|| {
            uuid.filter(|s| is_usable_id(s))
                .and_then(|u| fitting(format!("HL-UUID-{}", clean(u))))
        })
        .or_else(|| pci_uuid("HL", host, pci_bus_id))
}

/// `<prefix>-PCI-<host>-<bus>`; a host name too long for the identity to fit is cut to 64
/// characters and followed by a hash of the whole name, so it stays one host's. `None` for a
/// bus ID too long to be one.
fn pci_uuid(prefix: &str, host: Option<&str>, bus: Option<&str>) -> Option<String> {
    let host = clean(host.filter(|h| !h.trim().is_empty())?);
    let bus = clean(&bus.filter(|b| is_usable_id(b))?.to_ascii_lowercase());
    let whole = format!("{prefix}-PCI-{host}-{bus}");
    if whole.len() <= MAX_IDENTITY_LEN {
        return Some(whole);
    }
    let cut: String = host.chars().take(64).collect();
    fitting(format!("{prefix}-PCI-{cut}_{:016x}-{bus}", fnv1a(&host)))
}

/// The identity of partition `index` of an AMD GPU (a compute partition such as CPX).
pub fn partition_uuid(parent: &str, index: u32) -> String {
    format!("{parent}/P{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_follows_the_prefix() {
        assert_eq!(Vendor::of_uuid("GPU-1"), Some(Vendor::Nvidia));
        assert_eq!(Vendor::of_uuid("MIG-GPU-1/1/0"), Some(Vendor::Nvidia));
        assert_eq!(Vendor::of_uuid("AMD-SN-692024000810"), Some(Vendor::Amd));
        assert_eq!(Vendor::of_uuid("HL-SN-AN12345"), Some(Vendor::Intel));
        assert_eq!(Vendor::of_uuid("ACC-tpu-7"), Some(Vendor::Other));
        assert_eq!(Vendor::of_uuid("placeholder:h:0"), None);
        for v in Vendor::ALL {
            assert_eq!(Vendor::parse(v.as_str()), Some(v));
        }
    }

    #[test]
    fn sentinels_and_masks_are_not_identities() {
        for s in [
            "",
            " ",
            "N/A",
            "0",
            "0x0",
            "000000",
            "xxxx",
            "TPXxxxx",
            "Not Supported",
        ] {
            assert!(!is_usable_id(s), "{s:?}");
        }
        for s in ["692024000810", "0x79ccd55167a2124a", "AN12345"] {
            assert!(is_usable_id(s), "{s:?}");
        }
    }

    #[test]
    fn amd_identity_prefers_serial_then_unique_id_then_uuid_then_pci() {
        let host = Some("node-1.example");
        let bus = Some("0000:83:00.0");
        assert_eq!(
            amd_uuid(
                Some("692024000810"),
                Some("0x2f048617326b1ea"),
                None,
                host,
                bus
            )
            .as_deref(),
            Some("AMD-SN-692024000810")
        );
        assert_eq!(
            amd_uuid(Some("N/A"), Some("0x79CCD55167A2124A"), None, host, bus).as_deref(),
            Some("AMD-UID-79ccd55167a2124a")
        );
        assert_eq!(
            amd_uuid(
                Some("0"),
                Some("N/A"),
                Some("6699C0A8-4200-4242-037F-F97E6CAE0F09"),
                None,
                None
            )
            .as_deref(),
            Some("AMD-UUID-6699c0a8-4200-4242-037f-f97e6cae0f09")
        );
        assert_eq!(
            amd_uuid(Some("0"), Some("N/A"), None, host, Some("0000:1E:00.0")).as_deref(),
            Some("AMD-PCI-node-1.example-0000:1e:00.0")
        );
        assert_eq!(amd_uuid(None, None, None, None, bus), None);
    }

    #[test]
    fn identities_fit_the_push_api() {
        let long = "7".repeat(200);
        // A serial too long to be one falls through to the next identity.
        assert_eq!(
            amd_uuid(Some(&long), Some("0x1b9dd972253c3736"), None, None, None).as_deref(),
            Some("AMD-UID-1b9dd972253c3736")
        );
        assert_eq!(gaudi_uuid(Some(&long), Some(&long), None, None), None);
        // A long host name is cut and hashed: distinct hosts stay distinct.
        let host_a = format!("{}a.example", "n".repeat(150));
        let host_b = format!("{}b.example", "n".repeat(150));
        let a = gaudi_uuid(None, None, Some(&host_a), Some("0000:9a:00.0")).unwrap();
        let b = gaudi_uuid(None, None, Some(&host_b), Some("0000:9a:00.0")).unwrap();
        assert!(
            a.len() <= MAX_IDENTITY_LEN && b.len() <= MAX_IDENTITY_LEN,
            "{a}"
        );
        assert_ne!(a, b);
        assert!(a.ends_with("-0000:9a:00.0"), "{a}");
        assert_eq!(
            amd_uuid(None, None, None, Some("h"), Some(&long)),
            None,
            "a bus ID that long is none"
        );
    }

    #[test]
    fn gaudi_identity_prefers_serial() {
        assert_eq!(
            gaudi_uuid(Some("AN12345"), Some("01P4"), None, None).as_deref(),
            Some("HL-SN-AN12345")
        );
        assert_eq!(
            gaudi_uuid(None, None, Some("gaudi-1"), Some("0000:9a:00.0")).as_deref(),
            Some("HL-PCI-gaudi-1-0000:9a:00.0")
        );
        assert_eq!(partition_uuid("AMD-SN-1", 3), "AMD-SN-1/P3".to_string());
    }
}
