//! What the two AMD readers ([`super::amd_smi`], [`super::rocm_smi`]) share: a device as a tool
//! describes it, and how devices become readings with gpuledger identities.
//!
//! Identities come from `gpuledger_model::accel::amd_uuid` only: board serial first, then the
//! ASIC unique ID, then the PCI address on this host. Both tools print the same serial and
//! unique ID for a device, so a host read by `amd-smi` one day and `rocm-smi` the next keeps its
//! GPUs. A serial or ID that is `N/A`, `0` or masked (`TPXxxxx`) is unknown, never an identity.
//!
//! A GPU split into compute partitions (MI300's CPX, DPX, ...) is listed once per partition,
//! every partition with the GPU's serial. Those become one parent GPU (the serial's identity,
//! inventory only) and a child per partition, `<parent>/P<n>` with `mig_parent_uuid` set, the way
//! MIG instances are children of an NVIDIA GPU.

use std::collections::BTreeMap;

use gpuledger_model::accel::{amd_uuid, partition_uuid};

use super::{sanitize, GpuReading};

/// One AMD device as a tool described it, before it has an identity.
#[derive(Debug, Clone, Default)]
pub struct AmdDevice {
    /// The tool's index of the device (`card<N>` of rocm-smi, `gpu` of amd-smi); process lists
    /// name devices by it.
    pub index: u32,
    /// The ASIC unique ID (rocm-smi `Unique ID`, amd-smi `asic_serial`).
    pub unique_id: Option<String>,
    /// The partition's number, when the tool says.
    pub partition_id: Option<u32>,
    /// The compute partition mode (`SPX`, `DPX`, `CPX`, ...), when the tool says.
    pub partition_mode: Option<String>,
    /// Everything else. `uuid` is left empty here; `serial` and `pci_bus_id` feed the identity.
    pub reading: GpuReading,
}

