//! Validation of an [`AwsProviderSpec`] and its secret, as the reference's `ValidateAWSProviderSpec`: every problem
//! is reported with the path of its field, and all of them at once.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use mcm_driver::DriverError;

use crate::spec::{
    AwsProviderSpec, BlockDevice, CLUSTER_TAG_PREFIX, ROLE_TAG_PREFIX, ROOT_DEVICE_NAME, VOLUME_TYPES,
};

/// Secret key of the access key ID.
pub const ACCESS_KEY_ID: &str = "providerAccessKeyId";
/// Alternative secret key of the access key ID.
pub const ALT_ACCESS_KEY_ID: &str = "accessKeyID";
/// Secret key of the secret access key.
pub const SECRET_ACCESS_KEY: &str = "providerSecretAccessKey";
/// Alternative secret key of the secret access key.
pub const ALT_SECRET_ACCESS_KEY: &str = "secretAccessKey";
/// Secret key of the path of a web identity token file (workload identity).
pub const WORKLOAD_IDENTITY_TOKEN_FILE: &str = "workloadIdentityTokenFile";
/// Secret key of the role assumed with the web identity token.
pub const ROLE_ARN: &str = "roleARN";
/// Secret key of the user data.
pub const USER_DATA: &str = "userData";

/// The problems of a spec and its secret, each `field: reason`; empty when valid.
pub fn problems(spec: &AwsProviderSpec, secret: &Secret) -> Vec<String> {
    let mut out = Vec::new();
    let p = "providerSpec";
    if spec.ami.is_empty() {
        out.push(format!("{p}.ami: required"));
    }
    if spec.region.is_empty() {
        out.push(format!("{p}.region: required"));
    }
    if spec.machine_type.is_empty() {
        out.push(format!("{p}.machineType: required"));
    }
    if spec.iam.name.is_empty() == spec.iam.arn.is_empty() {
        out.push(format!("{p}.iam: exactly one of name and arn must be set"));
    }
    block_devices(&spec.block_devices, &mut out);
    if let Some(cr) = &spec.capacity_reservation {
        let set = [
            !cr.capacity_reservation_preference.is_empty(),
            cr.capacity_reservation_id.is_some(),
            cr.capacity_reservation_resource_group_arn.is_some(),
        ];
        if set.iter().filter(|s| **s).count() > 1 {
            out.push(format!(
                "{p}.capacityReservation: capacityReservationPreference, capacityReservationId and \
                 capacityReservationResourceGroupArn are mutually exclusive"
            ));
        }
    }
    if spec.network_interfaces.is_empty() {
        out.push(format!(
            "{p}.networkInterfaces: at least one network interface is required"
        ));
    }
    for (i, ni) in spec.network_interfaces.iter().enumerate() {
        let f = format!("{p}.networkInterfaces[{i}]");
        if ni.subnet_id.is_empty() {
            out.push(format!("{f}.subnetID: required"));
        }
        if ni.security_group_ids.is_empty() {
            out.push(format!(
                "{f}.securityGroupIDs: at least one security group ID is required"
            ));
        }
        for (j, id) in ni.security_group_ids.iter().enumerate() {
            if id.is_empty() {
                out.push(format!("{f}.securityGroupIDs[{j}]: must not be empty"));
            }
        }
    }
    secret_problems(secret, &mut out);
    tags(&spec.tags, &mut out);
    if let Some(m) = &spec.instance_metadata_options {
        let f = format!("{p}.instanceMetadataOptions");
        if let Some(hops) = m.http_put_response_hop_limit
            && !(0..=64).contains(&hops)
        {
            out.push(format!(
                "{f}.httpPutResponseHopLimit: {hops} is not between 0 and 64"
            ));
        }
        one_of(
            &mut out,
            &format!("{f}.httpEndpoint"),
            &m.http_endpoint,
            &["disabled", "enabled"],
        );
        one_of(
            &mut out,
            &format!("{f}.httpTokens"),
            &m.http_tokens,
            &["required", "optional"],
        );
        one_of(
            &mut out,
            &format!("{f}.httpProtocolIpv6"),
            &m.http_protocol_ipv6,
            &["disabled", "enabled"],
        );
    }
    if let Some(cpu) = &spec.cpu_options {
        let f = format!("{p}.cpuOptions");
        if cpu.core_count.is_none() {
            out.push(format!("{f}.coreCount: required"));
        }
        match cpu.threads_per_core {
            None => out.push(format!("{f}.threadsPerCore: required")),
            Some(t) if !(1..=2).contains(&t) => out.push(format!("{f}.threadsPerCore: {t} is not 1 or 2")),
            Some(_) => {}
        }
    }
    if let Some(pl) = &spec.placement
        && let Some(n) = pl.partition_number
        && n < 1
    {
        out.push(format!("{p}.placement.partitionNumber: {n} is below 1"));
    }
    out
}

