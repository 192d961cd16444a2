//! Azure VM sizes with GPUs: the N series (NC, ND, NV), from Microsoft's size tables, and the
//! `GPUs` capability of a `resourceSkus` entry for sizes the table does not know.

use crate::collectors::cloud::GpuSpec;

/// One GPU size: (size, GPU model, GPUs, memory of one GPU or of the share in GiB, share of
/// one GPU as (numerator, denominator) when the size has part of one).
type Row = (
    &'static str,
    &'static str,
    u32,
    Option<u64>,
    Option<(u32, u32)>,
);

const A100_80_PCIE: &str = "NVIDIA A100 80GB PCIe";
const H100_NVL: &str = "NVIDIA H100 NVL";
const A10: &str = "NVIDIA A10";
const MI25: &str = "AMD Radeon Instinct MI25";
const V710: &str = "AMD Radeon Pro V710";

/// The GPU sizes this build knows.
pub const SIZES: &[Row] = &[
    // NC A100 v4
    ("Standard_NC24ads_A100_v4", A100_80_PCIE, 1, Some(80), None),
    ("Standard_NC48ads_A100_v4", A100_80_PCIE, 2, Some(80), None),
    ("Standard_NC96ads_A100_v4", A100_80_PCIE, 4, Some(80), None),
    // NCads H100 v5, NCCads H100 v5 (confidential)
    ("Standard_NC40ads_H100_v5", H100_NVL, 1, Some(94), None),
    ("Standard_NC80adis_H100_v5", H100_NVL, 2, Some(94), None),
    ("Standard_NCC40ads_H100_v5", H100_NVL, 1, Some(94), None),
    // ND H100 v5, ND H200 v5, ND MI300X v5 (AMD)
    (
        "Standard_ND96isr_H100_v5",
        "NVIDIA H100 80GB HBM3",
        8,
        Some(80),
        None,
    ),
    (
        "Standard_ND96isr_H200_v5",
        "NVIDIA H200 141GB",
        8,
        Some(141),
        None,
    ),
    (
        "Standard_ND96isr_MI300X_v5",
        "AMD Instinct MI300X",
        8,
        Some(192),
        None,
    ),
    // ND GB200 v6
    (
        "Standard_ND128isr_NDR_GB200_v6",
        "NVIDIA GB200",
        4,
        None,
        None,
    ),
    // ND A100 v4, NDm A100 v4
    ("Standard_ND96asr_v4", "NVIDIA A100 40GB", 8, Some(40), None),
    (
        "Standard_ND96amsr_A100_v4",
        "NVIDIA A100 80GB",
        8,
        Some(80),
        None,
    ),
    // NCasT4_v3
    ("Standard_NC4as_T4_v3", "NVIDIA Tesla T4", 1, Some(16), None),
    ("Standard_NC8as_T4_v3", "NVIDIA Tesla T4", 1, Some(16), None),
    (
        "Standard_NC16as_T4_v3",
        "NVIDIA Tesla T4",
        1,
        Some(16),
        None,
    ),
    (
        "Standard_NC64as_T4_v3",
        "NVIDIA Tesla T4",
        4,
        Some(16),
        None,
    ),
    // NCv3, NDv2
    (
        "Standard_NC6s_v3",
        "NVIDIA Tesla V100 16GB",
        1,
        Some(16),
        None,
    ),
    (
        "Standard_NC12s_v3",
        "NVIDIA Tesla V100 16GB",
        2,
        Some(16),
        None,
    ),
    (
        "Standard_NC24s_v3",
        "NVIDIA Tesla V100 16GB",
        4,
        Some(16),
        None,
    ),
    (
        "Standard_NC24rs_v3",
        "NVIDIA Tesla V100 16GB",
        4,
        Some(16),
        None,
    ),
    (
        "Standard_ND40rs_v2",
        "NVIDIA Tesla V100 32GB",
        8,
        Some(32),
        None,
    ),
    // NCads A10 v4: the smaller sizes have part of one A10.
    ("Standard_NC8ads_A10_v4", A10, 1, Some(8), Some((1, 3))),
    ("Standard_NC16ads_A10_v4", A10, 1, Some(12), Some((1, 2))),
    ("Standard_NC32ads_A10_v4", A10, 1, Some(24), None),
    // NVadsA10 v5
    ("Standard_NV6ads_A10_v5", A10, 1, Some(4), Some((1, 6))),
    ("Standard_NV12ads_A10_v5", A10, 1, Some(8), Some((1, 3))),
    ("Standard_NV18ads_A10_v5", A10, 1, Some(12), Some((1, 2))),
    ("Standard_NV36ads_A10_v5", A10, 1, Some(24), None),
    ("Standard_NV36adms_A10_v5", A10, 1, Some(24), None),
    ("Standard_NV72ads_A10_v5", A10, 2, Some(24), None),
    // NVv3
    ("Standard_NV12s_v3", "NVIDIA Tesla M60", 1, Some(8), None),
    ("Standard_NV24s_v3", "NVIDIA Tesla M60", 2, Some(8), None),
    ("Standard_NV48s_v3", "NVIDIA Tesla M60", 4, Some(8), None),
    // NVv4 (AMD)
    ("Standard_NV4as_v4", MI25, 1, Some(2), Some((1, 8))),
    ("Standard_NV8as_v4", MI25, 1, Some(4), Some((1, 4))),
    ("Standard_NV16as_v4", MI25, 1, Some(8), Some((1, 2))),
    ("Standard_NV32as_v4", MI25, 1, Some(16), None),
    // NVads V710 v5 (AMD)
    ("Standard_NV4ads_V710_v5", V710, 1, Some(4), Some((1, 6))),
    ("Standard_NV8ads_V710_v5", V710, 1, Some(8), Some((1, 3))),
    ("Standard_NV12ads_V710_v5", V710, 1, Some(12), Some((1, 2))),
    ("Standard_NV24ads_V710_v5", V710, 1, Some(24), None),
    ("Standard_NV28adms_V710_v5", V710, 1, Some(28), None),
];

