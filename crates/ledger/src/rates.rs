//! Hourly rates per GPU, first version: config overrides, then a built-in table of public
//! on-demand prices per GPU model family. The rate always carries its origin.
//!
//! Built-in figures (USD per GPU-hour = instance on-demand price ÷ GPUs per instance; for the
//! single-GPU `g` instances the figure includes the instance's CPU and memory). An accelerator no
//! AWS, GCP or Azure instance carries has a stand-in or derived figure, and its row says which and
//! how:
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
//! | MI300X | 6.00 | Azure ND MI300X v5 (`Standard_ND96isr_MI300X_v5`, 8 × MI300X) and OCI list MI300X at $6/GPU-h, as reported by the third-party research note "AMD inference economics", cliffcenter.com, 2026-05-18; rounded, and Azure's own price page was not read (so the catalog has no row for that size) |
//! | MI250X/MI250 | 5.1207 | stand-in, not a price anyone sells it at: no AWS, GCP or Azure instance carries it, so it takes the A100 80GB rate above (same generation and class: CDNA 2, 2021, 128 GB HBM2e OAM modules, eight to a node) |
//! | MI210 | 4.0966 | stand-in: no AWS, GCP or Azure instance carries it; takes the A100 rate above (CDNA 2 PCIe card, 64 GB HBM2e, 2022, A100-class) |
//! | MI100 | 3.06 | stand-in: no AWS, GCP or Azure instance carries it; takes the V100 rate above (CDNA 1 PCIe card, 32 GB HBM2, 2020, between V100 and A100 in matrix throughput; the lower one is a judgement) |
//! | Gaudi 3 | 8.1933 | derived: no AWS, GCP or Azure instance carries it; the H100 rate above × 2/3, the ratio Intel gave at Computex 2024 for a kit of eight Gaudi 3 on a baseboard ($125,000 list) against a comparable H100 platform (taiwantechtalk.com, "Computex 2024 review: Intel gets its mojo back") |
//! | Gaudi 2 | 4.0967 | derived: no AWS, GCP or Azure instance carries it; the H100 rate above × 1/3, the ratio Intel gave at Computex 2024 for a kit of eight Gaudi 2 ($65,000 list) against comparable competing platforms (same page) |
//! | Gaudi | 1.63863 | dl1.24xlarge $13.10904/h ÷ 8 (first-generation Gaudi, HL-205), us-east-1, SkyPilot catalog v7 `aws/vms.csv` |
//!
//! The NVIDIA rows were checked 2026-12-02, the AMD and Intel rows read 2026-12-04 (each row's
//! `as_of`).

use std::collections::BTreeMap;

use gpuledger_model::{Rate, RateOrigin};

use crate::facts::Attr;

/// When the table's NVIDIA rows were last checked against their sources (each row carries the
/// date it was read, [`BuiltinRate::as_of`]).
pub const BUILTIN_RATES_AS_OF: &str = "2026-12-02";

/// One row of the built-in table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuiltinRate {
    /// Family name, also the override key.
    pub family: &'static str,
    /// The ways a model name spells the family: the row matches when every word of one spelling
    /// is in the name, case and punctuation aside. A word of several tokens must appear as
    /// consecutive tokens: `HL-225` matches `HL-225` but not `HL 2250`, `Gaudi 2` matches
    /// `Intel Gaudi 2` and `Gaudi-2`. `["A100", "80GB"]` matches `NVIDIA A100-SXM4-80GB`.
    pub spellings: &'static [&'static [&'static str]],
    pub usd_per_hour: f64,
    pub source: &'static str,
    /// When the figure was read off its source.
    pub as_of: &'static str,
}

/// When the AMD and Intel rows were read off their sources.
const AMD_INTEL_READ: &str = "2026-12-04";

