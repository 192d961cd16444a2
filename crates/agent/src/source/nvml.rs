//! Reading GPUs through NVML. `libnvidia-ml.so.1` is loaded when the agent starts, not linked at
//! build time, so one binary runs on any driver version and fails cleanly where there is none.
//!
//! Only read calls are made: NVML is never asked to change a setting. SM activity comes from GPM
//! (GPU Performance Monitoring, Hopper and newer) as the difference between this read's sample
//! and the previous one; on older GPUs it stays unknown.

use std::collections::HashMap;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{gpm_metrics_get, GpmSample};
use nvml_wrapper::{Device, Nvml};

use super::{is_sentinel_u64, sanitize, GpuReading, ProcessReading, Snapshot, SourceError};

const BYTES_PER_MIB: f64 = 1024.0 * 1024.0;

/// An initialised NVML with what it needs between reads.
pub struct NvmlSource {
    /// Kept for the life of the process: GPM samples borrow it, and NVML is initialised once.
    nvml: &'static Nvml,
    /// The previous GPM sample per GPU UUID, to compute SM activity over the interval.
    gpm_prev: HashMap<String, GpmSample<'static>>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource").finish_non_exhaustive()
    }
}

fn mib(bytes: u64) -> Option<f64> {
    (!is_sentinel_u64(bytes)).then(|| bytes as f64 / BYTES_PER_MIB)
}

/// The profile in a MIG device's name: `NVIDIA A100-SXM4-80GB MIG 1g.10gb` → `1g.10gb`.
pub fn mig_profile_from_name(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty()).then(|| profile.to_string())
}

