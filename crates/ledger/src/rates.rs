//! Hourly rates per GPU, first version: config overrides, then a built-in table of public
//! on-demand prices per GPU model family. The rate always carries its origin.
//!
//! Built-in figures (USD per GPU-hour = instance on-demand price ÷ GPUs per instance; for the
//! single-GPU `g` instances the figure includes the instance's CPU and memory):
//!
//! | family | $/GPU-h | figure and public source |
//! | --- | --- | --- |
//! | H200 | 5.408 | p5e.48xlarge $43.26/h ÷ 8, AWS EC2 Capacity Blocks price page, US East (Ohio), prices valid until 2025-01-01 (no on-demand price is listed for p5e in the SkyPilot catalog below) |
//! | H100 | 12.29 | p5.48xlarge $98.32/h ÷ 8, us-east-1, SkyPilot catalog v7 `aws/vms.csv` |
//! | A100 80GB | 5.1207 | p4de.24xlarge $40.96575/h ÷ 8, us-east-1, SkyPilot catalog v7 `aws/vms.csv` |
//! | A100 | 4.0966 | p4d.24xlarge $32.7726/h ÷ 8, us-east-1, SkyPilot catalog v7 `aws/vms.csv` |
//! | V100 | 3.06 | p3.2xlarge $3.06/h ÷ 1, us-east-1, SkyPilot catalog v7 `aws/vms.csv` |
//! | L40S | 1.861 | g6e.xlarge $1.861/h ÷ 1, us-east-1, AWS EC2 on-demand price page |
//! | A10G | 1.006 | g5.xlarge $1.006/h ÷ 1, us-east-1, AWS EC2 on-demand price page |
//! | L4 | 0.8048 | g6.xlarge $0.8048/h ÷ 1, us-east-1, AWS EC2 on-demand price page |
//! | T4 | 0.35 | GCP T4 accelerator $0.35/h per GPU, us-central1, SkyPilot GCP catalog (2022) |

use std::collections::BTreeMap;

use gpuledger_model::{Rate, RateOrigin};

/// When the built-in table was last checked against its sources.
pub const BUILTIN_RATES_AS_OF: &str = "2026-12-02";

/// One row of the built-in table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuiltinRate {
    /// Family name, also the override key.
    pub family: &'static str,
    /// Every token that must appear in the model name (upper case), e.g. `["A100", "80GB"]`.
    pub tokens: &'static [&'static str],
    pub usd_per_hour: f64,
    pub source: &'static str,
}

/// Most specific first: the first row whose tokens all appear in the model name wins.
pub const BUILTIN_RATES: &[BuiltinRate] = &[
    BuiltinRate {
        family: "H200",
        tokens: &["H200"],
        usd_per_hour: 5.408,
        source: "p5e.48xlarge $43.26/h ÷ 8, AWS EC2 Capacity Blocks, US East (Ohio)",
    },
    BuiltinRate {
        family: "H100",
        tokens: &["H100"],
        usd_per_hour: 12.29,
        source: "p5.48xlarge $98.32/h ÷ 8, AWS us-east-1 on-demand (SkyPilot catalog v7)",
    },
    BuiltinRate {
        family: "A100 80GB",
        tokens: &["A100", "80GB"],
        usd_per_hour: 5.1207,
        source: "p4de.24xlarge $40.96575/h ÷ 8, AWS us-east-1 on-demand (SkyPilot catalog v7)",
    },
    BuiltinRate {
        family: "A100",
        tokens: &["A100"],
        usd_per_hour: 4.0966,
        source: "p4d.24xlarge $32.7726/h ÷ 8, AWS us-east-1 on-demand (SkyPilot catalog v7)",
    },
    BuiltinRate {
        family: "V100",
        tokens: &["V100"],
        usd_per_hour: 3.06,
        source: "p3.2xlarge $3.06/h, AWS us-east-1 on-demand (SkyPilot catalog v7)",
    },
    BuiltinRate {
        family: "L40S",
        tokens: &["L40S"],
        usd_per_hour: 1.861,
        source: "g6e.xlarge $1.861/h, AWS us-east-1 on-demand",
    },
    BuiltinRate {
        family: "A10G",
        tokens: &["A10G"],
        usd_per_hour: 1.006,
        source: "g5.xlarge $1.006/h, AWS us-east-1 on-demand",
    },
    BuiltinRate {
        family: "L4",
        tokens: &["L4"],
        usd_per_hour: 0.8048,
        source: "g6.xlarge $0.8048/h, AWS us-east-1 on-demand",
    },
    BuiltinRate {
        family: "T4",
        tokens: &["T4"],
        usd_per_hour: 0.35,
        source: "GCP T4 $0.35/h per GPU, us-central1 (SkyPilot GCP catalog, 2022)",
    },
];

