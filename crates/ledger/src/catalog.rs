//! The built-in, dated catalog of on-demand prices of GPU instance types on AWS, GCP and
//! Azure, each figure with the public page or file it was read from. A GPU on a cataloged
//! instance type costs the instance's price ÷ its GPUs (BRIEF section 4).
//!
//! Prices are per instance-hour, on-demand, Linux, in the region named. They change; override
//! any of them with `[rates.instance_types]` (spot, reserved and committed-use prices go there
//! too). Fractional-GPU instances (a slice of one GPU that the host sees as a GPU) cost their
//! whole price per visible GPU: the divisor is never below one GPU.

/// When the catalog's first rows were read off their sources; rows added later carry their own
/// date ([`InstancePrice::as_of`]).
pub const CATALOG_AS_OF: &str = "2026-12-02";

/// One instance type's price.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InstancePrice {
    pub cloud: &'static str,
    pub instance_type: &'static str,
    /// GPUs per instance; below 1 for a fractional-GPU instance.
    pub gpus: f64,
    /// The GPU family (the built-in model table's names).
    pub family: &'static str,
    pub usd_per_hour: f64,
    pub region: &'static str,
    pub source: &'static str,
    /// When the figure was read off its source.
    pub as_of: &'static str,
}

impl InstancePrice {
    /// USD per GPU-hour: the instance price ÷ its GPUs, never dividing by less than one GPU.
    pub fn per_gpu(&self) -> f64 {
        self.usd_per_hour / self.gpus.max(1.0)
    }
}

const SKYPILOT_AWS: &str =
    "SkyPilot catalog v7 aws/vms.csv, us-east-1 on-demand (corpus pricing/skypilot-catalog-v7-aws-vms-gpu-subset.csv)";
/// The same file, read past the corpus's subset (which holds only the p3/p4/p5 rows).
const SKYPILOT_AWS_V7: &str =
    "SkyPilot catalog v7 aws/vms.csv (skypilot-org/skypilot-catalog at 001367d2), us-east-1 on-demand";
const AWS_PAGE: &str = "AWS EC2 On-Demand pricing page, US East (N. Virginia), Linux";
const AWS_CAPACITY_BLOCKS: &str =
    "AWS EC2 Capacity Blocks for ML pricing page, US East (Ohio) (no on-demand list price)";
const GCP_PAGE: &str = "Google Cloud Compute Engine GPU VM pricing page, us-central1, on-demand";
const AZURE_PAGE: &str = "Azure Linux Virtual Machines pricing page, East US, pay-as-you-go";

macro_rules! row {
    ($cloud:literal, $it:literal, $gpus:literal, $fam:literal, $usd:literal, $region:literal, $src:expr) => {
        row!($cloud, $it, $gpus, $fam, $usd, $region, $src, CATALOG_AS_OF)
    };
    ($cloud:literal, $it:literal, $gpus:literal, $fam:literal, $usd:literal, $region:literal, $src:expr, $as_of:expr) => {
        InstancePrice {
            cloud: $cloud,
            instance_type: $it,
            gpus: $gpus,
            family: $fam,
            usd_per_hour: $usd,
            region: $region,
            source: $src,
            as_of: $as_of,
        }
    };
}