fn one_of(out: &mut Vec<String>, field: &str, value: &str, accepted: &[&str]) {
    if !value.is_empty() && !accepted.contains(&value) {
        out.push(format!("{field}: {value:?} is not one of {accepted:?}"));
    }
}

fn tags(tags: &BTreeMap<String, String>, out: &mut Vec<String>) {
    if !tags.keys().any(|k| k.contains(CLUSTER_TAG_PREFIX)) {
        out.push(format!(
            "providerSpec.tags: a tag of the form {CLUSTER_TAG_PREFIX}<cluster> is required"
        ));
    }
    if !tags
        .keys()
        .any(|k| !k.contains(CLUSTER_TAG_PREFIX) && k.contains(ROLE_TAG_PREFIX))
    {
        out.push(format!(
            "providerSpec.tags: a tag of the form {ROLE_TAG_PREFIX}<role> is required"
        ));
    }
}

/// `/dev/sd[a-z]` or `/dev/xvd[a-c][a-z]?` (the reference's `DataDeviceNameFormat`).
fn is_data_device_name(name: &str) -> bool {
    let lower = |c: u8| c.is_ascii_lowercase();
    if let Some(rest) = name.strip_prefix("/dev/sd") {
        return rest.len() == 1 && lower(rest.as_bytes()[0]);
    }
    if let Some(rest) = name.strip_prefix("/dev/xvd") {
        let b = rest.as_bytes();
        return match b.len() {
            1 => (b'a'..=b'c').contains(&b[0]),
            2 => (b'a'..=b'c').contains(&b[0]) && lower(b[1]),
            _ => false,
        };
    }
    false
}

fn block_devices(devices: &[BlockDevice], out: &mut Vec<String>) {
    let f = "providerSpec.blockDevices";
    let mut roots = 0;
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, disk) in devices.iter().enumerate() {
        if disk.device_name == ROOT_DEVICE_NAME {
            roots += 1;
        } else if devices.len() > 1 && !is_data_device_name(&disk.device_name) {
            out.push(format!(
                "{f}[{i}].deviceName: {:?} does not match ^/dev/(sd[a-z]|xvd[a-c][a-z]?)$",
                disk.device_name
            ));
        }
        *names.entry(disk.device_name.as_str()).or_default() += 1;
        if !VOLUME_TYPES.contains(&disk.ebs.volume_type.as_str()) {
            out.push(format!(
                "{f}[{i}].ebs.volumeType: {:?} is not one of {VOLUME_TYPES:?}",
                disk.ebs.volume_type
            ));
        }
        if disk.ebs.volume_size <= 0 {
            out.push(format!(
                "{f}[{i}].ebs.volumeSize: must be a positive number of GiB"
            ));
        }
        if disk.ebs.iops < 0 || (disk.ebs.volume_type == "io1" && disk.ebs.iops == 0) {
            out.push(format!("{f}[{i}].ebs.iops: must be positive (required for io1)"));
        }
        if let Some(t) = disk.ebs.throughput
            && t <= 0
        {
            out.push(format!("{f}[{i}].ebs.throughput: {t} is not positive"));
        }
    }
    if roots > 1 || (roots == 0 && devices.len() > 1) {
        out.push(format!(
            "{f}: exactly one device must be the root ({ROOT_DEVICE_NAME})"
        ));
    }
    for (name, count) in names {
        if count > 1 {
            out.push(format!(
                "{f}: device name {name:?} is used {count} times; names must be unique"
            ));
        }
    }
}