/// The GPUs of `size` from the table (size names compare without case, as Azure does).
pub fn gpus_of_size(size: &str) -> Option<GpuSpec> {
    SIZES
        .iter()
        .find(|row| row.0.eq_ignore_ascii_case(size))
        .map(|&(_, model, count, gib, share)| GpuSpec {
            model: model.to_string(),
            count,
            memory_mib: gib.map(|g| g * 1024),
            fraction: share.map(|(n, d)| f64::from(n) / f64::from(d)),
        })
}

/// Whether `size` is of the N series, where Azure's GPU sizes are; other sizes have none.
pub fn is_gpu_series(size: &str) -> bool {
    let lower = size.to_ascii_lowercase();
    lower
        .strip_prefix("standard_n")
        .or_else(|| lower.strip_prefix("basic_n"))
        .is_some()
}

/// The GPUs of a size the table lacks, from its `resourceSkus` `GPUs` capability (`"1"`,
/// `"4"`, or a share like `"0.5"`). The model is the GPU named in the size
/// (`Standard_NC40ads_H100_v5` → `H100`), else `unknown`. `Ok(None)`: no GPUs.
pub fn gpus_of_capability(size: &str, gpus: &str) -> Result<Option<GpuSpec>, String> {
    let n: f64 = gpus
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)
        .ok_or_else(|| format!("`{gpus}` is not a number of GPUs"))?;
    if n == 0.0 {
        return Ok(None);
    }
    let (count, fraction) = if n < 1.0 {
        (1, Some(n))
    } else if n.fract() == 0.0 && n <= f64::from(u32::MAX) {
        (n as u32, None)
    } else {
        return Err(format!("`{gpus}` is not a whole number of GPUs"));
    };
    Ok(Some(GpuSpec {
        model: model_in_size_name(size).unwrap_or_else(|| "unknown".into()),
        count,
        memory_mib: None,
        fraction,
    }))
}

/// The GPU a size's name carries (`Standard_NC40ads_H100_v5` → `H100`): the last part between
/// the vCPU part and the version that has a digit and is not a network marker.
fn model_in_size_name(size: &str) -> Option<String> {
    let parts: Vec<&str> = size.split('_').collect();
    if parts.len() < 4 {
        return None;
    }
    parts[2..parts.len() - 1]
        .iter()
        .rev()
        .find(|p| {
            p.bytes().any(|b| b.is_ascii_digit()) && p.bytes().any(|b| b.is_ascii_alphabetic())
        })
        .map(|p| p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_found_without_case() {
        let g = gpus_of_size("standard_nd96isr_h100_v5").unwrap();
        assert_eq!(
            (g.model.as_str(), g.count, g.memory_mib),
            ("NVIDIA H100 80GB HBM3", 8, Some(81_920))
        );
        let a10 = gpus_of_size("Standard_NV12ads_A10_v5").unwrap();
        assert_eq!((a10.count, a10.memory_mib), (1, Some(8192)));
        assert!((a10.fraction.unwrap() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(gpus_of_size("Standard_D4s_v5"), None);
        assert!(is_gpu_series("Standard_NC24ads_A100_v4"));
        assert!(!is_gpu_series("Standard_D4s_v5"));
        for row in SIZES {
            assert!(is_gpu_series(row.0), "{}", row.0);
            assert!(row.2 > 0, "{}", row.0);
            assert_eq!(
                SIZES.iter().filter(|r| r.0 == row.0).count(),
                1,
                "{}",
                row.0
            );
        }
    }

    #[test]
    fn capabilities_give_counts_and_shares() {
        let g = gpus_of_capability("Standard_NC80adis_H100_v6", "2")
            .unwrap()
            .unwrap();
        assert_eq!((g.model.as_str(), g.count, g.fraction), ("H100", 2, None));
        let g = gpus_of_capability("Standard_NV9ads_X1_v9", "0.25")
            .unwrap()
            .unwrap();
        assert_eq!((g.count, g.fraction), (1, Some(0.25)));
        let g = gpus_of_capability("Standard_NC6s_v4", "1")
            .unwrap()
            .unwrap();
        assert_eq!(g.model, "unknown");
        assert_eq!(gpus_of_capability("Standard_NC6s_v4", "0").unwrap(), None);
        assert!(gpus_of_capability("x", "many")
            .unwrap_err()
            .contains("`many`"));
        assert!(gpus_of_capability("x", "1.5")
            .unwrap_err()
            .contains("whole"));
    }
}