/// The catalog. Instance types are matched without regard to case.
pub const CATALOG: &[InstancePrice] = &[
    // AWS
    row!(
        "aws",
        "p5.48xlarge",
        8.0,
        "H100",
        98.32,
        "us-east-1",
        SKYPILOT_AWS
    ),
    row!(
        "aws",
        "p5e.48xlarge",
        8.0,
        "H200",
        43.26,
        "us-east-2",
        AWS_CAPACITY_BLOCKS
    ),
    row!(
        "aws",
        "p4de.24xlarge",
        8.0,
        "A100 80GB",
        40.96575,
        "us-east-1",
        SKYPILOT_AWS
    ),
    row!(
        "aws",
        "p4d.24xlarge",
        8.0,
        "A100",
        32.7726,
        "us-east-1",
        SKYPILOT_AWS
    ),
    row!(
        "aws",
        "p3.2xlarge",
        1.0,
        "V100",
        3.06,
        "us-east-1",
        SKYPILOT_AWS
    ),
    row!(
        "aws",
        "g6e.xlarge",
        1.0,
        "L40S",
        1.861,
        "us-east-1",
        AWS_PAGE
    ),
    row!(
        "aws",
        "g6e.12xlarge",
        4.0,
        "L40S",
        10.49264,
        "us-east-1",
        AWS_PAGE
    ),
    row!(
        "aws",
        "g6e.48xlarge",
        8.0,
        "L40S",
        30.13118,
        "us-east-1",
        AWS_PAGE
    ),
    row!("aws", "g6.xlarge", 1.0, "L4", 0.8048, "us-east-1", AWS_PAGE),
    row!(
        "aws",
        "g6.12xlarge",
        4.0,
        "L4",
        4.6016,
        "us-east-1",
        AWS_PAGE
    ),
    row!(
        "aws",
        "g6.48xlarge",
        8.0,
        "L4",
        13.3504,
        "us-east-1",
        AWS_PAGE
    ),
    row!(
        "aws",
        "g5.xlarge",
        1.0,
        "A10G",
        1.006,
        "us-east-1",
        AWS_PAGE
    ),
    row!(
        "aws",
        "g5.12xlarge",
        4.0,
        "A10G",
        5.672,
        "us-east-1",
        AWS_PAGE
    ),
    row!(
        "aws",
        "g5.48xlarge",
        8.0,
        "A10G",
        16.288,
        "us-east-1",
        AWS_PAGE
    ),
    row!(
        "aws",
        "g4dn.xlarge",
        1.0,
        "T4",
        0.526,
        "us-east-1",
        AWS_PAGE
    ),
    row!(
        "aws",
        "g4dn.12xlarge",
        4.0,
        "T4",
        3.912,
        "us-east-1",
        AWS_PAGE
    ),
    // 8 × first-generation Gaudi (HL-205). No AWS, GCP or Azure instance with Gaudi 2, Gaudi 3
    // or an Instinct older than MI300X was found.
    row!(
        "aws",
        "dl1.24xlarge",
        8.0,
        "Gaudi",
        13.10904,
        "us-east-1",
        SKYPILOT_AWS_V7,
        "2026-12-04"
    ),
    // GCP (prices include the VM's CPU and memory)
    row!(
        "gcp",
        "a3-highgpu-8g",
        8.0,
        "H100",
        88.49,
        "us-central1",
        GCP_PAGE
    ),
    row!(
        "gcp",
        "a2-highgpu-1g",
        1.0,
        "A100",
        3.673477,
        "us-central1",
        GCP_PAGE
    ),
    row!(
        "gcp",
        "a2-highgpu-8g",
        8.0,
        "A100",
        29.387816,
        "us-central1",
        GCP_PAGE
    ),
    row!(
        "gcp",
        "g2-standard-4",
        1.0,
        "L4",
        0.706832,
        "us-central1",
        GCP_PAGE
    ),
    // Azure. ND MI300X v5 (8 × MI300X) is not here: its list price was not read off Azure's
    // page, so its GPUs take the MI300X family rate.
    row!(
        "azure",
        "Standard_ND96isr_H100_v5",
        8.0,
        "H100",
        98.32,
        "eastus",
        AZURE_PAGE
    ),
    row!(
        "azure",
        "Standard_ND96amsr_A100_v4",
        8.0,
        "A100 80GB",
        32.77,
        "eastus",
        AZURE_PAGE
    ),
    row!(
        "azure",
        "Standard_ND96asr_v4",
        8.0,
        "A100",
        27.197,
        "eastus",
        AZURE_PAGE
    ),
    row!(
        "azure",
        "Standard_NC24ads_A100_v4",
        1.0,
        "A100 80GB",
        3.673,
        "eastus",
        AZURE_PAGE
    ),
    row!(
        "azure",
        "Standard_NC4as_T4_v3",
        1.0,
        "T4",
        0.526,
        "eastus",
        AZURE_PAGE
    ),
];

/// The catalog row of an instance type, if any.
pub fn instance_price(instance_type: &str) -> Option<&'static InstancePrice> {
    let it = instance_type.trim();
    CATALOG
        .iter()
        .find(|p| p.instance_type.eq_ignore_ascii_case(it))
}