/// A secret value (`data`, else `stringData`) as bytes; never logged.
pub(crate) fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })
        .filter(|v| !v.is_empty())
}

fn secret_problems(secret: &Secret, out: &mut Vec<String>) {
    let has = |key: &str| secret_value(secret, key).is_some();
    let f = "secretRef";
    let workload = secret
        .data
        .as_ref()
        .is_some_and(|d| d.contains_key(WORKLOAD_IDENTITY_TOKEN_FILE))
        || secret
            .string_data
            .as_ref()
            .is_some_and(|d| d.contains_key(WORKLOAD_IDENTITY_TOKEN_FILE));
    if workload {
        if !has(WORKLOAD_IDENTITY_TOKEN_FILE) {
            out.push(format!("{f}.{WORKLOAD_IDENTITY_TOKEN_FILE}: must not be empty"));
        }
        if !has(ROLE_ARN) {
            out.push(format!("{f}.{ROLE_ARN}: required when workload identity is used"));
        }
    } else {
        if !has(ACCESS_KEY_ID) && !has(ALT_ACCESS_KEY_ID) {
            out.push(format!(
                "{f}.{ACCESS_KEY_ID}: required ({ACCESS_KEY_ID} or {ALT_ACCESS_KEY_ID})"
            ));
        }
        if !has(SECRET_ACCESS_KEY) && !has(ALT_SECRET_ACCESS_KEY) {
            out.push(format!(
                "{f}.{SECRET_ACCESS_KEY}: required ({SECRET_ACCESS_KEY} or {ALT_SECRET_ACCESS_KEY})"
            ));
        }
    }
    if !has(USER_DATA) {
        out.push(format!("{f}.{USER_DATA}: required"));
    }
}

