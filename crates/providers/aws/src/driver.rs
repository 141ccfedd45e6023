//! [`AwsDriver`]: the [`Driver`] of EC2 machines.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{NodeAddress, Secret};
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest,
    GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse, ListMachinesRequest,
    ListMachinesResponse, MachineCode,
};

use crate::client::{EC2_VERSION, QueryClient, RetryPolicy, Target};
use crate::ec2::{Ec2, Filter, Instance, LIVE_STATES};
use crate::spec::AwsProviderSpec;
use crate::validation::{USER_DATA, secret_value, validated};

/// Prefix of provider IDs: `aws:///<region>/<instance-id>`.
pub const PROVIDER_ID_PREFIX: &str = "aws:///";
/// The CSI driver whose volume handles are EBS volume IDs.
pub const CSI_DRIVER: &str = "ebs.csi.aws.com";
/// Variable overriding every AWS endpoint.
pub const ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL";
/// Variable overriding the EC2 endpoint (wins over [`ENDPOINT_ENV`]).
pub const EC2_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_EC2";
/// Variable overriding the STS endpoint (wins over [`ENDPOINT_ENV`]).
pub const STS_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_STS";

/// The optional calls this provider implements, for its gRPC identity.
pub fn optional_methods() -> Vec<DriverMethod> {
    vec![
        DriverMethod::InitializeMachine,
        DriverMethod::GetMachineStatus,
        DriverMethod::ListMachines,
        DriverMethod::GetVolumeIds,
    ]
}

/// Configuration of an [`AwsDriver`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsConfig {
    /// EC2 endpoint; `None`: `https://ec2.<region>.amazonaws.com`.
    pub ec2_endpoint: Option<String>,
    /// STS endpoint; `None`: `https://sts.<region>.amazonaws.com`.
    pub sts_endpoint: Option<String>,
    /// Retries of throttled, 5xx and unanswered calls.
    pub retry: RetryPolicy,
    /// Deadline of one HTTP exchange.
    pub call_timeout: Duration,
    /// How long CreateMachine waits for the instance's private DNS name.
    pub dns_wait: Duration,
    /// `MaxResults` of DescribeInstances pages (5 to 1000).
    pub page_size: u32,
}

impl Default for AwsConfig {
    fn default() -> Self {
        Self {
            ec2_endpoint: None,
            sts_endpoint: None,
            retry: RetryPolicy::default(),
            call_timeout: Duration::from_secs(30),
            dns_wait: Duration::from_mins(1),
            page_size: 1000,
        }
    }
}

impl AwsConfig {
    /// The defaults with the endpoints of `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL_STS` / `AWS_ENDPOINT_URL`.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// As [`Self::from_env`], reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        Self {
            ec2_endpoint: lookup(EC2_ENDPOINT_ENV).or_else(|| lookup(ENDPOINT_ENV)),
            sts_endpoint: lookup(STS_ENDPOINT_ENV).or_else(|| lookup(ENDPOINT_ENV)),
            ..Self::default()
        }
    }
}

/// The EC2 provider. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AwsDriver {
    config: AwsConfig,
    client: QueryClient,
    sts_cache: std::sync::Arc<crate::ec2::StsCache>,
}

/// The provider ID of an instance.
pub fn provider_id(region: &str, instance_id: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{region}/{instance_id}")
}

/// The instance ID of a provider ID (its last segment, when it is `i-...`).
pub fn instance_id(provider_id: &str) -> Option<&str> {
    provider_id
        .strip_prefix("aws://")
        .and_then(|rest| rest.rsplit('/').next())
        .filter(|id| id.starts_with("i-"))
}

/// The RunInstances ClientToken of a machine: a hash of its namespace, name and UID, plus a generation that is
/// raised only when the instance of the previous token is gone. At most 64 characters, as EC2 allows.
pub fn client_token(machine: &Machine, generation: u32) -> String {
    let identity = format!(
        "{}/{}/{}",
        machine.metadata.namespace.as_deref().unwrap_or(""),
        machine.metadata.name.as_deref().unwrap_or(""),
        machine.metadata.uid.as_deref().unwrap_or("")
    );
    format!(
        "mcm-{}-{generation}",
        &crate::sigv4::sha256_hex(identity.as_bytes())[..48]
    )
}

fn machine_name(machine: &Machine) -> Result<&str, DriverError> {
    machine
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| DriverError::invalid_argument("machine.metadata.name: required"))
}