/// A folder of the test corpus (`shared/fixtures`, or `GPULEDGER_CORPUS`), or `None` when it is
/// missing and `GPULEDGER_REQUIRE_CORPUS` is unset (the test then skips).
#[cfg(test)]
pub(crate) fn corpus_dir(sub: &str) -> Option<std::path::PathBuf> {
    let corpus = std::env::var_os("GPULEDGER_CORPUS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
        });
    let dir = corpus.join(sub);
    if dir.exists() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("GPULEDGER_REQUIRE_CORPUS").is_none(),
        "GPULEDGER_REQUIRE_CORPUS is set but {} is missing (set GPULEDGER_CORPUS to the \
         fixtures folder)",
        dir.display()
    );
    eprintln!("skipped: no corpus at {}", dir.display());
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_gpu_divides_by_gpus_but_never_below_one() {
        let p5 = instance_price("P5.48XLARGE").unwrap();
        assert_eq!(p5.per_gpu(), 12.29);
        let frac = InstancePrice {
            gpus: 0.125,
            usd_per_hour: 0.2,
            ..*instance_price("g6.xlarge").unwrap()
        };
        assert_eq!(frac.per_gpu(), 0.2, "a slice costs its price, not 8× it");
        assert!(instance_price("m5.large").is_none());
    }

    /// dl1.24xlarge: 8 first-generation Gaudi at $13.10904/h (SkyPilot catalog v7, us-east-1),
    /// read on its own date, and its GPUs' model name finds the same family.
    #[test]
    fn dl1_prices_each_gaudi_at_an_eighth() {
        let dl1 = instance_price("dl1.24xlarge").unwrap();
        assert_eq!((dl1.cloud, dl1.family, dl1.gpus), ("aws", "Gaudi", 8.0));
        assert_eq!(dl1.per_gpu(), 13.10904 / 8.0);
        assert_eq!(dl1.per_gpu(), 1.63863);
        assert_eq!(dl1.as_of, "2026-12-04");
        assert_eq!(
            crate::rates::family_of("Gaudi HL-205").map(|f| f.family),
            Some(dl1.family),
            "SkyPilot's accelerator name for dl1"
        );
        assert_eq!(instance_price("p5.48xlarge").unwrap().as_of, CATALOG_AS_OF);
    }

    /// Every instance type the corpus's SkyPilot AWS catalog prices in us-east-1 that the
    /// built-in catalog also holds has the same on-demand price and GPU count.
    #[test]
    fn catalog_agrees_with_the_corpus_skypilot_prices() {
        let Some(pricing) = corpus_dir("pricing") else {
            return;
        };
        let file = pricing.join("skypilot-catalog-v7-aws-vms-gpu-subset.csv");
        let text = std::fs::read_to_string(&file).unwrap();
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let mut checked = std::collections::BTreeSet::new();
        for row in reader.deserialize::<std::collections::HashMap<String, String>>() {
            let row = row.unwrap();
            if row["Region"] != "us-east-1" {
                continue;
            }
            let Some(p) = instance_price(&row["InstanceType"]) else {
                continue;
            };
            let price: f64 = row["Price"].parse().unwrap();
            let gpus: f64 = row["AcceleratorCount"].parse().unwrap();
            assert_eq!(
                (p.usd_per_hour, p.gpus),
                (price, gpus),
                "{}",
                p.instance_type
            );
            checked.insert(p.instance_type);
        }
        assert_eq!(
            checked.into_iter().collect::<Vec<_>>(),
            ["p3.2xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge"]
        );
    }

    #[test]
    fn catalog_covers_the_families_on_every_cloud_and_is_well_formed() {
        for fam in ["A100", "H100", "H200", "L40S", "L4", "A10G", "T4", "Gaudi"] {
            assert!(CATALOG.iter().any(|p| p.family == fam), "{fam}");
        }
        for cloud in ["aws", "gcp", "azure"] {
            assert!(CATALOG.iter().any(|p| p.cloud == cloud), "{cloud}");
        }
        let mut seen = std::collections::BTreeSet::new();
        for p in CATALOG {
            assert!(p.gpus > 0.0 && p.usd_per_hour > 0.0, "{p:?}");
            assert!(!p.source.is_empty());
            assert!(
                seen.insert(p.instance_type.to_ascii_lowercase()),
                "{}",
                p.instance_type
            );
            assert!(
                crate::rates::BUILTIN_RATES
                    .iter()
                    .any(|r| r.family == p.family),
                "{}: family {} is not in the built-in table",
                p.instance_type,
                p.family
            );
            assert!(
                chrono::NaiveDate::parse_from_str(p.as_of, "%Y-%m-%d").is_ok(),
                "{p:?}"
            );
        }
    }
}
