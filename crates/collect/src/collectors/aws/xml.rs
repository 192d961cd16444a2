//! Reading the EC2 and STS Query API answers (XML): instances, instance types' GPUs,
//! credentials and error codes. Every reader names the element it could not use.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use roxmltree::{Document, Node};

use super::RawInstance;
use crate::collectors::cloud::GpuSpec;

/// One page of `DescribeInstances`.
#[derive(Debug, Default)]
pub struct InstancesPage {
    pub instances: Vec<RawInstance>,
    pub next_token: Option<String>,
}

/// One page of `DescribeInstanceTypes`: each type with its GPUs (`None`: it has none).
#[derive(Debug, Default)]
pub struct TypesPage {
    pub types: BTreeMap<String, Option<GpuSpec>>,
    pub next_token: Option<String>,
}

fn child<'a, 'i>(n: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    n.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

fn text(n: Node<'_, '_>, name: &str) -> Option<String> {
    child(n, name)
        .and_then(|c| c.text())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

fn items<'a, 'i>(n: Node<'a, 'i>, set: &str) -> Vec<Node<'a, 'i>> {
    child(n, set)
        .map(|s| {
            s.children()
                .filter(|c| c.is_element() && c.tag_name().name() == "item")
                .collect()
        })
        .unwrap_or_default()
}

fn parse(body: &str) -> Result<Document<'_>, String> {
    Document::parse(body).map_err(|e| format!("the answer is not XML: {e}"))
}

fn time(n: Node<'_, '_>, name: &str) -> Result<Option<DateTime<Utc>>, String> {
    match text(n, name) {
        None => Ok(None),
        Some(t) => DateTime::parse_from_rfc3339(&t)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|e| format!("{name}: `{t}` is not a time: {e}")),
    }
}

/// A `DescribeInstancesResponse`. An instance without `instanceId` or `instanceType` is an
/// error naming it: the answer is not what the API documents.
pub fn instances(body: &str) -> Result<InstancesPage, String> {
    let doc = parse(body)?;
    let root = doc.root_element();
    if root.tag_name().name() != "DescribeInstancesResponse" {
        return Err(format!(
            "expected DescribeInstancesResponse, got <{}>",
            root.tag_name().name()
        ));
    }
    let mut page = InstancesPage {
        next_token: text(root, "nextToken"),
        ..Default::default()
    };
    for (r, reservation) in items(root, "reservationSet").into_iter().enumerate() {
        let owner = text(reservation, "ownerId");
        for (n, i) in items(reservation, "instancesSet").into_iter().enumerate() {
            let at = format!("reservationSet[{r}].instancesSet[{n}]");
            let id = text(i, "instanceId").ok_or(format!("{at}: no instanceId"))?;
            let at = format!("instance {id}");
            let instance_type = text(i, "instanceType").ok_or(format!("{at}: no instanceType"))?;
            let state = child(i, "instanceState")
                .and_then(|s| text(s, "name"))
                .ok_or(format!("{at}: no instanceState.name"))?;
            let mut tags = BTreeMap::new();
            for t in items(i, "tagSet") {
                if let Some(k) = text(t, "key") {
                    tags.insert(k, text(t, "value").unwrap_or_default());
                }
            }
            page.instances.push(RawInstance {
                instance_id: id,
                instance_type,
                owner_id: owner.clone(),
                zone: child(i, "placement").and_then(|p| text(p, "availabilityZone")),
                private_dns_name: text(i, "privateDnsName"),
                launch_time: time(i, "launchTime").map_err(|e| format!("{at}: {e}"))?,
                state,
                state_transition_reason: text(i, "reason")
                    .or_else(|| text(i, "stateTransitionReason")),
                lifecycle: text(i, "instanceLifecycle"),
                capacity_reservation_id: text(i, "capacityReservationId"),
                tags,
            });
        }
    }
    Ok(page)
}

