//! Parsing `nvidia-smi -q -x` (DTD v11 to v13) into a [`Snapshot`].
//!
//! The XML is read into a small element tree first and then walked by name, so schema
//! differences between driver versions (`power_readings` vs `gpu_power_readings`, `power_draw` vs
//! `average_power_draw`) are lookups with fallbacks rather than separate parsers.
//!
//! MIG instances in `-q -x` carry neither a UUID nor a profile. When `nvidia-smi -L` was read
//! too, its `MIG-…` UUIDs and profiles are matched by MIG device index; otherwise an instance is
//! named in NVIDIA's older form `MIG-<GPU UUID>/<GPU instance id>/<compute instance id>`, which is
//! stable for as long as the instance exists, and its profile stays unknown.

use quick_xml::events::Event;
use quick_xml::Reader;

use super::smi_list::ListedGpu;
use super::SourceError;
use super::{known, known_string, number, sanitize, GpuReading, ProcessReading, Snapshot};

/// Deeper nesting than this is not nvidia-smi output.
const MAX_DEPTH: usize = 32;
/// More elements than this is not nvidia-smi output either (8 GPUs are about 4,000).
const MAX_ELEMENTS: usize = 500_000;

/// An XML element: its name, attributes, text and children.
#[derive(Debug, Default)]
struct Node {
    name: String,
    attrs: Vec<(String, String)>,
    text: String,
    children: Vec<Node>,
}

impl Node {
    fn child(&self, name: &str) -> Option<&Node> {
        self.children.iter().find(|c| c.name == name)
    }

    fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Node> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The text at a path of child names.
    fn at(&self, path: &[&str]) -> Option<&str> {
        let mut n = self;
        for p in path {
            n = n.child(p)?;
        }
        Some(n.text.as_str())
    }

    /// The first number among several paths (schema versions name things differently).
    fn first_number(&self, paths: &[&[&str]]) -> Option<f64> {
        paths.iter().find_map(|p| self.at(p).and_then(number))
    }

    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn parse_error(reason: impl Into<String>) -> SourceError {
    SourceError::Parse {
        what: "nvidia-smi -q -x",
        reason: reason.into(),
    }
}

fn predefined_entity(name: &str) -> Option<char> {
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        _ => return None,
    })
}

