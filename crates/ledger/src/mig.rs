//! A MIG instance's share of its physical GPU. A MIG instance is never an extra GPU (BRIEF
//! section 4); where a figure is shown for an instance, it is its share of the parent, by the
//! GPU slices its profile names (`3g.40gb` holds 3 of an A100's or H100's 7 slices; an A30 has
//! 4). Compute-instance profiles (`1c.3g.40gb`) share their GPU instance's slices.

/// GPU slices a MIG-capable model is divided into.
pub fn slices_of_model(model: &str) -> u32 {
    if model.to_ascii_uppercase().contains("A30") {
        4
    } else {
        7
    }
}

/// The GPU slices a profile names: `2g.20gb` → 2, `1c.3g.40gb` → 3, `1g.10gb+me` → 1.
pub fn profile_slices(profile: &str) -> Option<u32> {
    let base = profile.split('+').next()?;
    base.split('.')
        .find_map(|part| part.strip_suffix('g')?.parse::<u32>().ok())
        .filter(|n| *n > 0)
}

/// The instance's share of its parent (`slices / model slices`), `None` when the profile says
/// no slice count. A share above one (a profile larger than the model allows) is clamped.
pub fn share(profile: Option<&str>, parent_model: &str) -> Option<(u32, u32)> {
    let of = slices_of_model(parent_model);
    let n = profile_slices(profile?)?;
    Some((n.min(of), of))
}

/// A MIG instance's hourly rate: its share of its parent's rate; `None` when either is unknown
/// (the instance's cost then stays inside its parent's, and the page says so).
pub fn instance_rate(parent_usd_per_hour: Option<f64>, share: Option<(u32, u32)>) -> Option<f64> {
    let (n, of) = share?;
    Some(parent_usd_per_hour? * f64::from(n) / f64::from(of))
}

/// A MIG instance's rate and how it was reached, from its parent GPU (`None` when the parent
/// is unknown): its slices' share of the parent's rate, or unknown with the reason.
pub fn instance_rate_with_basis(
    profile: Option<&str>,
    parent: Option<&gpuledger_model::GpuView>,
) -> (Option<f64>, String) {
    let Some(parent) = parent else {
        return (
            None,
            "MIG instance of a GPU no source reports: no rate".into(),
        );
    };
    match (share(profile, &parent.model), parent.usd_per_hour) {
        (Some((n, of)), Some(r)) => (
            instance_rate(Some(r), Some((n, of))),
            format!(
                "MIG instance: {n} of {of} slices of its GPU's ${r:.4}/h ({})",
                parent.rate_origin
            ),
        ),
        (None, _) => (
            None,
            "MIG instance of unknown size: its cost is part of its GPU's, shown on the GPU's page"
                .into(),
        ),
        (_, None) => (None, "MIG instance of a GPU without a rate".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_name_their_slices() {
        assert_eq!(profile_slices("1g.10gb"), Some(1));
        assert_eq!(profile_slices("3g.40gb"), Some(3));
        assert_eq!(profile_slices("1c.3g.40gb"), Some(3));
        assert_eq!(profile_slices("1g.10gb+me"), Some(1));
        assert_eq!(profile_slices("7g.80gb"), Some(7));
        assert_eq!(profile_slices("mystery"), None);
        assert_eq!(share(Some("2g.12gb"), "NVIDIA A30"), Some((2, 4)));
        assert_eq!(
            share(Some("3g.40gb"), "NVIDIA A100-SXM4-80GB"),
            Some((3, 7))
        );
        assert_eq!(share(None, "NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(instance_rate(Some(7.0), Some((3, 7))), Some(3.0));
        assert_eq!(instance_rate(None, Some((3, 7))), None);
        assert_eq!(instance_rate(Some(7.0), None), None);
    }
}
