//! Test support: a moto EC2 emulator (`moto_server`) on a free loopback port, owned by one test, and the objects
//! a Gardener-shaped class needs there (subnet, security group, IAM instance profile). Used by this crate's tests
//! and the CLI's; not used by the provider itself.

use std::{process::Stdio, time::Duration};

use crate::client::{QueryClient, RetryPolicy, Target};
use crate::sigv4::Credentials;

/// How to install moto, said when it is missing.
pub const INSTALL_HINT: &str = "moto's EC2 server is required by the AWS provider tests: install it with \
     `pip install 'moto[server]'` (CI's .ci/run does)";

/// The AMI moto preloads in every region (Gardener's AWS sample shape uses it too).
pub const MOTO_AMI: &str = "ami-12c6146b";

/// A running `moto_server`, killed when dropped.
#[derive(Debug)]
pub struct Moto {
    child: tokio::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    client: QueryClient,
}

/// What a class needs in moto: a default subnet, a security group, an instance profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// The subnet ID.
    pub subnet_id: String,
    /// The security group ID.
    pub security_group_id: String,
    /// The IAM instance profile's name.
    pub instance_profile: String,
}

/// Credentials moto accepts (any).
pub fn fake_credentials() -> Credentials {
    Credentials {
        access_key_id: "AKIAMCMTESTFAKE".into(),
        secret_access_key: "mcm-test-secret-access-key-never-logged".into(),
        session_token: None,
    }
}

impl Moto {
    /// Starts `moto_server` on a free port and waits (at most 60 s) until it answers. Panics with
    /// [`INSTALL_HINT`] when moto is not installed.
    ///
    /// # Panics
    /// When moto cannot be started or does not answer.
    pub async fn start() -> Self {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
            listener.local_addr().expect("local address").port()
        };
        let child = tokio::process::Command::new("moto_server")
            .args(["-p", &port.to_string(), "-H", "127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|err| panic!("starting moto_server: {err}. {INSTALL_HINT}"));
        let moto = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            client: QueryClient::new(
                RetryPolicy {
                    attempts: 1,
                    ..RetryPolicy::default()
                },
                Duration::from_secs(30),
            ),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_mins(1);
        loop {
            if moto.ec2("DescribeRegions", &[]).await.is_ok() {
                return moto;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "moto_server on port {port} did not answer within 60 s. {INSTALL_HINT}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The EC2 target of `eu-west-1` on this server.
    pub fn target(&self, service: &str) -> Target {
        let (region, version) = match service {
            "iam" => ("us-east-1", "2010-05-08"),
            _ => ("eu-west-1", crate::client::EC2_VERSION),
        };
        Target {
            endpoint: self.endpoint.clone(),
            region: region.into(),
            service: service.into(),
            version: version.into(),
        }
    }

    /// Calls an EC2 action in eu-west-1; the answer's XML.
    pub async fn ec2(&self, action: &str, params: &[(&str, &str)]) -> Result<String, crate::AwsError> {
        self.call("ec2", action, params).await
    }

    /// Calls an action of `service` (`ec2` or `iam`).
    pub async fn call(
        &self,
        service: &str,
        action: &str,
        params: &[(&str, &str)],
    ) -> Result<String, crate::AwsError> {
        let params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.client
            .call(&self.target(service), Some(&fake_credentials()), action, &params)
            .await
            .map(|a| a.xml)
    }

    /// A default subnet of eu-west-1, a new security group and the instance profile `profile`.
    ///
    /// # Panics
    /// When moto refuses one of the calls.
    pub async fn network(&self, profile: &str) -> Network {
        let subnets = self.ec2("DescribeSubnets", &[]).await.expect("DescribeSubnets");
        let subnet_id = first_text(&subnets, "subnetId").expect("a default subnet");
        let vpc_id = first_text(&subnets, "vpcId").expect("a VPC");
        let group = self
            .ec2(
                "CreateSecurityGroup",
                &[
                    ("GroupName", profile),
                    ("GroupDescription", "mcm test"),
                    ("VpcId", &vpc_id),
                ],
            )
            .await
            .expect("CreateSecurityGroup");
        let security_group_id = first_text(&group, "groupId").expect("groupId");
        self.call(
            "iam",
            "CreateInstanceProfile",
            &[("InstanceProfileName", profile)],
        )
        .await
        .expect("CreateInstanceProfile");
        Network {
            subnet_id,
            security_group_id,
            instance_profile: profile.into(),
        }
    }

    /// Stops the server now.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The text of the first element named `name` in an XML answer.
pub fn first_text(xml: &str, name: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    doc.descendants()
        .find(|n| n.tag_name().name() == name)
        .and_then(|n| n.text())
        .map(str::to_owned)
}

/// Every text of elements named `name` in an XML answer.
pub fn all_texts(xml: &str, name: &str) -> Vec<String> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return Vec::new();
    };
    doc.descendants()
        .filter(|n| n.tag_name().name() == name)
        .filter_map(|n| n.text().map(str::to_owned))
        .collect()
}

/// The instances of a DescribeInstances (or RunInstances) answer.
pub fn instances(xml: &str) -> Vec<crate::ec2::Instance> {
    crate::ec2::instances(xml)
}

/// A Gardener-shaped AWS providerSpec for `network` in eu-west-1, cluster `shoot--test`.
pub fn provider_spec(network: &Network) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "mcm.gardener.cloud/v1alpha1",
        "ami": MOTO_AMI,
        "region": "eu-west-1",
        "machineType": "m5.large",
        "iam": {"name": network.instance_profile},
        "blockDevices": [{"deviceName": "/root", "ebs": {"volumeSize": 50, "volumeType": "gp3", "deleteOnTermination": true, "encrypted": true}}],
        "networkInterfaces": [{"subnetID": network.subnet_id, "securityGroupIDs": [network.security_group_id]}],
        "tags": {
            "kubernetes.io/cluster/shoot--test": "1",
            "kubernetes.io/role/node": "1",
            "worker.gardener.cloud/pool": "workers"
        },
        "instanceMetadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2},
        "srcAndDstChecksEnabled": true
    })
}