/// A `DescribeInstanceTypesResponse`: each type's GPUs. A GPU entry with a count of 0 and a
/// partition size below 1 is a share of one GPU (`g6f.large`: 1/8 of an L4).
pub fn instance_types(body: &str) -> Result<TypesPage, String> {
    let doc = parse(body)?;
    let root = doc.root_element();
    if root.tag_name().name() != "DescribeInstanceTypesResponse" {
        return Err(format!(
            "expected DescribeInstanceTypesResponse, got <{}>",
            root.tag_name().name()
        ));
    }
    let mut page = TypesPage {
        next_token: text(root, "nextToken"),
        ..Default::default()
    };
    for (n, t) in items(root, "instanceTypeSet").into_iter().enumerate() {
        let name =
            text(t, "instanceType").ok_or(format!("instanceTypeSet[{n}]: no instanceType"))?;
        let gpus = match child(t, "gpuInfo") {
            None => None,
            Some(info) => {
                let list = items(info, "gpus");
                let Some(g) = list.first() else {
                    return Err(format!("{name}: gpuInfo lists no gpus"));
                };
                if list.len() > 1 {
                    tracing::debug!(instance_type = %name, "several GPU kinds; the first is kept");
                }
                let model =
                    text(*g, "name").ok_or(format!("{name}: gpuInfo.gpus[0] has no name"))?;
                let int = |key: &str| -> Result<Option<u64>, String> {
                    text(*g, key)
                        .map(|v| {
                            v.parse::<u64>().map_err(|_| {
                                format!("{name}: gpuInfo.gpus[0].{key}: `{v}` is not a count")
                            })
                        })
                        .transpose()
                };
                let count = int("count")?.unwrap_or(0);
                let logical = int("logicalGpuCount")?;
                let partition = match text(*g, "gpuPartitionSize") {
                    None => None,
                    Some(v) => Some(v.parse::<f64>().ok().filter(|f| f.is_finite() && *f > 0.0).ok_or(
                        format!("{name}: gpuInfo.gpus[0].gpuPartitionSize: `{v}` is not a positive number"),
                    )?),
                };
                let memory_mib = child(*g, "memoryInfo")
                    .and_then(|m| text(m, "sizeInMiB"))
                    .map(|v| {
                        v.parse::<u64>().map_err(|_| {
                            format!("{name}: gpuInfo.gpus[0].memoryInfo.sizeInMiB: `{v}` is not a number")
                        })
                    })
                    .transpose()?;
                let fraction = partition.filter(|p| *p < 1.0);
                let count = match (count, fraction) {
                    (0, Some(_)) => logical.unwrap_or(1).max(1),
                    (c, _) => c,
                };
                if count == 0 {
                    return Err(format!("{name}: gpuInfo.gpus[0] counts no GPU"));
                }
                Some(GpuSpec {
                    model,
                    count: u32::try_from(count).map_err(|_| {
                        format!("{name}: gpuInfo.gpus[0].count: {count} is too large")
                    })?,
                    memory_mib,
                    fraction,
                })
            }
        };
        page.types.insert(name, gpus);
    }
    Ok(page)
}

/// Temporary credentials from an STS answer (`AssumeRole`, `AssumeRoleWithWebIdentity`).
pub fn sts_credentials(body: &str) -> Result<(String, String, String, DateTime<Utc>), String> {
    let doc = parse(body)?;
    let creds = doc
        .descendants()
        .find(|n| n.is_element() && n.tag_name().name() == "Credentials")
        .ok_or("no Credentials in the answer")?;
    let get = |k: &str| text(creds, k).ok_or(format!("Credentials.{k} is missing"));
    let expires = time(creds, "Expiration")?.ok_or("Credentials.Expiration is missing")?;
    Ok((
        get("AccessKeyId")?,
        get("SecretAccessKey")?,
        get("SessionToken")?,
        expires,
    ))
}