/// Most specific first: the first row one of whose spellings the model name holds wins.
pub const BUILTIN_RATES: &[BuiltinRate] = &[
    BuiltinRate {
        family: "H200",
        spellings: &[&["H200"]],
        usd_per_hour: 5.408,
        source: "p5e.48xlarge $43.26/h ÷ 8, AWS EC2 Capacity Blocks, US East (Ohio)",
        as_of: BUILTIN_RATES_AS_OF,
    },
    BuiltinRate {
        family: "H100",
        spellings: &[&["H100"]],
        usd_per_hour: 12.29,
        source: "p5.48xlarge $98.32/h ÷ 8, AWS us-east-1 on-demand (SkyPilot catalog v7)",
        as_of: BUILTIN_RATES_AS_OF,
    },
    BuiltinRate {
        family: "A100 80GB",
        spellings: &[&["A100", "80GB"]],
        usd_per_hour: 5.1207,
        source: "p4de.24xlarge $40.96575/h ÷ 8, AWS us-east-1 on-demand (SkyPilot catalog v7)",
        as_of: BUILTIN_RATES_AS_OF,
    },
    BuiltinRate {
        family: "A100",
        spellings: &[&["A100"]],
        usd_per_hour: 4.0966,
        source: "p4d.24xlarge $32.7726/h ÷ 8, AWS us-east-1 on-demand (SkyPilot catalog v7)",
        as_of: BUILTIN_RATES_AS_OF,
    },
    BuiltinRate {
        family: "V100",
        spellings: &[&["V100"]],
        usd_per_hour: 3.06,
        source: "p3.2xlarge $3.06/h, AWS us-east-1 on-demand (SkyPilot catalog v7)",
        as_of: BUILTIN_RATES_AS_OF,
    },
    BuiltinRate {
        family: "L40S",
        spellings: &[&["L40S"]],
        usd_per_hour: 1.861,
        source: "g6e.xlarge $1.861/h, AWS us-east-1 on-demand",
        as_of: BUILTIN_RATES_AS_OF,
    },
    BuiltinRate {
        family: "A10G",
        spellings: &[&["A10G"]],
        usd_per_hour: 1.006,
        source: "g5.xlarge $1.006/h, AWS us-east-1 on-demand",
        as_of: BUILTIN_RATES_AS_OF,
    },
    BuiltinRate {
        family: "L4",
        spellings: &[&["L4"]],
        usd_per_hour: 0.8048,
        source: "g6.xlarge $0.8048/h, AWS us-east-1 on-demand",
        as_of: BUILTIN_RATES_AS_OF,
    },
    BuiltinRate {
        family: "T4",
        spellings: &[&["T4"]],
        usd_per_hour: 0.35,
        source: "GCP T4 $0.35/h per GPU, us-central1 (SkyPilot GCP catalog, 2022)",
        as_of: BUILTIN_RATES_AS_OF,
    },
    // AMD Instinct: amd-smi's market name (`AMD Instinct MI300X`, `MI250X/MI250`) or rocm-smi's
    // card series (`Arcturus GL-XL [Instinct MI100]`).
    BuiltinRate {
        family: "MI300X",
        spellings: &[&["MI300X"]],
        usd_per_hour: 6.0,
        source: "Azure ND MI300X v5 about $6/GPU-h as reported by a third-party note \
                 (cliffcenter.com, 2026-05-18); Azure's own price page not read",
        as_of: AMD_INTEL_READ,
    },
    BuiltinRate {
        family: "MI250X/MI250",
        spellings: &[&["MI250X"], &["MI250"]],
        usd_per_hour: 5.1207,
        source: "stand-in: the A100 80GB rate (p4de.24xlarge $40.96575/h ÷ 8); \
                 no AWS, GCP or Azure instance carries it",
        as_of: AMD_INTEL_READ,
    },
    BuiltinRate {
        family: "MI210",
        spellings: &[&["MI210"]],
        usd_per_hour: 4.0966,
        source: "stand-in: the A100 rate (p4d.24xlarge $32.7726/h ÷ 8); \
                 no AWS, GCP or Azure instance carries it",
        as_of: AMD_INTEL_READ,
    },
    BuiltinRate {
        family: "MI100",
        spellings: &[&["MI100"]],
        usd_per_hour: 3.06,
        source: "stand-in: the V100 rate (p3.2xlarge $3.06/h); \
                 no AWS, GCP or Azure instance carries it",
        as_of: AMD_INTEL_READ,
    },
    // Intel Gaudi: hl-smi prints the module (`HL-225`, `HL-325L`), other tools the product name.
    BuiltinRate {
        family: "Gaudi 3",
        spellings: &[&["HL-325"], &["HL-325L"], &["Gaudi3"], &["Gaudi 3"]],
        usd_per_hour: 8.1933,
        source: "derived: the H100 rate $12.29 × 2/3, Intel's Computex 2024 ratio of an 8 × \
                 Gaudi 3 kit ($125,000 list) to a comparable H100 platform; no AWS, GCP or \
                 Azure instance carries it",
        as_of: AMD_INTEL_READ,
    },
    BuiltinRate {
        family: "Gaudi 2",
        spellings: &[&["HL-225"], &["HL-225B"], &["Gaudi2"], &["Gaudi 2"]],
        usd_per_hour: 4.0967,
        source: "derived: the H100 rate $12.29 × 1/3, Intel's Computex 2024 ratio of an 8 × \
                 Gaudi 2 kit ($65,000 list) to comparable platforms; no AWS, GCP or Azure \
                 instance carries it",
        as_of: AMD_INTEL_READ,
    },
    BuiltinRate {
        family: "Gaudi",
        spellings: &[&["HL-205"], &["Gaudi1"], &["Gaudi 1"]],
        usd_per_hour: 1.63863,
        source: "dl1.24xlarge $13.10904/h ÷ 8, AWS us-east-1 on-demand (SkyPilot catalog v7)",
        as_of: AMD_INTEL_READ,
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

/// Whether `word` (one token or several, `HL-225`) is in `toks` as consecutive tokens.
fn holds(toks: &[String], word: &str) -> bool {
    let word = tokens(word);
    !word.is_empty() && toks.windows(word.len()).any(|w| w == word.as_slice())
}

/// The built-in family a model name belongs to, if any.
pub fn family_of(model: &str) -> Option<&'static BuiltinRate> {
    let toks = tokens(model);
    BUILTIN_RATES.iter().find(|r| {
        r.spellings
            .iter()
            .any(|words| words.iter().all(|w| holds(&toks, w)))
    })
}

/// What a GPU's rate depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateFacts<'a> {
    pub model: &'a str,
    pub cloud: Option<&'a str>,
    pub instance_type: Option<&'a str>,
    pub host: Option<&'a str>,
    /// The cloud account, project or subscription.
    pub account: Option<&'a str>,
    pub region: Option<&'a str>,
    pub cluster: Option<&'a str>,
    pub labels: Option<&'a BTreeMap<String, String>>,
}