/// The model name split into upper-case tokens: `NVIDIA A100-SXM4-80GB` → `NVIDIA A100 SXM4 80GB`.
fn tokens(model: &str) -> Vec<String> {
    model
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(|t| t.to_ascii_uppercase())
        .collect()
}

/// The built-in family a model name belongs to, if any.
pub fn family_of(model: &str) -> Option<&'static BuiltinRate> {
    let toks = tokens(model);
    BUILTIN_RATES
        .iter()
        .find(|r| r.tokens.iter().all(|t| toks.iter().any(|m| m == t)))
}

/// Built-in rates plus config overrides keyed by exact model name or family name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateTable {
    pub overrides: BTreeMap<String, f64>,
}

impl RateTable {
    /// The rate for a GPU model, first match wins: an override for the exact model name, an
    /// override for its family, the built-in family rate, else unknown.
    pub fn rate_for(&self, model: &str) -> Rate {
        if let Some(v) = self.overrides.get(model) {
            return Rate {
                usd_per_hour: Some(*v),
                origin: RateOrigin::ConfigOverride {
                    key: model.to_string(),
                },
            };
        }
        let family = family_of(model);
        if let Some(f) = family {
            if let Some(v) = self.overrides.get(f.family) {
                return Rate {
                    usd_per_hour: Some(*v),
                    origin: RateOrigin::ConfigOverride {
                        key: f.family.to_string(),
                    },
                };
            }
            return Rate {
                usd_per_hour: Some(f.usd_per_hour),
                origin: RateOrigin::BuiltinModel {
                    family: f.family.to_string(),
                    source: f.source.to_string(),
                },
            };
        }
        Rate {
            usd_per_hour: None,
            origin: RateOrigin::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_model_names_find_their_family() {
        let cases = [
            ("NVIDIA H100 80GB HBM3", Some("H100")),
            ("NVIDIA H200", Some("H200")),
            ("NVIDIA A100-SXM4-80GB", Some("A100 80GB")),
            ("NVIDIA A100-SXM4-40GB", Some("A100")),
            ("GRID A100-40C", Some("A100")),
            ("NVIDIA L40S", Some("L40S")),
            ("NVIDIA L4", Some("L4")),
            ("NVIDIA A10G", Some("A10G")),
            ("Tesla T4", Some("T4")),
            ("NVIDIA RTX 4000 SFF Ada Generation", None),
        ];
        for (model, want) in cases {
            assert_eq!(family_of(model).map(|f| f.family), want, "{model}");
        }
    }

    #[test]
    fn overrides_win_exact_then_family() {
        let mut t = RateTable::default();
        assert_eq!(t.rate_for("Tesla T4").usd_per_hour, Some(0.35));
        t.overrides.insert("T4".into(), 0.2);
        assert_eq!(t.rate_for("Tesla T4").usd_per_hour, Some(0.2));
        t.overrides.insert("Tesla T4".into(), 0.1);
        let r = t.rate_for("Tesla T4");
        assert_eq!(r.usd_per_hour, Some(0.1));
        assert_eq!(
            r.origin,
            RateOrigin::ConfigOverride {
                key: "Tesla T4".into()
            }
        );
        assert_eq!(t.rate_for("Mystery GPU").origin, RateOrigin::Unknown);
    }
}