fn addresses(instance: &Instance) -> Vec<NodeAddress> {
    let mut out = Vec::new();
    if !instance.private_ip.is_empty() {
        out.push(NodeAddress {
            type_: "InternalIP".into(),
            address: instance.private_ip.clone(),
        });
    }
    if !instance.private_dns_name.is_empty() {
        out.push(NodeAddress {
            type_: "InternalDNS".into(),
            address: instance.private_dns_name.clone(),
        });
        out.push(NodeAddress {
            type_: "Hostname".into(),
            address: instance.private_dns_name.clone(),
        });
    }
    out
}

/// Whether an instance carries the class's cluster and role tag keys. Checked here as well as in the filters:
/// two `tag-key` filters must both hold, and an emulator that merges them must not widen the answer.
fn has_cluster_tags(spec: &AwsProviderSpec, instance: &Instance) -> bool {
    [spec.cluster_tag_key(), spec.role_tag_key()]
        .into_iter()
        .flatten()
        .all(|key| instance.tags.contains_key(key))
}

/// What InitializeMachine still has to do on an instance (empty: initialized).
fn pending_initialization(spec: &AwsProviderSpec, instance: &Instance) -> Vec<String> {
    let mut out = Vec::new();
    if spec.src_and_dst_checks_enabled == Some(false) && instance.source_dest_check == Some(true) {
        out.push("source/destination check still enabled".to_owned());
    }
    for (i, ni) in spec.network_interfaces.iter().enumerate() {
        let Some(want) = ni.ipv6_prefix_count.filter(|n| *n > 0) else {
            continue;
        };
        let index = ni.device_index.unwrap_or_else(|| crate::params::index(i));
        let have = instance
            .network_interfaces
            .iter()
            .find(|e| e.device_index == index)
            .map_or(0, |e| e.ipv6_prefixes);
        if have < want {
            out.push(format!(
                "network interface {index} has {have} of {want} IPv6 prefixes"
            ));
        }
    }
    out
}

impl AwsDriver {
    /// A driver with this configuration.
    pub fn new(config: AwsConfig) -> Self {
        let client = QueryClient::new(config.retry, config.call_timeout);
        Self {
            config,
            client,
            sts_cache: std::sync::Arc::default(),
        }
    }

    /// The provider-side cloud API metrics (`mcm_cloud_api_*`) of this driver's requests.
    pub fn metrics(&self) -> std::sync::Arc<crate::metrics::CloudApiMetrics> {
        self.client.metrics()
    }

    fn target(&self, service: &str, region: &str) -> Target {
        let (endpoint, version) = match service {
            "sts" => (self.config.sts_endpoint.clone(), "2011-06-15"),
            _ => (self.config.ec2_endpoint.clone(), EC2_VERSION),
        };
        Target {
            endpoint: endpoint.unwrap_or_else(|| format!("https://{service}.{region}.amazonaws.com")),
            region: region.to_owned(),
            service: service.to_owned(),
            version: version.to_owned(),
        }
    }

