//! The `providerSpec` of an AWS MachineClass: the reference's `AWSProviderSpec` JSON, field for field
//! (gardener/machine-controller-manager-provider-aws `pkg/aws/apis/aws_provider_spec.go`), so that a Gardener
//! class is used unchanged. Unknown fields are refused with their path (the reference ignores them silently; a
//! misspelt field that is silently dropped launches a different VM than the one asked for).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Tag key part that names the cluster (`kubernetes.io/cluster/<name>`).
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";
/// Tag key part that names the node role (`kubernetes.io/role/<role>`).
pub const ROLE_TAG_PREFIX: &str = "kubernetes.io/role/";
/// The device name that stands for the AMI's root device.
pub const ROOT_DEVICE_NAME: &str = "/root";
/// The EBS volume types accepted.
pub const VOLUME_TYPES: [&str; 6] = ["gp2", "gp3", "io1", "st1", "sc1", "standard"];

/// The reference's `AWSProviderSpec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwsProviderSpec {
    /// `apiVersion` (informational, e.g. `mcm.gardener.cloud/v1alpha1`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// `ami`: the image ID.
    #[serde(default)]
    pub ami: String,
    /// `blockDevices`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_devices: Vec<BlockDevice>,
    /// `capacityReservation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_reservation: Option<CapacityReservation>,
    /// `ebsOptimized`.
    #[serde(default)]
    pub ebs_optimized: bool,
    /// `iam`: the instance profile, by name or ARN.
    #[serde(default)]
    pub iam: Iam,
    /// `machineType`: the instance type.
    #[serde(default)]
    pub machine_type: String,
    /// `keyName`: the SSH key pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_name: Option<String>,
    /// `monitoring`: detailed monitoring.
    #[serde(default)]
    pub monitoring: bool,
    /// `networkInterfaces`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_interfaces: Vec<NetworkInterface>,
    /// `region`.
    #[serde(default)]
    pub region: String,
    /// `spotPrice` (legacy): set means a one-time spot instance; empty means no maximum price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_price: Option<String>,
    /// `instanceMarketOptions`: EC2's market options (spot), when given instead of `spotPrice`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_market_options: Option<InstanceMarketOptions>,
    /// `srcAndDstChecksEnabled`: `false` switches the check off during InitializeMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_and_dst_checks_enabled: Option<bool>,
    /// `tags`: put on the instance, its volumes and network interfaces.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// `instanceMetadataOptions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_metadata_options: Option<InstanceMetadataOptions>,
    /// `cpuOptions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_options: Option<CpuOptions>,
    /// `placement`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// `blockDevices[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BlockDevice {
    /// `deviceName`: `/root` or `/dev/sd?` / `/dev/xvd?`.
    #[serde(default)]
    pub device_name: String,
    /// `ebs`.
    #[serde(default)]
    pub ebs: Ebs,
    /// `noDevice`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub no_device: String,
    /// `virtualName` (ephemeralN).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub virtual_name: String,
}

/// `blockDevices[].ebs`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ebs {
    /// `deleteOnTermination` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    /// `encrypted`.
    #[serde(default)]
    pub encrypted: bool,
    /// `iops` (required for io1).
    #[serde(default)]
    pub iops: i64,
    /// `throughput` in MiB/s (gp3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<i64>,
    /// `kmsKeyID`.
    #[serde(default, rename = "kmsKeyID", skip_serializing_if = "Option::is_none")]
    pub kms_key_id: Option<String>,
    /// `snapshotID`.
    #[serde(default, rename = "snapshotID", skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// `volumeSize` in GiB.
    #[serde(default)]
    pub volume_size: i64,
    /// `volumeType`.
    #[serde(default)]
    pub volume_type: String,
}

/// `capacityReservation`: preference, ID and resource-group ARN are mutually exclusive.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapacityReservation {
    /// `capacityReservationPreference` (`open` or `none`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub capacity_reservation_preference: String,
    /// `capacityReservationId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_reservation_id: Option<String>,
    /// `capacityReservationResourceGroupArn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_reservation_resource_group_arn: Option<String>,
    /// `isMLCapacityBlock`: the market type becomes `capacity-block`.
    #[serde(
        default,
        rename = "isMLCapacityBlock",
        skip_serializing_if = "Option::is_none"
    )]
    pub is_ml_capacity_block: Option<bool>,
}