/// Read the document into a tree rooted at an unnamed node.
fn tree(xml: &str) -> Result<Node, SourceError> {
    let mut reader = Reader::from_str(xml);
    let mut stack: Vec<Node> = vec![Node::default()];
    let mut elements = 0usize;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| parse_error(format!("at byte {}: {e}", reader.buffer_position())))?;
        match event {
            Event::Start(e) => {
                if stack.len() > MAX_DEPTH {
                    return Err(parse_error(format!(
                        "elements nested deeper than {MAX_DEPTH}"
                    )));
                }
                elements += 1;
                if elements > MAX_ELEMENTS {
                    return Err(parse_error(format!("more than {MAX_ELEMENTS} elements")));
                }
                let mut node = Node {
                    name: e.local_name().as_ref().to_string(),
                    ..Default::default()
                };
                for a in e.attributes().flatten() {
                    let key = a.key.local_name().as_ref().to_string();
                    let value = a.value.to_string();
                    node.attrs.push((key, value));
                }
                stack.push(node);
            }
            Event::Empty(e) => {
                elements += 1;
                let node = Node {
                    name: e.local_name().as_ref().to_string(),
                    ..Default::default()
                };
                if let Some(parent) = stack.last_mut() {
                    parent.children.push(node);
                }
            }
            Event::End(_) => {
                if stack.len() < 2 {
                    return Err(parse_error("a closing tag without an opening one"));
                }
                let node = stack.pop().unwrap_or_default();
                if let Some(parent) = stack.last_mut() {
                    parent.children.push(node);
                }
            }
            Event::Text(t) => {
                if let Some(n) = stack.last_mut() {
                    n.text.push_str(t.as_ref());
                }
            }
            Event::CData(t) => {
                if let Some(n) = stack.last_mut() {
                    n.text.push_str(t.as_ref());
                }
            }
            Event::GeneralRef(r) => {
                let name = r.as_ref().to_string();
                let ch = match r.resolve_char_ref() {
                    Ok(Some(c)) => Some(c),
                    _ => predefined_entity(&name),
                };
                if let (Some(c), Some(n)) = (ch, stack.last_mut()) {
                    n.text.push(c);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if stack.len() != 1 {
        return Err(parse_error("the document ends inside an element"));
    }
    Ok(stack.pop().unwrap_or_default())
}

fn mib(n: &Node, path: &[&str]) -> Option<u64> {
    n.at(path)
        .and_then(number)
        .filter(|v| *v >= 0.0)
        .map(|v| v.round() as u64)
}

fn id(n: &Node, name: &str) -> Option<u32> {
    n.at(&[name])
        .and_then(known)
        .and_then(|t| t.parse::<u32>().ok())
}

/// Parse `nvidia-smi -q -x` output. `listed` is `nvidia-smi -L` output, when it was read, to name
/// MIG instances by UUID and profile.
pub fn parse(xml: &str, listed: &[ListedGpu]) -> Result<Snapshot, SourceError> {
    let root = tree(xml)?;
    let log = root.child("nvidia_smi_log").ok_or_else(|| {
        parse_error("no <nvidia_smi_log> element; is this `nvidia-smi -q -x` output?")
    })?;
    let driver = log.at(&["driver_version"]).and_then(known_string);
    let cuda = log.at(&["cuda_version"]).and_then(known_string);
    let mut snap = Snapshot::default();
    for gpu in log.children("gpu") {
        let Some(uuid) = gpu.at(&["uuid"]).and_then(known) else {
            tracing::warn!(
                pci_bus_id = gpu.attr("id").unwrap_or("?"),
                "nvidia-smi listed a GPU without a UUID; skipping it"
            );
            continue;
        };
        let model = gpu.at(&["product_name"]).and_then(known_string);
        let mig_enabled = match gpu.at(&["mig_mode", "current_mig"]).and_then(known) {
            Some(m) if m.eq_ignore_ascii_case("enabled") => Some(true),
            Some(m) if m.eq_ignore_ascii_case("disabled") => Some(false),
            _ => None,
        };
        let mut reading = GpuReading {
            uuid: uuid.to_string(),
            model: model.clone(),
            memory_mib: mib(gpu, &["fb_memory_usage", "total"]),
            serial: gpu.at(&["serial"]).and_then(known_string),
            pci_bus_id: gpu
                .at(&["pci", "pci_bus_id"])
                .and_then(known_string)
                .or_else(|| gpu.attr("id").and_then(known_string)),
            driver_version: driver.clone(),
            cuda_version: cuda.clone(),
            mig_enabled,
            util_pct: gpu.first_number(&[&["utilization", "gpu_util"]]),
            mem_used_mib: gpu.first_number(&[&["fb_memory_usage", "used"]]),
            power_w: gpu.first_number(&[
                &["power_readings", "power_draw"],
                &["gpu_power_readings", "power_draw"],
                &["gpu_power_readings", "average_power_draw"],
                &["gpu_power_readings", "instant_power_draw"],
                &["power_readings", "average_power_draw"],
                &["power_readings", "instant_power_draw"],
            ]),
            ..Default::default()
        };
        sanitize(&mut reading);

        // MIG instances: (gpu instance id, compute instance id) -> UUID, for processes below.
        let listed_migs = listed
            .iter()
            .find(|l| l.uuid == uuid)
            .map(|l| l.migs.as_slice())
            .unwrap_or_default();
        let mut instances: Vec<(Option<u32>, Option<u32>, String)> = Vec::new();
        let mut children: Vec<GpuReading> = Vec::new();
        if let Some(devices) = gpu.child("mig_devices") {
            for dev in devices.children("mig_device") {
                let index = id(dev, "index");
                let gi = id(dev, "gpu_instance_id");
                let ci = id(dev, "compute_instance_id");
                let listed = index.and_then(|i| listed_migs.iter().find(|m| m.index == i));
                let mig_uuid = match (listed, gi, ci) {
                    (Some(l), _, _) => l.uuid.clone(),
                    (None, Some(gi), Some(ci)) => format!("MIG-{uuid}/{gi}/{ci}"),
                    _ => {
                        tracing::warn!(
                            gpu = uuid,
                            "a MIG device without index or instance ids; skipping it"
                        );
                        continue;
                    }
                };
                let mut child = GpuReading {
                    uuid: mig_uuid.clone(),
                    model: model.clone(),
                    memory_mib: mib(dev, &["fb_memory_usage", "total"]),
                    driver_version: driver.clone(),
                    cuda_version: cuda.clone(),
                    mig_enabled: Some(true),
                    mig_parent_uuid: Some(uuid.to_string()),
                    mig_profile: listed.map(|l| l.profile.clone()),
                    pci_bus_id: reading.pci_bus_id.clone(),
                    mem_used_mib: dev.first_number(&[&["fb_memory_usage", "used"]]),
                    ..Default::default()
                };
                sanitize(&mut child);
                instances.push((gi, ci, mig_uuid));
                children.push(child);
            }
        }
        // MIG instances `-L` knows but `-q -x` did not list (older drivers) still count.
        for l in listed_migs {
            if !children.iter().any(|g| g.uuid == l.uuid) {
                children.push(GpuReading {
                    uuid: l.uuid.clone(),
                    model: model.clone(),
                    driver_version: driver.clone(),
                    cuda_version: cuda.clone(),
                    mig_enabled: Some(true),
                    mig_parent_uuid: Some(uuid.to_string()),
                    mig_profile: Some(l.profile.clone()),
                    pci_bus_id: reading.pci_bus_id.clone(),
                    ..Default::default()
                });
            }
        }

        if let Some(procs) = gpu.child("processes") {
            for p in procs.children("process_info") {
                let Some(pid) = id(p, "pid") else { continue };
                let gi = id(p, "gpu_instance_id");
                let ci = id(p, "compute_instance_id");
                let on = instances
                    .iter()
                    .find(|(g, c, _)| gi.is_some() && *g == gi && (ci.is_none() || *c == ci))
                    .map(|(_, _, u)| u.clone())
                    .unwrap_or_else(|| uuid.to_string());
                snap.processes.push(ProcessReading {
                    gpu_uuid: on,
                    pid,
                    name: p.at(&["process_name"]).and_then(known_string),
                    process_type: p.at(&["type"]).and_then(known_string),
                    used_memory_mib: mib(p, &["used_memory"]),
                });
            }
        }
        // The physical GPU goes before its instances.
        snap.gpus.push(reading);
        snap.gpus.extend(children);
    }
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_xml_or_not_nvidia_smi_is_an_error_not_a_panic() {
        assert!(parse("", &[]).is_err());
        assert!(parse("<a><b></a>", &[]).is_err());
        assert!(parse("<html></html>", &[]).is_err());
        assert!(parse("<nvidia_smi_log>", &[]).is_err());
    }

    #[test]
    fn entities_and_missing_fields() {
        let snap = parse(
            "<nvidia_smi_log><driver_version>N/A</driver_version><gpu id=\"00000000:01:00.0\">\
             <product_name>A &amp; B</product_name><uuid>GPU-1</uuid>\
             <utilization><gpu_util>[Not Supported]</gpu_util></utilization></gpu>\
             <gpu><product_name>no uuid</product_name></gpu></nvidia_smi_log>",
            &[],
        )
        .unwrap();
        assert_eq!(snap.gpus.len(), 1);
        let g = &snap.gpus[0];
        assert_eq!(g.model.as_deref(), Some("A & B"));
        assert_eq!(g.pci_bus_id.as_deref(), Some("00000000:01:00.0"));
        assert_eq!(g.driver_version, None);
        assert_eq!(g.util_pct, None);
        assert_eq!(g.memory_mib, None);
    }
}