impl RateFacts<'_> {
    /// A GPU attribute a contract may match (workload attributes are never set here).
    fn get(&self, a: &Attr) -> Option<&str> {
        match a {
            Attr::Label(k) => self.labels.and_then(|l| l.get(k)).map(String::as_str),
            Attr::Host => self.host,
            Attr::Cluster => self.cluster,
            Attr::Cloud => self.cloud,
            Attr::Account => self.account,
            Attr::Region => self.region,
            Attr::InstanceType => self.instance_type,
            Attr::Model => Some(self.model),
            _ => None,
        }
        .map(str::trim)
        .filter(|v| !v.is_empty())
    }
}

/// What kind of deal a contract price is.
pub const CONTRACT_DEALS: [&str; 5] = [
    "spot",
    "reserved",
    "committed",
    "savings_plan",
    "negotiated",
];

/// How a contract prices a GPU.
#[derive(Debug, Clone, PartialEq)]
pub enum ContractPrice {
    /// Per instance-hour, ÷ the instance's GPUs (`gpus`, else the catalog's count for the GPU's
    /// instance type; without either the contract does not apply).
    Instance {
        usd_per_hour: f64,
        gpus: Option<f64>,
    },
    /// Per GPU-hour.
    Gpu { usd_per_gpu_hour: f64 },
    /// A discount off the rate the GPU would have without contracts (the catalog's on-demand
    /// price, an instance price, ...).
    Discount { pct: f64 },
}

/// `[[rates.contracts]]`: a spot, reserved, committed-use, savings-plan or negotiated price for
/// the GPUs matching `when` (an account, instance types, a region, a cluster, labels).
#[derive(Debug, Clone, PartialEq)]
pub struct Contract {
    pub name: String,
    /// One of [`CONTRACT_DEALS`].
    pub deal: String,
    /// Every condition must hold, with `*`/`?` patterns, as in ownership rules.
    pub when: Vec<(Attr, String)>,
    pub price: ContractPrice,
}

impl Contract {
    /// `account `1234…`, instance type `p5.48xlarge``: the values it matched, or `None`.
    fn matches(&self, facts: &RateFacts) -> Option<String> {
        let mut said = Vec::new();
        for (attr, pattern) in &self.when {
            let v = facts.get(attr)?;
            if !glob_match(pattern, v) {
                return None;
            }
            said.push(format!("{} `{v}`", attr.describe()));
        }
        Some(said.join(", "))
    }
}

impl<'a> RateFacts<'a> {
    /// Facts of a GPU known only by its model.
    pub fn model(model: &'a str) -> RateFacts<'a> {
        RateFacts {
            model,
            ..Default::default()
        }
    }
}

/// A configured price of an instance type, per instance-hour.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceOverride {
    pub usd_per_hour: f64,
    /// GPUs per instance; `None` takes the catalog's count.
    pub gpus: Option<f64>,
}

/// An on-prem rate for a model (exact name or family), optionally only on hosts matching a
/// pattern (`*` and `?`): the purchase price spread over its life, plus power at the wall.
#[derive(Debug, Clone, PartialEq)]
pub struct OnPremRate {
    pub model: String,
    pub hosts: Option<String>,
    pub purchase_usd: f64,
    pub life_years: f64,
    pub watts: f64,
    pub usd_per_kwh: f64,
    pub pue: f64,
}

/// Hours in a year of amortization (365 days).
pub const HOURS_PER_YEAR: f64 = 8760.0;

impl OnPremRate {
    /// purchase ÷ (life × 8760 h) + watts ÷ 1000 × $/kWh × PUE.
    pub fn usd_per_hour(&self) -> f64 {
        self.purchase_usd / (self.life_years * HOURS_PER_YEAR)
            + self.watts / 1000.0 * self.usd_per_kwh * self.pue
    }

