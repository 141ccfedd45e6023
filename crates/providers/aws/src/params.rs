//! The Query-API parameters of RunInstances built from an [`AwsProviderSpec`] (pure; tested without a cloud).

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::spec::{AwsProviderSpec, ROOT_DEVICE_NAME};

/// Query parameters: `(name, value)`.
pub type Params = Vec<(String, String)>;

#[allow(clippy::needless_pass_by_value)] // call sites pass numbers, bools and strings alike
fn push(params: &mut Params, name: impl Into<String>, value: impl ToString) {
    params.push((name.into(), value.to_string()));
}

/// A list position as an EC2 integer.
pub(crate) fn index(i: usize) -> i64 {
    i64::try_from(i).unwrap_or(i64::MAX)
}

/// The tags of a machine's resources: the spec's tags plus `Name=<machine name>`.
pub fn machine_tags(spec: &AwsProviderSpec, machine_name: &str) -> BTreeMap<String, String> {
    let mut tags = spec.tags.clone();
    tags.insert("Name".into(), machine_name.into());
    tags
}

/// RunInstances parameters for one instance (MinCount = MaxCount = 1) of `spec`, named `machine_name`, with the
/// AMI's root device name, userData (sent base64) and the idempotency `client_token`.
#[allow(clippy::too_many_lines)] // one parameter block per spec field, in the spec's order
pub fn run_instances(
    spec: &AwsProviderSpec,
    machine_name: &str,
    root_device_name: &str,
    user_data: &[u8],
    client_token: &str,
) -> Params {
    let mut p = Params::new();
    push(&mut p, "ImageId", &spec.ami);
    push(&mut p, "InstanceType", &spec.machine_type);
    push(&mut p, "MinCount", 1);
    push(&mut p, "MaxCount", 1);
    push(&mut p, "ClientToken", client_token);
    push(
        &mut p,
        "UserData",
        base64::engine::general_purpose::STANDARD.encode(user_data),
    );
    if !spec.iam.name.is_empty() {
        push(&mut p, "IamInstanceProfile.Name", &spec.iam.name);
    } else if !spec.iam.arn.is_empty() {
        push(&mut p, "IamInstanceProfile.Arn", &spec.iam.arn);
    }
    if let Some(key) = &spec.key_name {
        push(&mut p, "KeyName", key);
    }
    if spec.ebs_optimized {
        push(&mut p, "EbsOptimized", true);
    }
    if spec.monitoring {
        push(&mut p, "Monitoring.Enabled", true);
    }
    for (i, ni) in spec.network_interfaces.iter().enumerate() {
        let f = format!("NetworkInterface.{}", i + 1);
        push(
            &mut p,
            format!("{f}.DeviceIndex"),
            ni.device_index.unwrap_or_else(|| index(i)),
        );
        push(&mut p, format!("{f}.SubnetId"), &ni.subnet_id);
        for (j, sg) in ni.security_group_ids.iter().enumerate() {
            push(&mut p, format!("{f}.SecurityGroupId.{}", j + 1), sg);
        }
        if let Some(v) = ni.associate_public_ip_address {
            push(&mut p, format!("{f}.AssociatePublicIpAddress"), v);
        }
        push(
            &mut p,
            format!("{f}.DeleteOnTermination"),
            ni.delete_on_termination.unwrap_or(true),
        );
        if let Some(v) = &ni.description {
            push(&mut p, format!("{f}.Description"), v);
        }
        if let Some(v) = ni.ipv6_address_count {
            push(&mut p, format!("{f}.Ipv6AddressCount"), v);
        }
        if let Some(v) = ni.ipv6_prefix_count {
            push(&mut p, format!("{f}.Ipv6PrefixCount"), v);
        }
        if let Some(v) = ni.primary_ipv6 {
            push(&mut p, format!("{f}.PrimaryIpv6"), v);
        }
        if let Some(v) = &ni.interface_type {
            push(&mut p, format!("{f}.InterfaceType"), v);
        }
        if let Some(v) = ni.network_card_index {
            push(&mut p, format!("{f}.NetworkCardIndex"), v);
        }
    }
    for (i, disk) in spec.block_devices.iter().enumerate() {
        let f = format!("BlockDeviceMapping.{}", i + 1);
        let name = if disk.device_name == ROOT_DEVICE_NAME || disk.device_name.is_empty() {
            root_device_name
        } else {
            disk.device_name.as_str()
        };
        push(&mut p, format!("{f}.DeviceName"), name);
        if !disk.no_device.is_empty() {
            push(&mut p, format!("{f}.NoDevice"), &disk.no_device);
        }
        if !disk.virtual_name.is_empty() {
            push(&mut p, format!("{f}.VirtualName"), &disk.virtual_name);
        }
        let e = &disk.ebs;
        push(&mut p, format!("{f}.Ebs.VolumeSize"), e.volume_size);
        push(&mut p, format!("{f}.Ebs.VolumeType"), &e.volume_type);
        push(
            &mut p,
            format!("{f}.Ebs.DeleteOnTermination"),
            e.delete_on_termination.unwrap_or(true),
        );
        if e.encrypted {
            push(&mut p, format!("{f}.Ebs.Encrypted"), true);
        }
        if e.iops > 0 {
            push(&mut p, format!("{f}.Ebs.Iops"), e.iops);
        }
        if let Some(t) = e.throughput {
            push(&mut p, format!("{f}.Ebs.Throughput"), t);
        }
        if let Some(k) = &e.kms_key_id {
            push(&mut p, format!("{f}.Ebs.KmsKeyId"), k);
        }
        if let Some(s) = &e.snapshot_id {
            push(&mut p, format!("{f}.Ebs.SnapshotId"), s);
        }
    }
    let tags = machine_tags(spec, machine_name);
    for (i, kind) in ["instance", "volume", "network-interface"].iter().enumerate() {
        let f = format!("TagSpecification.{}", i + 1);
        push(&mut p, format!("{f}.ResourceType"), kind);
        for (j, (k, v)) in tags.iter().enumerate() {
            push(&mut p, format!("{f}.Tag.{}.Key", j + 1), k);
            push(&mut p, format!("{f}.Tag.{}.Value", j + 1), v);
        }
    }
    market_and_reservation(spec, &mut p);
    if let Some(m) = &spec.instance_metadata_options {
        let f = "MetadataOptions";
        if !m.http_endpoint.is_empty() {
            push(&mut p, format!("{f}.HttpEndpoint"), &m.http_endpoint);
        }
        if let Some(h) = m.http_put_response_hop_limit {
            push(&mut p, format!("{f}.HttpPutResponseHopLimit"), h);
        }
        if !m.http_tokens.is_empty() {
            push(&mut p, format!("{f}.HttpTokens"), &m.http_tokens);
        }
        if !m.http_protocol_ipv6.is_empty() {
            push(&mut p, format!("{f}.HttpProtocolIpv6"), &m.http_protocol_ipv6);
        }
    }
    if let Some(cpu) = &spec.cpu_options {
        if let Some(c) = cpu.core_count {
            push(&mut p, "CpuOptions.CoreCount", c);
        }
        if let Some(t) = cpu.threads_per_core {
            push(&mut p, "CpuOptions.ThreadsPerCore", t);
        }
        if let Some(a) = &cpu.amd_sev_snp {
            push(&mut p, "CpuOptions.AmdSevSnp", a);
        }
    }
    if let Some(pl) = &spec.placement {
        let pairs = [
            ("Placement.GroupId", pl.group_id.clone()),
            ("Placement.Tenancy", pl.tenancy.clone()),
            ("Placement.HostId", pl.host_id.clone()),
            (
                "Placement.PartitionNumber",
                pl.partition_number.map(|n| n.to_string()),
            ),
            ("Placement.Affinity", pl.affinity.clone()),
        ];
        for (name, value) in pairs {
            if let Some(value) = value {
                push(&mut p, name, value);
            }
        }
    }
    p
}