/// Parses and validates the class's `providerSpec` with its secret: `InvalidArgument` listing every problem.
pub fn validated(value: &serde_json::Value, secret: &Secret) -> Result<AwsProviderSpec, DriverError> {
    let spec = crate::spec::parse(value).map_err(DriverError::invalid_argument)?;
    let problems = problems(&spec, secret);
    if problems.is_empty() {
        Ok(spec)
    } else {
        Err(DriverError::invalid_argument(problems.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(pairs: &[(&str, &str)]) -> Secret {
        let data: serde_json::Map<String, serde_json::Value> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        serde_json::from_value(serde_json::json!({"stringData": data})).unwrap()
    }

    fn valid() -> serde_json::Value {
        serde_json::json!({
            "ami": "ami-1", "region": "eu-west-1", "machineType": "m5.large", "iam": {"arn": "arn:x"},
            "networkInterfaces": [{"subnetID": "subnet-1", "securityGroupIDs": ["sg-1"]}],
            "tags": {"kubernetes.io/cluster/c": "1", "kubernetes.io/role/node": "1"}
        })
    }

    fn check(spec: &serde_json::Value, secret: &Secret) -> Vec<String> {
        problems(&crate::spec::parse(spec).unwrap(), secret)
    }

    #[test]
    fn the_references_rules_each_name_their_field() {
        let ok = secret(&[("accessKeyID", "a"), ("secretAccessKey", "s"), ("userData", "u")]);
        assert_eq!(check(&valid(), &ok), Vec::<String>::new());
        let cases: Vec<(serde_json::Value, &str)> = vec![
            (
                serde_json::json!({"blockDevices": [
                {"deviceName": "/root", "ebs": {"volumeSize": 10, "volumeType": "io1"}},
                {"deviceName": "/root", "ebs": {"volumeSize": 0, "volumeType": "gp9"}}]}),
                "providerSpec.blockDevices: exactly one device must be the root",
            ),
            (
                serde_json::json!({"blockDevices": [{"deviceName": "/root", "ebs": {"volumeSize": 10, "volumeType": "io1"}}]}),
                "providerSpec.blockDevices[0].ebs.iops",
            ),
            (
                serde_json::json!({"blockDevices": [
                {"deviceName": "/root", "ebs": {"volumeSize": 10, "volumeType": "gp3"}},
                {"deviceName": "/dev/hda", "ebs": {"volumeSize": 10, "volumeType": "gp3", "throughput": 0}}]}),
                "providerSpec.blockDevices[1].deviceName",
            ),
            (
                serde_json::json!({"blockDevices": [{"ebs": {"volumeSize": 10, "volumeType": "gp3", "throughput": -1}}]}),
                "providerSpec.blockDevices[0].ebs.throughput",
            ),
            (
                serde_json::json!({"capacityReservation": {"capacityReservationPreference": "open", "capacityReservationId": "cr-1"}}),
                "providerSpec.capacityReservation: ",
            ),
            (
                serde_json::json!({"networkInterfaces": [{"subnetID": "", "securityGroupIDs": [""]}]}),
                "providerSpec.networkInterfaces[0].securityGroupIDs[0]",
            ),
            (
                serde_json::json!({"networkInterfaces": []}),
                "providerSpec.networkInterfaces: at least one",
            ),
            (
                serde_json::json!({"cpuOptions": {"coreCount": 2, "threadsPerCore": 3}}),
                "providerSpec.cpuOptions.threadsPerCore",
            ),
            (
                serde_json::json!({"cpuOptions": {"threadsPerCore": 1}}),
                "providerSpec.cpuOptions.coreCount",
            ),
            (
                serde_json::json!({"placement": {"partitionNumber": 0}}),
                "providerSpec.placement.partitionNumber",
            ),
            (
                serde_json::json!({"instanceMetadataOptions": {"httpTokens": "maybe"}}),
                "providerSpec.instanceMetadataOptions.httpTokens",
            ),
            (serde_json::json!({"iam": {}}), "providerSpec.iam"),
            (
                serde_json::json!({"ami": "", "region": "", "machineType": ""}),
                "providerSpec.machineType: required",
            ),
        ];
        for (patch, field) in cases {
            let mut spec = valid();
            for (k, v) in patch.as_object().unwrap() {
                spec[k] = v.clone();
            }
            let found = check(&spec, &ok);
            assert!(
                found.iter().any(|p| p.starts_with(field)),
                "{field} not in {found:?}"
            );
        }
    }

    #[test]
    fn secrets_need_a_key_pair_or_workload_identity_and_user_data() {
        let found = check(&valid(), &secret(&[("providerAccessKeyId", "a")]));
        assert_eq!(
            found,
            vec![
                "secretRef.providerSecretAccessKey: required (providerSecretAccessKey or secretAccessKey)"
                    .to_owned(),
                "secretRef.userData: required".to_owned(),
            ]
        );
        let found = check(
            &valid(),
            &secret(&[("workloadIdentityTokenFile", "/t"), ("userData", "u")]),
        );
        assert_eq!(
            found,
            vec!["secretRef.roleARN: required when workload identity is used".to_owned()]
        );
        let ok = secret(&[
            ("workloadIdentityTokenFile", "/t"),
            ("roleARN", "arn:r"),
            ("userData", "u"),
        ]);
        assert!(check(&valid(), &ok).is_empty());
    }

    #[test]
    fn unknown_fields_are_reported_with_their_path() {
        let mut spec = valid();
        spec["networkInterfaces"][0]["subnetId"] = "subnet-1".into();
        let err = crate::spec::parse(&spec).unwrap_err();
        assert!(
            err.starts_with("providerSpec.networkInterfaces[0]") && err.contains("subnetId"),
            "{err}"
        );
    }

    #[test]
    fn data_device_names_follow_the_references_pattern() {
        for ok in ["/dev/sda", "/dev/sdz", "/dev/xvda", "/dev/xvdcz"] {
            assert!(is_data_device_name(ok), "{ok}");
        }
        for bad in [
            "/dev/sd",
            "/dev/sdaa",
            "/dev/xvdd",
            "/dev/xvdaaa",
            "/root",
            "sda",
            "/dev/sdA",
        ] {
            assert!(!is_data_device_name(bad), "{bad}");
        }
    }
}