    fn matches(&self, facts: &RateFacts) -> bool {
        let model_ok = self.model == facts.model
            || family_of(facts.model).is_some_and(|f| f.family == self.model);
        let host_ok = match (&self.hosts, facts.host) {
            (None, _) => true,
            (Some(p), Some(h)) => glob_match(p, h),
            (Some(_), None) => false,
        };
        model_ok && host_ok
    }
}

pub use gpuledger_model::glob_match;

/// The life over which a GPU's own purchase price (`labels.purchase_price_usd`, from an
/// inventory sheet) is spread when no `[[rates.onprem]]` entry prices it: straight line over
/// five years, the depreciation period most operators use for accelerator servers.
pub const PURCHASE_LIFE_YEARS: f64 = 5.0;

/// A GPU in no cloud whose labels give its purchase price (an inventory sheet's
/// `purchase_price_usd`, per GPU): that price over [`PURCHASE_LIFE_YEARS`], no power.
fn purchase_rate(facts: &RateFacts) -> Option<Rate> {
    let labels = facts.labels?;
    let price: f64 = labels
        .get("purchase_price_usd")?
        .trim()
        .parse()
        .ok()
        .filter(|p: &f64| p.is_finite() && *p > 0.0)?;
    let key = match (labels.get("sheet"), labels.get("sheet_row")) {
        (Some(sheet), Some(row)) => format!("purchase price from sheet `{sheet}` row {row}"),
        (Some(sheet), None) => format!("purchase price from sheet `{sheet}`"),
        _ => "purchase price label".to_string(),
    };
    let o = OnPremRate {
        model: facts.model.to_string(),
        hosts: None,
        purchase_usd: price,
        life_years: PURCHASE_LIFE_YEARS,
        watts: 0.0,
        usd_per_kwh: 0.0,
        pue: 1.0,
    };
    Some(Rate {
        usd_per_hour: Some(o.usd_per_hour()),
        origin: RateOrigin::OnPrem {
            key,
            purchase_usd: price,
            life_years: PURCHASE_LIFE_YEARS,
            watts: 0.0,
            usd_per_kwh: 0.0,
            pue: 1.0,
        },
    })
}

/// Built-in rates plus the config's: overrides by model or family, instance-type prices and
/// on-prem rates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateTable {
    pub overrides: BTreeMap<String, f64>,
    /// `[rates.instance_types]`, keyed by instance type (lower case).
    pub instance_overrides: BTreeMap<String, InstanceOverride>,
    /// `[[rates.onprem]]`, first match wins.
    pub onprem: Vec<OnPremRate>,
    /// `[[rates.contracts]]`, first match wins, before everything else.
    pub contracts: Vec<Contract>,
}

impl RateTable {
    /// The rate of a GPU, first match wins (BRIEF section 4): an override for the exact model
    /// name or its family; a configured price of its instance type ÷ its GPUs; the catalog's
    /// on-demand price of its instance type ÷ its GPUs; for GPUs not in a cloud, an on-prem
    /// rate for its model (and host); the built-in family rate; else unknown.
    pub fn rate_for(&self, facts: &RateFacts) -> Rate {
        for c in &self.contracts {
            let Some(matched) = c.matches(facts) else {
                continue;
            };
            let origin = |usd: f64, detail: String| Rate {
                usd_per_hour: Some(usd),
                origin: RateOrigin::Contract {
                    name: c.name.clone(),
                    deal: c.deal.clone(),
                    matched: matched.clone(),
                    detail,
                },
            };
            match c.price {
                ContractPrice::Gpu { usd_per_gpu_hour } => {
                    return origin(usd_per_gpu_hour, format!("${usd_per_gpu_hour}/GPU-h"));
                }
                ContractPrice::Instance { usd_per_hour, gpus } => {
                    let it = facts.instance_type.unwrap_or_default();
                    let cataloged = crate::catalog::instance_price(it).map(|c| c.gpus);
                    if let Some(gpus) = gpus.or(cataloged) {
                        return origin(
                            usd_per_hour / gpus.max(1.0),
                            format!("{it} ${usd_per_hour}/h ÷ {gpus}"),
                        );
                    }
                }
                ContractPrice::Discount { pct } => {
                    let base = self.list_rate_for(facts);
                    if let Some(b) = base.usd_per_hour {
                        return origin(
                            b * (1.0 - pct / 100.0),
                            format!("{pct} % off {}", base.origin.label()),
                        );
                    }
                }
            }
        }
        self.list_rate_for(facts)
    }