/// `iam`: exactly one of `name` and `arn`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Iam {
    /// `arn` of the instance profile.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub arn: String,
    /// `name` of the instance profile.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// `networkInterfaces[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkInterface {
    /// `associatePublicIPAddress`.
    #[serde(
        default,
        rename = "associatePublicIPAddress",
        skip_serializing_if = "Option::is_none"
    )]
    pub associate_public_ip_address: Option<bool>,
    /// `ipv6AddressCount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_address_count: Option<i64>,
    /// `ipv6PrefixCount`: prefixes assigned (again during InitializeMachine when missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_prefix_count: Option<i64>,
    /// `deleteOnTermination`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    /// `description`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `securityGroupIDs`.
    #[serde(default, rename = "securityGroupIDs", skip_serializing_if = "Vec::is_empty")]
    pub security_group_ids: Vec<String>,
    /// `subnetID`.
    #[serde(default, rename = "subnetID")]
    pub subnet_id: String,
    /// `interfaceType` (`interface`, `efa`, `efa-only`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_type: Option<String>,
    /// `networkCardIndex`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_card_index: Option<i64>,
    /// `deviceIndex` (default: the interface's position in the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_index: Option<i64>,
    /// `primaryIpv6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_ipv6: Option<bool>,
}

/// `placement`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Placement {
    /// `groupId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    /// `tenancy` (`default`, `dedicated`, `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenancy: Option<String>,
    /// `hostId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// `partitionNumber` (1 or more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_number: Option<i64>,
    /// `affinity` (`default`, `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<String>,
}

/// `cpuOptions`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuOptions {
    /// `coreCount` (required).
    #[serde(default)]
    pub core_count: Option<i64>,
    /// `threadsPerCore` (required, 1 or 2).
    #[serde(default)]
    pub threads_per_core: Option<i64>,
    /// `amdSevSnp` (`enabled`, `disabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amd_sev_snp: Option<String>,
}

/// `instanceMetadataOptions`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceMetadataOptions {
    /// `httpEndpoint` (`enabled`, `disabled`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub http_endpoint: String,
    /// `httpPutResponseHopLimit` (0 to 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_put_response_hop_limit: Option<i64>,
    /// `httpTokens` (`required`, `optional`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub http_tokens: String,
    /// `httpProtocolIpv6` (`enabled`, `disabled`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub http_protocol_ipv6: String,
}

/// `instanceMarketOptions` (EC2's `InstanceMarketOptionsRequest`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceMarketOptions {
    /// `marketType` (`spot` or `capacity-block`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub market_type: String,
    /// `spotOptions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_options: Option<SpotOptions>,
}

/// `instanceMarketOptions.spotOptions`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpotOptions {
    /// `maxPrice`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price: Option<String>,
    /// `spotInstanceType` (`one-time`, `persistent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_instance_type: Option<String>,
    /// `instanceInterruptionBehavior` (`hibernate`, `stop`, `terminate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_interruption_behavior: Option<String>,
}

impl AwsProviderSpec {
    /// The cluster tag key (the first key containing `kubernetes.io/cluster/`), if any.
    pub fn cluster_tag_key(&self) -> Option<&str> {
        self.tags
            .keys()
            .map(String::as_str)
            .find(|key| key.contains(CLUSTER_TAG_PREFIX))
    }

    /// The role tag key (the first key containing `kubernetes.io/role/` and not the cluster's), if any.
    pub fn role_tag_key(&self) -> Option<&str> {
        self.tags
            .keys()
            .map(String::as_str)
            .find(|key| !key.contains(CLUSTER_TAG_PREFIX) && key.contains(ROLE_TAG_PREFIX))
    }
}

/// Reads a `providerSpec` JSON value; the error names the path of the first field that does not fit
/// (`providerSpec.blockDevices[0].ebs.volumeSiz: unknown field ...`).
pub fn parse(value: &serde_json::Value) -> Result<AwsProviderSpec, String> {
    serde_path_to_error::deserialize::<_, AwsProviderSpec>(value).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner().to_string();
        if path == "." {
            format!("providerSpec: {inner}")
        } else {
            format!("providerSpec.{path}: {inner}")
        }
    })
}
