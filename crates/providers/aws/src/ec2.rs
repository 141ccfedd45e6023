//! The EC2 calls the provider makes, over [`QueryClient`]: instances described (paginated, filtered), images,
//! RunInstances, TerminateInstances, and the two InitializeMachine calls. Also credentials from the secret
//! (access keys, or a web identity token exchanged with STS).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use mcm_driver::DriverError;

use crate::client::{AwsError, QueryClient, Target, child, items, text};
use crate::sigv4::Credentials;
use crate::validation::{
    ACCESS_KEY_ID, ALT_ACCESS_KEY_ID, ALT_SECRET_ACCESS_KEY, ROLE_ARN, SECRET_ACCESS_KEY,
    WORKLOAD_IDENTITY_TOKEN_FILE, secret_value,
};

/// Instance states that count as an existing VM (the reference's filter).
pub const LIVE_STATES: [&str; 4] = ["pending", "running", "stopping", "stopped"];

/// One EC2 instance as described.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Instance {
    /// `i-...`.
    pub id: String,
    /// State name (`pending`, `running`, ...).
    pub state: String,
    /// Private DNS name (the node name).
    pub private_dns_name: String,
    /// Private IPv4 address.
    pub private_ip: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// `sourceDestCheck`, when reported.
    pub source_dest_check: Option<bool>,
    /// Attached network interfaces.
    pub network_interfaces: Vec<Eni>,
}

/// An attached network interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Eni {
    /// `eni-...`.
    pub id: String,
    /// Its device index.
    pub device_index: i64,
    /// How many IPv6 prefixes it has.
    pub ipv6_prefixes: i64,
}

/// One `Filter.N`: name and values.
pub type Filter = (String, Vec<String>);

/// EC2 of one region with one set of credentials.
#[derive(Clone, Debug)]
pub struct Ec2<'a> {
    /// The client.
    pub client: &'a QueryClient,
    /// The EC2 target (endpoint, region).
    pub target: Target,
    /// The credentials.
    pub credentials: Credentials,
}

fn instance_from(node: roxmltree::Node<'_, '_>) -> Instance {
    let tags = items(node, "tagSet")
        .into_iter()
        .map(|t| (text(t, "key").to_owned(), text(t, "value").to_owned()))
        .collect();
    let network_interfaces = items(node, "networkInterfaceSet")
        .into_iter()
        .map(|n| Eni {
            id: text(n, "networkInterfaceId").to_owned(),
            device_index: child(n, "attachment")
                .map(|a| text(a, "deviceIndex"))
                .and_then(|d| d.parse().ok())
                .unwrap_or(0),
            ipv6_prefixes: crate::params::index(items(n, "ipv6PrefixSet").len()),
        })
        .collect();
    Instance {
        id: text(node, "instanceId").to_owned(),
        state: child(node, "instanceState")
            .map(|s| text(s, "name").to_owned())
            .unwrap_or_default(),
        private_dns_name: text(node, "privateDnsName").to_owned(),
        private_ip: text(node, "privateIpAddress").to_owned(),
        tags,
        source_dest_check: match text(node, "sourceDestCheck") {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        },
        network_interfaces,
    }
}

/// Every instance of a DescribeInstances/RunInstances answer (empty when it is not XML).
pub(crate) fn instances(xml: &str) -> Vec<Instance> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return Vec::new();
    };
    doc.descendants()
        .filter(|n| n.tag_name().name() == "instancesSet")
        .flat_map(|set| {
            set.children()
                .filter(|n| n.is_element() && n.tag_name().name() == "item")
        })
        .map(instance_from)
        .collect()
}

impl Ec2<'_> {
    async fn call(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<crate::client::Answer, AwsError> {
        self.client
            .call(&self.target, Some(&self.credentials), action, params)
            .await
    }

    /// DescribeInstances with these filters and instance IDs, every page followed (`MaxResults` = `page_size`
    /// when no IDs are given).
    pub async fn describe_instances(
        &self,
        filters: &[Filter],
        ids: &[&str],
        page_size: u32,
    ) -> Result<Vec<Instance>, AwsError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = Vec::new();
            for (i, (name, values)) in filters.iter().enumerate() {
                params.push((format!("Filter.{}.Name", i + 1), name.clone()));
                for (j, v) in values.iter().enumerate() {
                    params.push((format!("Filter.{}.Value.{}", i + 1, j + 1), v.clone()));
                }
            }
            for (i, id) in ids.iter().enumerate() {
                params.push((format!("InstanceId.{}", i + 1), (*id).to_owned()));
            }
            if ids.is_empty() {
                params.push(("MaxResults".into(), page_size.to_string()));
            }
            if let Some(t) = &token {
                params.push(("NextToken".into(), t.clone()));
            }
            let answer = self.call("DescribeInstances", &params).await?;
            let doc = answer.doc("DescribeInstances")?;
            let root = doc.root_element();
            for reservation in items(root, "reservationSet") {
                out.extend(items(reservation, "instancesSet").into_iter().map(instance_from));
            }
            let next = text(root, "nextToken");
            if next.is_empty() {
                return Ok(out);
            }
            token = Some(next.to_owned());
        }
    }

    /// The root device name of an image; `None` when the image does not exist.
    pub async fn image_root_device(&self, ami: &str) -> Result<Option<String>, AwsError> {
        let answer = self
            .call("DescribeImages", &[("ImageId.1".into(), ami.into())])
            .await;
        let answer = match answer {
            Err(err) if err.code().is_some_and(|c| c.starts_with("InvalidAMIID")) => return Ok(None),
            other => other?,
        };
        let doc = answer.doc("DescribeImages")?;
        Ok(items(doc.root_element(), "imagesSet")
            .first()
            .map(|image| text(*image, "rootDeviceName").to_owned()))
    }

    /// RunInstances; the instance launched (or, for a ClientToken seen before, the one launched then).
    pub async fn run_instance(&self, params: &[(String, String)]) -> Result<Instance, AwsError> {
        let answer = self.call("RunInstances", params).await?;
        let doc = answer.doc("RunInstances")?;
        items(doc.root_element(), "instancesSet")
            .first()
            .map(|n| instance_from(*n))
            .ok_or_else(|| AwsError::Malformed {
                action: "RunInstances".into(),
                reason: "no instance in the answer".into(),
            })
    }

    /// TerminateInstances of these IDs.
    pub async fn terminate(&self, ids: &[&str]) -> Result<(), AwsError> {
        let params: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (format!("InstanceId.{}", i + 1), (*id).to_owned()))
            .collect();
        self.call("TerminateInstances", &params).await.map(|_| ())
    }

    /// Switches the source/destination check of an instance off.
    pub async fn disable_source_dest_check(&self, id: &str) -> Result<(), AwsError> {
        self.call(
            "ModifyInstanceAttribute",
            &[
                ("InstanceId".into(), id.into()),
                ("SourceDestCheck.Value".into(), "false".into()),
            ],
        )
        .await
        .map(|_| ())
    }

    /// Assigns `count` more IPv6 prefixes to a network interface.
    pub async fn assign_ipv6_prefixes(&self, eni: &str, count: i64) -> Result<(), AwsError> {
        self.call(
            "AssignIpv6Addresses",
            &[
                ("NetworkInterfaceId".into(), eni.into()),
                ("Ipv6PrefixCount".into(), count.to_string()),
            ],
        )
        .await
        .map(|_| ())
    }
}