/// `12020` → `12.2`, as `nvidia-smi` prints the CUDA version.
pub fn cuda_version_text(v: i32) -> Option<String> {
    (v > 0).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

fn optional<T>(r: Result<T, NvmlError>) -> Option<T> {
    r.ok()
}

impl NvmlSource {
    /// Load and initialise NVML, or say why it cannot be used here.
    pub fn open() -> Result<NvmlSource, SourceError> {
        let nvml = Nvml::init().map_err(|e| SourceError::Nvml(e.to_string()))?;
        let count = nvml
            .device_count()
            .map_err(|e| SourceError::Nvml(e.to_string()))?;
        tracing::debug!(gpus = count, "NVML initialised");
        Ok(NvmlSource {
            nvml: Box::leak(Box::new(nvml)),
            gpm_prev: HashMap::new(),
        })
    }

    /// SM activity (0..=1) since the previous read of this GPU, where GPM is supported.
    fn sm_active(&mut self, uuid: &str, dev: &Device<'static>) -> Option<f64> {
        if !matches!(dev.gpm_support(), Ok(true)) {
            return None;
        }
        let now = dev.gpm_sample().ok()?;
        let prev = self.gpm_prev.insert(uuid.to_string(), now)?;
        let now = self.gpm_prev.get(uuid)?;
        let results = gpm_metrics_get(self.nvml, &prev, now, &[GpmMetricId::SmUtil]).ok()?;
        let pct = results.into_iter().next()?.ok()?.value;
        (pct.is_finite() && (0.0..=100.0).contains(&pct)).then_some(pct / 100.0)
    }

    fn processes(dev: &Device<'static>, on: &str, out: &mut Vec<ProcessReading>) {
        let Ok(list) = dev.running_compute_processes() else {
            return;
        };
        for p in list {
            out.push(ProcessReading {
                gpu_uuid: on.to_string(),
                pid: p.pid,
                name: None,
                process_type: Some("C".to_string()),
                used_memory_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) if !is_sentinel_u64(b) => {
                        Some((b as f64 / BYTES_PER_MIB).round() as u64)
                    }
                    _ => None,
                },
            });
        }
    }

    /// Read every GPU, its MIG instances and their compute processes.
    pub fn read(&mut self) -> Result<Snapshot, SourceError> {
        let nvml = self.nvml;
        let count = nvml
            .device_count()
            .map_err(|e| SourceError::Nvml(e.to_string()))?;
        let driver = optional(nvml.sys_driver_version());
        let cuda = optional(nvml.sys_cuda_driver_version()).and_then(cuda_version_text);
        let mut snap = Snapshot::default();
        for i in 0..count {
            let dev = match nvml.device_by_index(i) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(index = i, error = %e, "NVML could not open a GPU; skipping it");
                    continue;
                }
            };
            let uuid = match dev.uuid() {
                Ok(u) => u,
                Err(e) => {
                    tracing::warn!(index = i, error = %e, "NVML gave no UUID for a GPU; skipping it");
                    continue;
                }
            };
            let memory = optional(dev.memory_info());
            let mig_enabled = optional(dev.mig_mode()).map(|m| m.current == 1);
            let mut reading = GpuReading {
                uuid: uuid.clone(),
                model: optional(dev.name()),
                memory_mib: memory
                    .as_ref()
                    .and_then(|m| mib(m.total))
                    .map(|m| m.round() as u64),
                serial: optional(dev.serial()),
                pci_bus_id: optional(dev.pci_info()).map(|p| p.bus_id),
                driver_version: driver.clone(),
                cuda_version: cuda.clone(),
                mig_enabled,
                util_pct: optional(dev.utilization_rates()).map(|u| u.gpu as f64),
                mem_used_mib: memory.as_ref().and_then(|m| mib(m.used)),
                power_w: optional(dev.power_usage())
                    .filter(|mw| !is_sentinel_u64(*mw as u64))
                    .map(|mw| mw as f64 / 1000.0),
                ..Default::default()
            };
            if mig_enabled == Some(true) {
                // MIG hides whole-GPU utilization; per-instance metrics need the instance.
                reading.util_pct = None;
            } else {
                reading.sm_active = self.sm_active(&uuid, &dev);
                Self::processes(&dev, &uuid, &mut snap.processes);
            }
            sanitize(&mut reading);
            let model = reading.model.clone();
            let pci = reading.pci_bus_id.clone();
            snap.gpus.push(reading);

            if mig_enabled == Some(true) {
                let n = optional(dev.mig_device_count()).unwrap_or(0);
                for m in 0..n {
                    let Ok(mig) = dev.mig_device_by_index(m) else {
                        continue;
                    };
                    let Ok(mig_uuid) = mig.uuid() else { continue };
                    let mem = optional(mig.memory_info());
                    let mut child = GpuReading {
                        uuid: mig_uuid.clone(),
                        model: model.clone(),
                        memory_mib: mem
                            .as_ref()
                            .and_then(|m| mib(m.total))
                            .map(|m| m.round() as u64),
                        pci_bus_id: pci.clone(),
                        driver_version: driver.clone(),
                        cuda_version: cuda.clone(),
                        mig_enabled: Some(true),
                        mig_parent_uuid: Some(uuid.clone()),
                        mig_profile: optional(mig.name())
                            .as_deref()
                            .and_then(mig_profile_from_name),
                        mem_used_mib: mem.as_ref().and_then(|m| mib(m.used)),
                        ..Default::default()
                    };
                    sanitize(&mut child);
                    Self::processes(&mig, &mig_uuid, &mut snap.processes);
                    snap.gpus.push(child);
                }
            }
        }
        // Forget GPM samples of GPUs that are gone.
        self.gpm_prev
            .retain(|u, _| snap.gpus.iter().any(|g| &g.uuid == u));
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_names_and_cuda_versions() {
        assert_eq!(
            mig_profile_from_name("NVIDIA A100-SXM4-80GB MIG 1g.10gb").as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            mig_profile_from_name("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb").as_deref(),
            Some("1c.3g.40gb")
        );
        assert_eq!(mig_profile_from_name("Tesla T4"), None);
        assert_eq!(cuda_version_text(12020).as_deref(), Some("12.2"));
        assert_eq!(cuda_version_text(13000).as_deref(), Some("13.0"));
        assert_eq!(cuda_version_text(0), None);
    }

    #[test]
    fn no_driver_here_fails_cleanly() {
        // The build machines have no NVIDIA driver: opening must be an error, not a panic.
        if std::path::Path::new("/dev/nvidiactl").exists() {
            eprintln!("skipped: this machine has an NVIDIA driver");
            return;
        }
        let err = NvmlSource::open().unwrap_err();
        assert!(err.to_string().contains("NVML is not usable"), "{err}");
    }
}