fn market_and_reservation(spec: &AwsProviderSpec, p: &mut Params) {
    if let Some(price) = &spec.spot_price {
        push(p, "InstanceMarketOptions.MarketType", "spot");
        push(
            p,
            "InstanceMarketOptions.SpotOptions.SpotInstanceType",
            "one-time",
        );
        if !price.is_empty() {
            push(p, "InstanceMarketOptions.SpotOptions.MaxPrice", price);
        }
    } else if let Some(m) = &spec.instance_market_options {
        if !m.market_type.is_empty() {
            push(p, "InstanceMarketOptions.MarketType", &m.market_type);
        }
        if let Some(s) = &m.spot_options {
            let f = "InstanceMarketOptions.SpotOptions";
            if let Some(v) = &s.max_price {
                push(p, format!("{f}.MaxPrice"), v);
            }
            if let Some(v) = &s.spot_instance_type {
                push(p, format!("{f}.SpotInstanceType"), v);
            }
            if let Some(v) = &s.instance_interruption_behavior {
                push(p, format!("{f}.InstanceInterruptionBehavior"), v);
            }
        }
    }
    if let Some(cr) = &spec.capacity_reservation {
        let f = "CapacityReservationSpecification";
        if !cr.capacity_reservation_preference.is_empty() {
            push(
                p,
                format!("{f}.CapacityReservationPreference"),
                &cr.capacity_reservation_preference,
            );
        } else if let Some(id) = &cr.capacity_reservation_id {
            push(
                p,
                format!("{f}.CapacityReservationTarget.CapacityReservationId"),
                id,
            );
        } else if let Some(arn) = &cr.capacity_reservation_resource_group_arn {
            push(
                p,
                format!("{f}.CapacityReservationTarget.CapacityReservationResourceGroupArn"),
                arn,
            );
        }
        if cr.is_ml_capacity_block == Some(true) {
            push(p, "InstanceMarketOptions.MarketType", "capacity-block");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_device_spot_price_and_tags_on_three_resource_kinds() {
        let spec: AwsProviderSpec = serde_json::from_value(serde_json::json!({
            "ami": "ami-1", "region": "eu-west-1", "machineType": "m5.large", "iam": {"name": "prof"},
            "spotPrice": "",
            "tags": {"kubernetes.io/cluster/shoot": "1", "kubernetes.io/role/node": "1"},
            "networkInterfaces": [{"subnetID": "subnet-1", "securityGroupIDs": ["sg-1"]}],
            "blockDevices": [{"deviceName": "/root", "ebs": {"volumeSize": 50, "volumeType": "gp3"}}]
        }))
        .unwrap();
        let p = run_instances(&spec, "m-0", "/dev/xvda", b"#!/bin/sh", "tok");
        let get = |k: &str| p.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("BlockDeviceMapping.1.DeviceName"), Some("/dev/xvda"));
        assert_eq!(get("InstanceMarketOptions.MarketType"), Some("spot"));
        assert_eq!(get("InstanceMarketOptions.SpotOptions.MaxPrice"), None);
        assert_eq!(get("UserData"), Some("IyEvYmluL3No"));
        assert_eq!(get("IamInstanceProfile.Name"), Some("prof"));
        assert_eq!(get("NetworkInterface.1.DeviceIndex"), Some("0"));
        for (i, kind) in ["instance", "volume", "network-interface"].iter().enumerate() {
            assert_eq!(
                get(&format!("TagSpecification.{}.ResourceType", i + 1)),
                Some(*kind)
            );
            assert!(
                p.iter()
                    .any(|(n, v)| n.starts_with(&format!("TagSpecification.{}.Tag.", i + 1)) && v == "m-0")
            );
        }
    }
}
