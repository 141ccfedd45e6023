//! Test support: a moto EC2 emulator (`moto_server`) on a free loopback port, owned by one test, and the objects
//! a Gardener-shaped class needs there (subnet, security group, IAM instance profile). Used by this crate's tests
//! and the CLI's; not used by the provider itself.

use std::{
    collections::{BTreeMap, VecDeque},
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

// ---- A fake EC2 for faults moto cannot produce ----

/// The text a fake error answer's `Message` carries: values a careless provider would repeat (AWS's messages may
/// echo request parameters). Tests check that no error of ours contains them.
pub const ECHO: &str = "echoed: fake-secret-access-key-never-shown user-data-never-shown";

/// What the fake does with one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Answer this status and body.
    Answer(u16, String),
    /// Close the connection without answering.
    Drop,
    /// Answer after this delay.
    Slow(Duration, u16, String),
}

/// An EC2 error answer with this code (request ID `req-<code>`).
pub fn error_xml(code: &str) -> String {
    format!(
        "<?xml version=\"1.0\"?><Response><Errors><Error><Code>{code}</Code><Message>{ECHO}</Message></Error></Errors>\
         <RequestID>req-{code}</RequestID></Response>"
    )
}

/// A DescribeInstances answer with no instance.
pub const NO_INSTANCES: &str = "<DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>";
/// A DescribeImages answer: one image whose root device is `/dev/xvda`.
pub const IMAGE: &str = "<DescribeImagesResponse><imagesSet><item><rootDeviceName>/dev/xvda</rootDeviceName></item></imagesSet></DescribeImagesResponse>";
/// A RunInstances answer: instance `i-0fake` with its private DNS name.
pub const LAUNCHED: &str = "<RunInstancesResponse><instancesSet><item><instanceId>i-0fake</instanceId>\
    <instanceState><name>pending</name></instanceState><privateDnsName>ip-10-0-0-1.eu-west-1.compute.internal\
    </privateDnsName><privateIpAddress>10.0.0.1</privateIpAddress></item></instancesSet></RunInstancesResponse>";

/// The fake EC2: per action a queue of replies (the last one repeats), and every request's form fields.
/// One request to the fake: when it came, and its form fields.
pub type Request = (Instant, BTreeMap<String, String>);

/// A fake EC2 on loopback: per action a queue of scripted replies (the last one repeats); records every request.
#[derive(Clone, Debug, Default)]
pub struct FakeEc2 {
    script: Arc<Mutex<BTreeMap<String, VecDeque<Reply>>>>,
    seen: Arc<Mutex<Vec<Request>>>,
}

impl FakeEc2 {
    /// Scripts the replies to `action`; the last one repeats.
    ///
    /// # Panics
    /// When a test thread panicked while holding the script.
    pub fn on(&self, action: &str, replies: Vec<Reply>) {
        self.script.lock().unwrap().insert(action.into(), replies.into());
    }

    fn reply(&self, action: &str) -> Reply {
        let mut script = self.script.lock().unwrap();
        let queue = script.get_mut(action).expect("a scripted action");
        if queue.len() > 1 {
            queue.pop_front().unwrap()
        } else {
            queue.front().cloned().unwrap()
        }
    }

    /// The form fields of every request of `action` so far, with when it came.
    ///
    /// # Panics
    /// When a test thread panicked while holding the record.
    pub fn calls(&self, action: &str) -> Vec<Request> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, f)| f.get("Action").map(String::as_str) == Some(action))
            .cloned()
            .collect()
    }

    /// Serves on a free loopback port; the endpoint URL.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let fake = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let fake = fake.clone();
                tokio::spawn(async move {
                    loop {
                        let Some(body) = read_request(&mut stream).await else {
                            return;
                        };
                        let form: BTreeMap<String, String> =
                            form_urlencoded::parse(body.as_bytes()).into_owned().collect();
                        let action = form.get("Action").cloned().unwrap_or_default();
                        fake.seen.lock().unwrap().push((Instant::now(), form));
                        let (status, body) = match fake.reply(&action) {
                            Reply::Drop => return,
                            Reply::Answer(status, body) => (status, body),
                            Reply::Slow(delay, status, body) => {
                                tokio::time::sleep(delay).await;
                                (status, body)
                            }
                        };
                        let answer = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: text/xml\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{address}")
    }
}

/// Reads one HTTP/1.1 request; its body.
/// Reads one HTTP/1.1 request; its body.
async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buffer.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buffer.extend_from_slice(&chunk[..n]);
            }
            return Some(String::from_utf8_lossy(&buffer[end + 4..end + 4 + length]).into_owned());
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}