/// Credentials from STS, by a hash of (STS endpoint, role, token), with their expiry: reused until five minutes
/// before it, so that every call does not assume the role again.
#[derive(Debug, Default)]
pub struct StsCache(std::sync::Mutex<std::collections::HashMap<String, (Credentials, jiff::Timestamp)>>);

impl StsCache {
    fn get(&self, key: &str) -> Option<Credentials> {
        let cache = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (credentials, expires) = cache.get(key)?;
        let margin = jiff::SignedDuration::from_mins(5);
        (jiff::Timestamp::now() + margin < *expires).then(|| credentials.clone())
    }

    fn put(&self, key: String, credentials: Credentials, expires: jiff::Timestamp) {
        let mut cache = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        cache.retain(|_, (_, at)| *at > jiff::Timestamp::now());
        cache.insert(key, (credentials, expires));
    }
}

/// The credentials of a secret: `providerAccessKeyId`/`accessKeyID` and `providerSecretAccessKey`/
/// `secretAccessKey`, or `workloadIdentityTokenFile` + `roleARN` exchanged with STS AssumeRoleWithWebIdentity.
/// Errors name keys, never values.
pub async fn credentials(
    client: &QueryClient,
    sts: &Target,
    cache: &StsCache,
    secret: &Secret,
) -> Result<Credentials, DriverError> {
    let string = |key: &str| secret_value(secret, key).map(|v| String::from_utf8_lossy(&v).trim().to_owned());
    if let Some(path) = string(WORKLOAD_IDENTITY_TOKEN_FILE) {
        let role = string(ROLE_ARN).ok_or_else(|| {
            DriverError::invalid_argument(format!(
                "secretRef.{ROLE_ARN}: required when workload identity is used"
            ))
        })?;
        let token = tokio::fs::read_to_string(&path).await.map_err(|err| {
            DriverError::invalid_argument(format!(
                "secretRef.{WORKLOAD_IDENTITY_TOKEN_FILE}: reading the token file {path}: {err}"
            ))
        })?;
        let key = crate::sigv4::sha256_hex(format!("{}\n{role}\n{}", sts.endpoint, token.trim()).as_bytes());
        if let Some(credentials) = cache.get(&key) {
            return Ok(credentials);
        }
        let params = [
            ("RoleArn".to_owned(), role),
            ("RoleSessionName".to_owned(), "mcm-provider-aws".to_owned()),
            ("WebIdentityToken".to_owned(), token.trim().to_owned()),
        ];
        let answer = client
            .call(sts, None, "AssumeRoleWithWebIdentity", &params)
            .await?;
        let doc = answer.doc("AssumeRoleWithWebIdentity")?;
        let creds = doc
            .descendants()
            .find(|n| n.tag_name().name() == "Credentials")
            .ok_or_else(|| {
                DriverError::internal("AssumeRoleWithWebIdentity: no credentials in the answer")
            })?;
        let credentials = Credentials {
            access_key_id: text(creds, "AccessKeyId").to_owned(),
            secret_access_key: text(creds, "SecretAccessKey").to_owned(),
            session_token: Some(text(creds, "SessionToken").to_owned()),
        };
        if let Ok(expires) = text(creds, "Expiration").parse::<jiff::Timestamp>() {
            cache.put(key, credentials.clone(), expires);
        }
        return Ok(credentials);
    }
    let access_key_id = string(ACCESS_KEY_ID).or_else(|| string(ALT_ACCESS_KEY_ID));
    let secret_access_key = string(SECRET_ACCESS_KEY).or_else(|| string(ALT_SECRET_ACCESS_KEY));
    match (access_key_id, secret_access_key) {
        (Some(access_key_id), Some(secret_access_key)) => Ok(Credentials {
            access_key_id,
            secret_access_key,
            session_token: None,
        }),
        _ => Err(DriverError::invalid_argument(format!(
            "secretRef: {ACCESS_KEY_ID} (or {ALT_ACCESS_KEY_ID}) and {SECRET_ACCESS_KEY} (or {ALT_SECRET_ACCESS_KEY}) \
             are required"
        ))),
    }
}