/// The `Code` of an AWS error answer, when it is a plain word (`UnauthorizedOperation`,
/// `AuthFailure`, `InvalidClientTokenId`).
pub fn error_code(body: &str) -> Option<String> {
    let doc = Document::parse(body).ok()?;
    let code = doc
        .descendants()
        .find(|n| n.is_element() && n.tag_name().name() == "Code")?
        .text()?
        .trim()
        .to_string();
    (!code.is_empty()
        && code.len() <= 64
        && code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_'))
    .then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INSTANCES: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>r</requestId>
  <reservationSet><item><reservationId>r-1</reservationId><ownerId>111122223333</ownerId>
    <instancesSet><item>
      <instanceId>i-0abc</instanceId><instanceType>p5.48xlarge</instanceType>
      <instanceState><code>80</code><name>stopped</name></instanceState>
      <reason>User initiated (2026-11-02 10:00:00 GMT)</reason>
      <placement><availabilityZone>us-east-1a</availabilityZone></placement>
      <privateDnsName>ip-10-0-0-1.ec2.internal</privateDnsName>
      <launchTime>2026-11-01T08:00:00.000Z</launchTime>
      <instanceLifecycle>spot</instanceLifecycle>
      <tagSet><item><key>team</key><value>nlp</value></item></tagSet>
    </item></instancesSet></item></reservationSet>
  <nextToken>page2</nextToken>
</DescribeInstancesResponse>"#;

    #[test]
    fn instances_are_read() {
        let page = instances(INSTANCES).unwrap();
        assert_eq!(page.next_token.as_deref(), Some("page2"));
        let i = &page.instances[0];
        assert_eq!(i.instance_id, "i-0abc");
        assert_eq!(i.owner_id.as_deref(), Some("111122223333"));
        assert_eq!(i.state, "stopped");
        assert_eq!(i.zone.as_deref(), Some("us-east-1a"));
        assert_eq!(i.lifecycle.as_deref(), Some("spot"));
        assert_eq!(i.tags["team"], "nlp");
        assert!(i
            .state_transition_reason
            .as_deref()
            .unwrap()
            .contains("2026-11-02"));
    }

    #[test]
    fn bad_answers_name_what_is_wrong() {
        let e = instances("<DescribeInstancesResponse><reservationSet><item><instancesSet><item><instanceType>x</instanceType></item></instancesSet></item></reservationSet></DescribeInstancesResponse>").unwrap_err();
        assert!(
            e.contains("reservationSet[0].instancesSet[0]: no instanceId"),
            "{e}"
        );
        let e = instances(&INSTANCES.replace("2026-11-01T08", "yesterday")).unwrap_err();
        assert!(e.contains("instance i-0abc: launchTime: `yesterday"), "{e}");
        let e = instances("<Response/>").unwrap_err();
        assert!(e.contains("expected DescribeInstancesResponse"), "{e}");
        assert!(instances("not xml").unwrap_err().contains("not XML"));
        let e = instance_types("<DescribeInstanceTypesResponse><instanceTypeSet><item><instanceType>g9</instanceType><gpuInfo><gpus><item><name>L4</name><count>many</count></item></gpus></gpuInfo></item></instanceTypeSet></DescribeInstanceTypesResponse>").unwrap_err();
        assert!(
            e.contains("g9: gpuInfo.gpus[0].count: `many` is not a count"),
            "{e}"
        );
    }

    #[test]
    fn fractional_gpus_count_one_share() {
        let page = instance_types("<DescribeInstanceTypesResponse><instanceTypeSet><item><instanceType>g6f.large</instanceType><gpuInfo><gpus><item><name>L4</name><manufacturer>NVIDIA</manufacturer><count>0</count><gpuPartitionSize>0.125</gpuPartitionSize><logicalGpuCount>1</logicalGpuCount><memoryInfo><sizeInMiB>2861</sizeInMiB></memoryInfo></item></gpus></gpuInfo></item><item><instanceType>m5.large</instanceType></item></instanceTypeSet></DescribeInstanceTypesResponse>").unwrap();
        let g = page.types["g6f.large"].clone().unwrap();
        assert_eq!(
            (g.count, g.fraction, g.memory_mib),
            (1, Some(0.125), Some(2861))
        );
        assert_eq!(page.types["m5.large"], None);
    }

    #[test]
    fn error_codes_are_plain_words_only() {
        assert_eq!(
            error_code("<Response><Errors><Error><Code>UnauthorizedOperation</Code><Message>no</Message></Error></Errors></Response>").as_deref(),
            Some("UnauthorizedOperation")
        );
        assert_eq!(error_code("<Error><Code>a b <script></Code></Error>"), None);
        assert_eq!(error_code("nope"), None);
    }
}