    async fn ec2(&self, region: &str, secret: &Secret) -> Result<Ec2<'_>, DriverError> {
        let credentials =
            crate::ec2::credentials(&self.client, &self.target("sts", region), &self.sts_cache, secret)
                .await?;
        Ok(Ec2 {
            client: &self.client,
            target: self.target("ec2", region),
            credentials,
        })
    }

    /// The live instances of a machine: by its Name, cluster and role tags, else by its provider ID.
    async fn find(
        &self,
        ec2: &Ec2<'_>,
        spec: &AwsProviderSpec,
        machine: &Machine,
    ) -> Result<Vec<Instance>, DriverError> {
        let name = machine_name(machine)?;
        let mut filters: Vec<Filter> = vec![("tag:Name".into(), vec![name.to_owned()])];
        for key in [spec.cluster_tag_key(), spec.role_tag_key()]
            .into_iter()
            .flatten()
        {
            filters.push(("tag-key".into(), vec![key.to_owned()]));
        }
        filters.push((
            "instance-state-name".into(),
            LIVE_STATES.map(String::from).to_vec(),
        ));
        let mut found = ec2
            .describe_instances(&filters, &[], self.config.page_size)
            .await?;
        found.retain(|i| has_cluster_tags(spec, i));
        if !found.is_empty() {
            return Ok(found);
        }
        let Some(id) = Some(machine.spec.provider_id.as_str()).and_then(instance_id) else {
            return Ok(found);
        };
        let states: Filter = (
            "instance-state-name".into(),
            LIVE_STATES.map(String::from).to_vec(),
        );
        match ec2
            .describe_instances(&[states], &[id], self.config.page_size)
            .await
        {
            Err(err) if err.machine_code() == MachineCode::NotFound => Ok(Vec::new()),
            other => Ok(other?),
        }
    }

    /// Exactly one live instance of a machine: `NotFound` for none, `OutOfRange` for several.
    async fn find_one(
        &self,
        ec2: &Ec2<'_>,
        spec: &AwsProviderSpec,
        machine: &Machine,
    ) -> Result<Instance, DriverError> {
        let name = machine_name(machine)?;
        let mut found = self.find(ec2, spec, machine).await?;
        match found.len() {
            0 => Err(DriverError::not_found(format!(
                "no instance of machine {name} in {}",
                spec.region
            ))),
            1 => Ok(found.remove(0)),
            n => Err(DriverError::new(
                MachineCode::OutOfRange,
                format!(
                    "{n} instances of machine {name}: {}",
                    found.iter().map(|i| i.id.as_str()).collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }

    /// Waits (bounded, with back-off) until an instance has its private DNS name.
    async fn wait_for_dns(&self, ec2: &Ec2<'_>, mut instance: Instance) -> Result<Instance, DriverError> {
        let deadline = tokio::time::Instant::now() + self.config.dns_wait;
        let mut pause = Duration::from_millis(250);
        while instance.private_dns_name.is_empty() {
            if tokio::time::Instant::now() + pause > deadline {
                return Err(DriverError::new(
                    MachineCode::Unavailable,
                    format!(
                        "instance {} has no private DNS name after {:?}; a retry adopts it",
                        instance.id, self.config.dns_wait
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
            let id = instance.id.clone();
            if let Some(found) = ec2
                .describe_instances(&[], &[&id], self.config.page_size)
                .await?
                .into_iter()
                .next()
            {
                instance = found;
            }
        }
        Ok(instance)
    }

    fn spec(class: &MachineClass, secret: &Secret) -> Result<AwsProviderSpec, DriverError> {
        validated(&class.provider_spec, secret)
    }
}

#[async_trait]
impl Driver for AwsDriver {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let spec = Self::spec(&request.machine_class, &request.secret)?;
        let name = machine_name(&request.machine)?;
        let user_data = secret_value(&request.secret, USER_DATA)
            .ok_or_else(|| DriverError::invalid_argument(format!("secretRef.{USER_DATA}: required")))?;
        let ec2 = self.ec2(&spec.region, &request.secret).await?;
        let mut existing = self.find(&ec2, &spec, &request.machine).await?;
        let instance = if existing.len() > 1 {
            return Err(DriverError::new(
                MachineCode::OutOfRange,
                format!("{} instances of machine {name} exist already", existing.len()),
            ));
        } else if let Some(instance) = existing.pop() {
            tracing::info!(machine = name, instance_id = %instance.id, "instance of the machine exists; adopted");
            instance
        } else {
            let root = ec2.image_root_device(&spec.ami).await?.ok_or_else(|| {
                DriverError::not_found(format!(
                    "providerSpec.ami: image {} not found in {}",
                    spec.ami, spec.region
                ))
            })?;
            let mut generation = 0;
            loop {
                let token = client_token(&request.machine, generation);
                let params = crate::params::run_instances(&spec, name, &root, &user_data, &token);
                let instance = ec2.run_instance(&params).await?;
                if matches!(instance.state.as_str(), "shutting-down" | "terminated") && generation < 3 {
                    // The token's instance is gone (an earlier VM of this machine): launch a new one.
                    generation += 1;
                    continue;
                }
                tracing::info!(machine = name, instance_id = %instance.id, region = %spec.region, "instance launched");
                break instance;
            }
        };
        let instance = self.wait_for_dns(&ec2, instance).await?;
        Ok(CreateMachineResponse {
            provider_id: provider_id(&spec.region, &instance.id),
            node_name: instance.private_dns_name.clone(),
            last_known_state: String::new(),
            addresses: addresses(&instance),
        })
    }

    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        let spec = Self::spec(&request.machine_class, &request.secret)?;
        let ec2 = self.ec2(&spec.region, &request.secret).await?;
        let instance = self.find_one(&ec2, &spec, &request.machine).await?;
        if spec.src_and_dst_checks_enabled == Some(false) && instance.source_dest_check != Some(false) {
            ec2.disable_source_dest_check(&instance.id).await?;
        }
        for (i, ni) in spec.network_interfaces.iter().enumerate() {
            let Some(want) = ni.ipv6_prefix_count.filter(|n| *n > 0) else {
                continue;
            };
            let index = ni.device_index.unwrap_or_else(|| crate::params::index(i));
            if let Some(eni) = instance
                .network_interfaces
                .iter()
                .find(|e| e.device_index == index)
                && eni.ipv6_prefixes < want
            {
                ec2.assign_ipv6_prefixes(&eni.id, want - eni.ipv6_prefixes)
                    .await?;
            }
        }
        Ok(InitializeMachineResponse {
            provider_id: provider_id(&spec.region, &instance.id),
            node_name: instance.private_dns_name.clone(),
            addresses: addresses(&instance),
        })
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let spec = Self::spec(&request.machine_class, &request.secret)?;
        let ec2 = self.ec2(&spec.region, &request.secret).await?;
        let ids: Vec<String> = match Some(request.machine.spec.provider_id.as_str()).and_then(instance_id) {
            Some(id) => vec![id.to_owned()],
            None => self
                .find(&ec2, &spec, &request.machine)
                .await?
                .into_iter()
                .map(|i| i.id)
                .collect(),
        };
        for id in &ids {
            match ec2.terminate(&[id]).await {
                Err(err) if err.machine_code() == MachineCode::NotFound => {}
                other => other?,
            }
            tracing::info!(machine = ?request.machine.metadata.name, instance_id = %id, "instance terminated");
        }
        Ok(DeleteMachineResponse::default())
    }

    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let spec = Self::spec(&request.machine_class, &request.secret)?;
        let ec2 = self.ec2(&spec.region, &request.secret).await?;
        let instance = self.find_one(&ec2, &spec, &request.machine).await?;
        let pending = pending_initialization(&spec, &instance);
        if !pending.is_empty() {
            return Err(DriverError::new(
                MachineCode::Uninitialized,
                format!(
                    "instance {} is not initialized: {}",
                    instance.id,
                    pending.join("; ")
                ),
            ));
        }
        Ok(GetMachineStatusResponse {
            provider_id: provider_id(&spec.region, &instance.id),
            node_name: instance.private_dns_name.clone(),
            addresses: addresses(&instance),
        })
    }

    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let spec = Self::spec(&request.machine_class, &request.secret)?;
        let ec2 = self.ec2(&spec.region, &request.secret).await?;
        let mut filters: Vec<Filter> = Vec::new();
        for key in [spec.cluster_tag_key(), spec.role_tag_key()]
            .into_iter()
            .flatten()
        {
            filters.push(("tag-key".into(), vec![key.to_owned()]));
        }
        filters.push((
            "instance-state-name".into(),
            LIVE_STATES.map(String::from).to_vec(),
        ));
        let instances = ec2
            .describe_instances(&filters, &[], self.config.page_size)
            .await?;
        Ok(ListMachinesResponse {
            machine_list: instances
                .into_iter()
                .filter(|i| has_cluster_tags(&spec, i))
                .map(|i| {
                    let name = i.tags.get("Name").cloned().unwrap_or_default();
                    (provider_id(&spec.region, &i.id), name)
                })
                .collect(),
        })
    }

    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        let volume_ids = request
            .pv_specs
            .iter()
            .filter_map(|pv| {
                if let Some(ebs) = &pv.aws_elastic_block_store {
                    Some(ebs.volume_id.clone())
                } else {
                    pv.csi
                        .as_ref()
                        .filter(|csi| csi.driver == CSI_DRIVER)
                        .map(|csi| csi.volume_handle.clone())
                }
            })
            .collect();
        Ok(GetVolumeIdsResponse { volume_ids })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip_and_tokens_fit_ec2() {
        let id = provider_id("eu-west-1", "i-0abc");
        assert_eq!(id, "aws:///eu-west-1/i-0abc");
        assert_eq!(instance_id(&id), Some("i-0abc"));
        assert_eq!(instance_id("aws:///eu-west-1/"), None);
        assert_eq!(instance_id("sim:///x/i-1"), None);
        let mut machine = Machine::default();
        machine.metadata.name = Some("m".into());
        let token = client_token(&machine, 0);
        assert!(token.len() <= 64, "{token}");
        assert_eq!(token, client_token(&machine, 0));
        assert_ne!(token, client_token(&machine, 1));
    }

    #[test]
    fn endpoints_come_from_the_standard_variables() {
        let config = AwsConfig::from_lookup(|name| match name {
            "AWS_ENDPOINT_URL" => Some("http://all".into()),
            "AWS_ENDPOINT_URL_EC2" => Some("http://ec2".into()),
            _ => None,
        });
        assert_eq!(config.ec2_endpoint.as_deref(), Some("http://ec2"));
        assert_eq!(config.sts_endpoint.as_deref(), Some("http://all"));
    }
}