    /// The rate without contracts.
    fn list_rate_for(&self, facts: &RateFacts) -> Rate {
        let model = facts.model;
        if let Some(v) = self.overrides.get(model) {
            return Rate {
                usd_per_hour: Some(*v),
                origin: RateOrigin::ConfigOverride {
                    key: model.to_string(),
                },
            };
        }
        let family = family_of(model);
        if let Some(v) = family.and_then(|f| self.overrides.get(f.family)) {
            return Rate {
                usd_per_hour: Some(*v),
                origin: RateOrigin::ConfigOverride {
                    key: family.map(|f| f.family.to_string()).unwrap_or_default(),
                },
            };
        }
        if let Some(it) = facts.instance_type.map(str::trim).filter(|i| !i.is_empty()) {
            let cataloged = crate::catalog::instance_price(it);
            if let Some(o) = self.instance_overrides.get(&it.to_ascii_lowercase()) {
                if let Some(gpus) = o.gpus.or(cataloged.map(|c| c.gpus)) {
                    return Rate {
                        usd_per_hour: Some(o.usd_per_hour / gpus.max(1.0)),
                        origin: RateOrigin::InstanceOverride {
                            instance_type: it.to_string(),
                            instance_usd_per_hour: o.usd_per_hour,
                            gpus,
                        },
                    };
                }
            }
            if let Some(c) = cataloged {
                return Rate {
                    usd_per_hour: Some(c.per_gpu()),
                    origin: RateOrigin::InstanceCatalog {
                        instance_type: c.instance_type.to_string(),
                        cloud: c.cloud.to_string(),
                        region: c.region.to_string(),
                        instance_usd_per_hour: c.usd_per_hour,
                        gpus: c.gpus,
                        source: c.source.to_string(),
                        as_of: c.as_of.to_string(),
                    },
                };
            }
        }
        let in_cloud = matches!(facts.cloud, Some("aws" | "gcp" | "azure"));
        if !in_cloud {
            if let Some(o) = self.onprem.iter().find(|o| o.matches(facts)) {
                return Rate {
                    usd_per_hour: Some(o.usd_per_hour()),
                    origin: RateOrigin::OnPrem {
                        key: match &o.hosts {
                            Some(h) => format!("{} on {h}", o.model),
                            None => o.model.clone(),
                        },
                        purchase_usd: o.purchase_usd,
                        life_years: o.life_years,
                        watts: o.watts,
                        usd_per_kwh: o.usd_per_kwh,
                        pue: o.pue,
                    },
                };
            }
        }
        if !in_cloud {
            if let Some(rate) = purchase_rate(facts) {
                return rate;
            }
        }
        if let Some(f) = family {
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

    /// A sheet's purchase price prices a GPU in no cloud that no on-prem rule matches, ahead of
    /// the model's list price; a rule, a cloud or a bad price leaves it alone.
    #[test]
    fn a_purchase_price_is_amortized_when_no_rule_prices_the_gpu() {
        let labels: BTreeMap<String, String> = [
            ("purchase_price_usd", "26280"),
            ("sheet", "inventory.csv"),
            ("sheet_row", "4"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let facts = |cloud: Option<&'static str>, labels| RateFacts {
            model: "NVIDIA H100 80GB HBM3",
            cloud,
            instance_type: None,
            host: Some("dgx-1"),
            account: None,
            region: None,
            cluster: None,
            labels,
        };
        let t = RateTable::default();
        let r = t.rate_for(&facts(None, Some(&labels)));
        assert_eq!(r.usd_per_hour, Some(26280.0 / (5.0 * 8760.0)));
        assert_eq!(
            r.origin.label(),
            "on-prem (purchase price from sheet `inventory.csv` row 4: $26280 over 5 y + 0 W × $0/kWh × PUE 1)"
        );
        let in_cloud = t.rate_for(&facts(Some("aws"), Some(&labels)));
        assert!(
            matches!(in_cloud.origin, RateOrigin::BuiltinModel { .. }),
            "{in_cloud:?}"
        );
        let mut bad = labels.clone();
        bad.insert("purchase_price_usd".into(), "-1".into());
        let r = t.rate_for(&facts(None, Some(&bad)));
        assert!(matches!(r.origin, RateOrigin::BuiltinModel { .. }), "{r:?}");
        let mut ruled = RateTable::default();
        ruled.onprem.push(OnPremRate {
            model: "H100".into(),
            hosts: Some("dgx-*".into()),
            purchase_usd: 35040.0,
            life_years: 4.0,
            watts: 700.0,
            usd_per_kwh: 0.1,
            pue: 1.5,
        });
        let r = ruled.rate_for(&facts(None, Some(&labels)));
        assert!(
            matches!(&r.origin, RateOrigin::OnPrem { key, .. } if key == "H100 on dgx-*"),
            "{r:?}"
        );
    }

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
            ("Tesla V100-SXM2-16GB", Some("V100")),
            ("NVIDIA RTX 4000 SFF Ada Generation", None),
            // amd-smi market names, rocm-smi card series, other spellings
            ("AMD Instinct MI300X", Some("MI300X")),
            ("MI250X/MI250", Some("MI250X/MI250")),
            ("AMD Instinct MI250X", Some("MI250X/MI250")),
            ("AMD Instinct MI250", Some("MI250X/MI250")),
            ("AMD Instinct MI210", Some("MI210")),
            ("Arcturus GL-XL [Instinct MI100]", Some("MI100")),
            ("Radeon Instinct MI50 32GB", None),
            ("AMD Instinct MI300A", None),
            ("AMD Instinct MI325X", None),
            // hl-smi module names and product spellings
            ("HL-225", Some("Gaudi 2")),
            ("HL-225B", Some("Gaudi 2")),
            ("Intel Gaudi2", Some("Gaudi 2")),
            ("Intel Gaudi 2", Some("Gaudi 2")),
            ("Gaudi-2", Some("Gaudi 2")),
            ("HL-325", Some("Gaudi 3")),
            ("HL-325L", Some("Gaudi 3")),
            ("Intel Gaudi 3 AI Accelerator", Some("Gaudi 3")),
            ("Gaudi3", Some("Gaudi 3")),
            ("Gaudi HL-205", Some("Gaudi")),
            ("HL-205", Some("Gaudi")),
            // a plain "Gaudi" names no generation
            ("Habana Gaudi", None),
        ];
        for (model, want) in cases {
            assert_eq!(family_of(model).map(|f| f.family), want, "{model}");
        }
    }

    /// Model tokens match whole tokens, and a module name only as its consecutive tokens: no
    /// family reaches into a longer number, and no AMD or Intel spelling into an NVIDIA name.
    #[test]
    fn families_match_whole_tokens_only() {
        for model in [
            "MI2500",
            "AMD Instinct MI2500X",
            "MI2100",
            "MI1000",
            "MI300XL",
            "HL-2250",
            "HL-3250",
            "HL 22 5",
            "225 HL",
            "Gaudi 22",
            "Gaudi 30",
            "Gaudi20",
        ] {
            assert_eq!(family_of(model).map(|f| f.family), None, "{model}");
        }
        let amd_intel = |f: &str| f.starts_with("MI") || f.starts_with("Gaudi");
        for model in [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA H200 NVL",
            "NVIDIA L40S",
            "NVIDIA GeForce RTX 2250",
            "Quadro RTX 8000 225W",
            "NVIDIA A10G",
        ] {
            let fam = family_of(model).map(|f| f.family);
            assert!(!fam.is_some_and(amd_intel), "{model} → {fam:?}");
        }
    }

    /// Every accelerator name the corpus's rocm-smi outputs (`Card series` / `Card Series`) and
    /// hl-smi tables (the device column) print finds the family it should, and no other.
    #[test]
    fn corpus_amd_and_gaudi_names_find_their_family() {
        let (Some(amd), Some(gaudi)) = (
            crate::catalog::corpus_dir("amd"),
            crate::catalog::corpus_dir("gaudi"),
        ) else {
            return;
        };
        let files = |dir: &std::path::Path, ext: &[&str]| {
            let mut v: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| ext.iter().any(|x| e == *x)))
                .collect();
            v.sort();
            v
        };
        let mut seen = BTreeMap::new();
        for path in files(&amd, &["json"]) {
            let text = std::fs::read_to_string(&path).unwrap();
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            for card in json.as_object().unwrap().values() {
                for key in ["Card series", "Card Series"] {
                    if let Some(name) = card.get(key).and_then(|v| v.as_str()) {
                        seen.insert(name.to_string(), path.clone());
                    }
                }
            }
        }
        for path in files(&gaudi, &["txt", "log"]) {
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines() {
                // `|   0  HL-225   N/A  | …`, after any log prefix
                let Some((_, rest)) = line.split_once('|') else {
                    continue;
                };
                let cell = rest.split('|').next().unwrap_or_default();
                let words: Vec<&str> = cell.split_whitespace().collect();
                if let [index, name, ..] = words[..] {
                    if index.chars().all(|c| c.is_ascii_digit()) && name.starts_with("HL-") {
                        seen.insert(name.to_string(), path.clone());
                    }
                }
            }
        }
        let want: BTreeMap<&str, Option<&str>> = [
            ("Arcturus GL-XL [Instinct MI100]", Some("MI100")),
            ("Radeon Instinct MI50 32GB", None),
            ("Navi 22 [Radeon RX 6700/6700 XT / 6800M]", None),
            ("Navi 32 [Radeon RX 7700 XT / 7800 XT]", None),
            ("DCU xxxx", None),
            ("HL-225", Some("Gaudi 2")),
            ("HL-325", Some("Gaudi 3")),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            seen.keys().map(String::as_str).collect::<Vec<_>>(),
            want.keys().copied().collect::<Vec<_>>(),
            "the corpus prints names this test does not know: add them to `want`"
        );
        for (name, path) in &seen {
            assert_eq!(
                family_of(name).map(|f| f.family),
                want[name.as_str()],
                "{name} ({})",
                path.display()
            );
        }
    }

    /// Gaudi and Instinct GPUs are priced like any other: by catalog on a cataloged instance, by
    /// an override or on-prem rule keyed by their family, else by the family's built-in rate.
    #[test]
    fn gaudi_and_instinct_gpus_are_priced_by_family() {
        let mut t = RateTable::default();
        let hl225 = RateFacts {
            model: "HL-225",
            host: Some("gaudi-1"),
            ..Default::default()
        };
        let r = t.rate_for(&hl225);
        assert_eq!(r.usd_per_hour, Some(4.0967));
        assert!(
            matches!(&r.origin, RateOrigin::BuiltinModel { family, source }
                if family == "Gaudi 2" && source.starts_with("derived: the H100 rate")),
            "{r:?}"
        );
        let dl1 = RateFacts {
            model: "HL-205",
            cloud: Some("aws"),
            instance_type: Some("dl1.24xlarge"),
            ..Default::default()
        };
        let r = t.rate_for(&dl1);
        assert_eq!(r.usd_per_hour, Some(1.63863));
        assert!(
            matches!(&r.origin, RateOrigin::InstanceCatalog { as_of, gpus, .. }
                if as_of == "2026-12-04" && *gpus == 8.0),
            "{r:?}"
        );
        t.overrides.insert("MI250X/MI250".into(), 2.0);
        assert_eq!(
            t.rate_for(&RateFacts::model("AMD Instinct MI250"))
                .usd_per_hour,
            Some(2.0)
        );
        t.onprem.push(OnPremRate {
            model: "Gaudi 2".into(),
            hosts: Some("gaudi-*".into()),
            purchase_usd: 8125.0,
            life_years: 5.0,
            watts: 600.0,
            usd_per_kwh: 0.1,
            pue: 1.5,
        });
        let r = t.rate_for(&hl225);
        assert!(
            matches!(&r.origin, RateOrigin::OnPrem { key, .. } if key == "Gaudi 2 on gaudi-*"),
            "{r:?}"
        );
        let mi300x = t.rate_for(&RateFacts::model("AMD Instinct MI300X"));
        assert_eq!(mi300x.usd_per_hour, Some(6.0));
    }

    #[test]
    fn built_in_rows_are_well_formed() {
        let mut families = std::collections::BTreeSet::new();
        for r in BUILTIN_RATES {
            assert!(families.insert(r.family), "{} twice", r.family);
            assert!(r.usd_per_hour > 0.0 && !r.source.is_empty(), "{r:?}");
            assert!(!r.spellings.is_empty(), "{r:?}");
            assert!(
                r.spellings.iter().all(|s| !s.is_empty()),
                "{}: an empty spelling matches every name",
                r.family
            );
            assert!(
                chrono::NaiveDate::parse_from_str(r.as_of, "%Y-%m-%d").is_ok(),
                "{r:?}"
            );
        }
    }

    #[test]
    fn overrides_win_exact_then_family() {
        let mut t = RateTable::default();
        assert_eq!(
            t.rate_for(&RateFacts::model("Tesla T4")).usd_per_hour,
            Some(0.35)
        );
        t.overrides.insert("T4".into(), 0.2);
        assert_eq!(
            t.rate_for(&RateFacts::model("Tesla T4")).usd_per_hour,
            Some(0.2)
        );
        t.overrides.insert("Tesla T4".into(), 0.1);
        let r = t.rate_for(&RateFacts::model("Tesla T4"));
        assert_eq!(r.usd_per_hour, Some(0.1));
        assert_eq!(
            r.origin,
            RateOrigin::ConfigOverride {
                key: "Tesla T4".into()
            }
        );
        assert_eq!(
            t.rate_for(&RateFacts::model("Mystery GPU")).origin,
            RateOrigin::Unknown
        );
    }

    #[test]
    fn instance_prices_then_onprem_then_model_defaults() {
        let mut t = RateTable::default();
        let p5 = RateFacts {
            model: "NVIDIA H100 80GB HBM3",
            cloud: Some("aws"),
            instance_type: Some("p5.48xlarge"),
            host: Some("ip-10-0-0-1"),
            ..Default::default()
        };
        let r = t.rate_for(&p5);
        assert_eq!(r.usd_per_hour, Some(12.29));
        assert!(matches!(r.origin, RateOrigin::InstanceCatalog { gpus, .. } if gpus == 8.0));
        assert!(r
            .origin
            .label()
            .starts_with("catalog (p5.48xlarge $98.32/h ÷ 8, aws us-east-1"));
        // A reserved price for the instance type wins over the catalog.
        t.instance_overrides.insert(
            "p5.48xlarge".into(),
            InstanceOverride {
                usd_per_hour: 60.0,
                gpus: None,
            },
        );
        assert_eq!(t.rate_for(&p5).usd_per_hour, Some(7.5));
        // An instance type the catalog lacks needs its GPU count.
        t.instance_overrides.insert(
            "g6f.large".into(),
            InstanceOverride {
                usd_per_hour: 0.2,
                gpus: Some(0.125),
            },
        );
        let g6f = RateFacts {
            model: "NVIDIA L4",
            instance_type: Some("g6f.large"),
            ..p5
        };
        assert_eq!(
            t.rate_for(&g6f).usd_per_hour,
            Some(0.2),
            "a fraction costs its price"
        );
        // On-prem: amortized purchase plus power, for GPUs in no cloud, by host pattern.
        t.onprem.push(OnPremRate {
            model: "H100".into(),
            hosts: Some("dgx-*".into()),
            purchase_usd: 35_040.0,
            life_years: 4.0,
            watts: 700.0,
            usd_per_kwh: 0.10,
            pue: 1.5,
        });
        let dgx = RateFacts {
            model: "NVIDIA H100 80GB HBM3",
            cloud: Some("onprem"),
            instance_type: None,
            host: Some("dgx-07"),
            ..Default::default()
        };
        let r = t.rate_for(&dgx);
        // 35,040 / (4 × 8760) = 1.00; 0.7 kW × $0.10 × 1.5 = 0.105.
        assert!((r.usd_per_hour.unwrap() - 1.105).abs() < 1e-9, "{r:?}");
        let other = RateFacts {
            host: Some("lab-1"),
            ..dgx
        };
        assert_eq!(
            t.rate_for(&other).usd_per_hour,
            Some(12.29),
            "built-in default"
        );
        let cloud = RateFacts {
            cloud: Some("gcp"),
            ..dgx
        };
        assert_eq!(
            t.rate_for(&cloud).usd_per_hour,
            Some(12.29),
            "on-prem rates skip clouds"
        );
    }

    /// Contracts come first, by account and instance type: an instance price, a per-GPU price,
    /// or a discount off what the GPU would cost without them.
    #[test]
    fn contracts_price_by_account_first_match_wins() {
        let t = RateTable {
            contracts: vec![
                Contract {
                    name: "p5 savings plan".into(),
                    deal: "savings_plan".into(),
                    when: vec![
                        (Attr::Account, "1111*".into()),
                        (Attr::InstanceType, "p5.*".into()),
                    ],
                    price: ContractPrice::Instance {
                        usd_per_hour: 55.04,
                        gpus: None,
                    },
                },
                Contract {
                    name: "gcp cud".into(),
                    deal: "committed".into(),
                    when: vec![(Attr::Account, "ml-prod".into())],
                    price: ContractPrice::Discount { pct: 37.0 },
                },
                Contract {
                    name: "spot pool".into(),
                    deal: "spot".into(),
                    when: vec![(Attr::Label("lifecycle".into()), "spot".into())],
                    price: ContractPrice::Gpu {
                        usd_per_gpu_hour: 1.5,
                    },
                },
            ],
            ..Default::default()
        };
        let p5 = RateFacts {
            model: "NVIDIA H100 80GB HBM3",
            cloud: Some("aws"),
            instance_type: Some("p5.48xlarge"),
            account: Some("111122223333"),
            ..Default::default()
        };
        let r = t.rate_for(&p5);
        assert_eq!(r.usd_per_hour, Some(6.88));
        assert_eq!(
            r.origin.label(),
            "contract `p5 savings plan` (savings_plan; account `111122223333`, instance type \
             `p5.48xlarge`: p5.48xlarge $55.04/h ÷ 8)"
        );
        // Another account pays the catalog's on-demand price.
        let other = RateFacts {
            account: Some("999"),
            ..p5
        };
        assert_eq!(t.rate_for(&other).usd_per_hour, Some(12.29));
        // 37 % off a3-highgpu-8g's on-demand price ($88.49 / 8).
        let a3 = RateFacts {
            model: "NVIDIA H100 80GB HBM3",
            cloud: Some("gcp"),
            instance_type: Some("a3-highgpu-8g"),
            account: Some("ml-prod"),
            ..Default::default()
        };
        let r = t.rate_for(&a3);
        assert!(
            (r.usd_per_hour.unwrap() - 88.49 / 8.0 * 0.63).abs() < 1e-9,
            "{r:?}"
        );
        assert!(
            r.origin.label().starts_with(
                "contract `gcp cud` (committed; account `ml-prod`: 37 % off catalog (a3-highgpu-8g"
            ),
            "{}",
            r.origin.label()
        );
        let spot: BTreeMap<String, String> = [("lifecycle".to_string(), "spot".to_string())].into();
        let r = t.rate_for(&RateFacts {
            labels: Some(&spot),
            ..other
        });
        assert_eq!(r.usd_per_hour, Some(1.5));
        // An instance price for a type the catalog lacks, without `gpus`, does not apply.
        let odd = RateFacts {
            instance_type: Some("p5.odd"),
            ..p5
        };
        assert_eq!(t.rate_for(&odd).usd_per_hour, Some(12.29), "family default");
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_match("dgx-*", "dgx-07"));
        assert!(glob_match("*-a100-?", "rdu-a100-3"));
        assert!(!glob_match("dgx-*", "lab-dgx-1"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a?", "a"));
    }
}