/// Readings with identities, and each tool index's identity (for processes). A device with no
/// usable serial, unique ID or PCI address (or a PCI address but no host name) cannot be told
/// apart from others and is left out, with a warning naming `what` read it.
pub fn identify(
    devices: Vec<AmdDevice>,
    host: Option<&str>,
    what: &str,
) -> (Vec<GpuReading>, BTreeMap<u32, String>) {
    // Devices grouped by their GPU's identity, in the order the tool listed them.
    let mut groups: Vec<(String, Vec<AmdDevice>)> = Vec::new();
    for d in devices {
        let Some(base) = amd_uuid(
            d.reading.serial.as_deref(),
            d.unique_id.as_deref(),
            None,
            host,
            d.reading.pci_bus_id.as_deref(),
        ) else {
            tracing::warn!(
                source = what,
                index = d.index,
                "an AMD GPU has no usable serial, unique ID or PCI address (or the host name is \
                 unknown); it is not reported, as it could not be told apart from others"
            );
            continue;
        };
        match groups.iter_mut().find(|(b, _)| *b == base) {
            Some((_, members)) => members.push(d),
            None => groups.push((base, vec![d])),
        }
    }

    let mut out = Vec::new();
    let mut by_index = BTreeMap::new();
    for (base, mut members) in groups {
        let partitioned = members.len() > 1
            || members.iter().any(|d| {
                d.partition_id.is_some_and(|p| p > 0)
                    || d.partition_mode
                        .as_deref()
                        .is_some_and(|m| !m.eq_ignore_ascii_case("SPX"))
            });
        if !partitioned {
            let mut d = members.remove(0);
            d.reading.uuid = base.clone();
            sanitize(&mut d.reading);
            by_index.insert(d.index, base);
            out.push(d.reading);
            continue;
        }
        // Partition numbers as the tool gave them when every member has a distinct one;
        // otherwise the order of listing.
        let mut ids: Vec<Option<u32>> = members.iter().map(|d| d.partition_id).collect();
        ids.sort();
        ids.dedup();
        let distinct = ids.len() == members.len() && ids.iter().all(Option::is_some);
        if distinct {
            members.sort_by_key(|d| d.partition_id);
        }
        let first = &members[0].reading;
        let mut parent = GpuReading {
            uuid: base.clone(),
            model: first.model.clone(),
            serial: first.serial.clone(),
            pci_bus_id: first.pci_bus_id.clone(),
            driver_version: first.driver_version.clone(),
            card_vendor: first.card_vendor.clone(),
            // Whether a partition's VRAM figure is the GPU's or its share depends on the memory
            // partition mode: the GPU's total is unknown.
            memory_mib: None,
            ..Default::default()
        };
        sanitize(&mut parent);
        out.push(parent);
        for (position, d) in members.into_iter().enumerate() {
            let n = if distinct {
                d.partition_id.unwrap_or(position as u32)
            } else {
                position as u32
            };
            let mut child = d.reading;
            child.uuid = partition_uuid(&base, n);
            child.mig_parent_uuid = Some(base.clone());
            child.mig_profile = d.partition_mode.clone();
            // The serial is the GPU's, not the partition's.
            child.serial = None;
            sanitize(&mut child);
            by_index.insert(d.index, child.uuid.clone());
            out.push(child);
        }
    }
    (out, by_index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::usable_id;

    fn device(index: u32, serial: &str, bus: &str, util: f64) -> AmdDevice {
        AmdDevice {
            index,
            reading: GpuReading {
                serial: usable_id(serial),
                pci_bus_id: usable_id(bus),
                model: Some("AMD Instinct MI300X".into()),
                memory_mib: Some(196_592),
                util_pct: Some(util),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn serial_then_unique_id_then_pci_and_nothing_without_a_host() {
        let mut a = device(0, "692024000810", "0000:63:00.0", 1.0);
        a.unique_id = Some("0x2f048617326b1ea".into());
        let mut b = device(1, "N/A", "0000:83:00.0", 2.0);
        b.unique_id = usable_id("0x79CCD55167A2124A");
        let c = device(2, "0", "0000:1E:00.0", 3.0);
        let (gpus, idx) = identify(vec![a, b, c.clone()], Some("node-1"), "test");
        let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(
            uuids,
            [
                "AMD-SN-692024000810",
                "AMD-UID-79ccd55167a2124a",
                "AMD-PCI-node-1-0000:1e:00.0"
            ]
        );
        assert_eq!(idx[&1], "AMD-UID-79ccd55167a2124a");
        let (gpus, idx) = identify(vec![c], None, "test");
        assert!(gpus.is_empty() && idx.is_empty());
    }

    #[test]
    fn partitions_of_one_gpu_become_children_of_it() {
        let mut parts: Vec<AmdDevice> = (0..4)
            .map(|i| {
                let mut d = device(i, "692024000810", &format!("0000:0{i}:00.0"), i as f64);
                d.partition_id = Some(3 - i);
                d.partition_mode = Some("CPX".into());
                d
            })
            .collect();
        parts.push(device(9, "SERIAL-B", "0000:63:00.0", 50.0));
        let (gpus, idx) = identify(parts, Some("h"), "test");
        assert_eq!(gpus.len(), 6);
        let parent = &gpus[0];
        assert_eq!(parent.uuid, "AMD-SN-692024000810");
        assert_eq!(parent.serial.as_deref(), Some("692024000810"));
        assert_eq!((parent.memory_mib, parent.util_pct), (None, None));
        // Ordered by partition number; tool index 3 is partition 0.
        assert_eq!(gpus[1].uuid, "AMD-SN-692024000810/P0");
        assert_eq!(gpus[1].util_pct, Some(3.0));
        assert_eq!(
            gpus[1].mig_parent_uuid.as_deref(),
            Some("AMD-SN-692024000810")
        );
        assert_eq!(gpus[1].mig_profile.as_deref(), Some("CPX"));
        assert_eq!(gpus[1].serial, None);
        assert_eq!(idx[&0], "AMD-SN-692024000810/P3");
        assert_eq!(gpus[5].uuid, "AMD-SN-SERIAL-B");
        assert_eq!(gpus[5].mig_parent_uuid, None);
    }
}
