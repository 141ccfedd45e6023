//! End to end on moto: `mcm apiserver` + `mcm run --provider-endpoint` + `mcm provider aws serve`, with
//! examples/aws (only the subnet and security group IDs put in). A simulated kubelet registers a Node for every
//! running instance as a real one would: named by the instance's private DNS name, with its providerID. Checked:
//! a VM the reference created is adopted by the Machine of its name; a MachineDeployment of 3 yields three tagged
//! instances and Running machines; a roll replaces all three; scale to 0 terminates them; an instance created
//! outside with the cluster's tags is collected as an orphan; nothing secret reaches the logs.

use crate::support;

use std::{
    collections::BTreeSet,
    path::PathBuf,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use mcm_api::builders::NodeBuilder;
use mcm_provider_aws::testing::{Moto, all_texts};
use support::{Background, Server, mcm_run_command};

const DEADLINE: Duration = Duration::from_secs(90);
const CLUSTER_TAG: &str = "kubernetes.io/cluster/shoot--example";
/// What examples/aws/00-secret.yaml holds: the access key pair, the userData (plain and base64).
const SECRETS: [&str; 4] = [
    "AKIAIOSFODNN7EXAMPLE",
    "wJalrXUtnFEMI",
    "bootstrap the kubelet",
    "IyEvYmluL2Jhc2gK",
];

fn examples_aws(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/aws")
        .join(file)
}

/// Live (pending or running) instances of the example's cluster: (id, Name tag, private DNS name).
async fn live_instances(moto: &Moto) -> Vec<(String, String, String)> {
    let xml = moto
        .ec2(
            "DescribeInstances",
            &[
                ("Filter.1.Name", "instance-state-name"),
                ("Filter.1.Value.1", "pending"),
                ("Filter.1.Value.2", "running"),
            ],
        )
        .await
        .expect("DescribeInstances");
    mcm_provider_aws::testing::instances(&xml)
        .into_iter()
        .filter(|i| i.tags.contains_key(CLUSTER_TAG))
        .map(|i| {
            let name = i.tags.get("Name").cloned().unwrap_or_default();
            (i.id, name, i.private_dns_name)
        })
        .collect()
}

/// The simulated kubelet: every second, a Node (name = private DNS name, providerID) for every live instance, its
/// Ready condition heartbeated; and the cloud node lifecycle controller: Nodes of gone instances deleted.
async fn kubelet(moto: Arc<Moto>, client: Client, stop: Arc<AtomicBool>) {
    let nodes: Api<Node> = Api::all(client);
    while !stop.load(Ordering::SeqCst) {
        let live = live_instances(&moto).await;
        // As the cloud node lifecycle controller does: a Node whose instance is gone is deleted (moto hands a
        // terminated instance's private IP, and so its DNS name, to the next instance at once).
        if let Ok(list) = nodes.list(&kube::api::ListParams::default()).await {
            for node in list {
                let provider_id = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.provider_id.clone())
                    .unwrap_or_default();
                if !live
                    .iter()
                    .any(|(id, _, _)| provider_id == format!("aws:///eu-west-1/{id}"))
                {
                    let name = node.metadata.name.unwrap_or_default();
                    let _ = nodes.delete(&name, &kube::api::DeleteParams::default()).await;
                }
            }
        }
        for (id, _, dns) in live {
            if dns.is_empty() {
                continue;
            }
            if matches!(nodes.get_opt(&dns).await, Ok(None)) {
                let node = NodeBuilder::new(&dns)
                    .label("kubernetes.io/hostname", &dns)
                    .provider_id(&format!("aws:///eu-west-1/{id}"))
                    .build();
                let _ = nodes.create(&PostParams::default(), &node).await;
            }
            let now = k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let status = serde_json::json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated",
                "lastHeartbeatTime": now, "lastTransitionTime": now
            }]}});
            let _ = nodes
                .patch_status(&dns, &PatchParams::default(), &Patch::Merge(&status))
                .await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits (with a deadline) until `probe` answers `Some`.
/// What the last probe saw, shown when a wait times out.
static LAST: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

type LogsFn = Box<dyn Fn() -> String + Send>;
static LOGS: std::sync::Mutex<Option<LogsFn>> = std::sync::Mutex::new(None);

fn saw(what: String) {
    *LAST.lock().unwrap() = what;
}

async fn until<T, F: Future<Output = Option<T>>>(what: &str, mut probe: impl FnMut() -> F) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            let logs = LOGS.lock().unwrap().as_ref().map(|f| f()).unwrap_or_default();
            let lines: Vec<&str> = logs
                .lines()
                .filter(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE "))
                .collect();
            panic!(
                "timed out waiting for {what}; last seen: {}\nmcm run's last log lines:\n{}",
                LAST.lock().unwrap(),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Machines as `name phase providerID node` lines.
fn machines(server: &Server) -> Vec<(String, String, String, String)> {
    server
        .kubectl_ok(&[
            "get",
            "machines",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.currentStatus.phase} {.spec.providerID} \
             {.metadata.labels.node}{\"\\n\"}{end}",
        ])
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some((
                f.next()?.to_owned(),
                f.next().unwrap_or("").to_owned(),
                f.next().unwrap_or("").to_owned(),
                f.next().unwrap_or("").to_owned(),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::too_many_lines)] // one story, step by step
async fn a_machine_deployment_of_three_on_moto_rolls_scales_to_zero_and_collects_orphans() {
    let moto = Arc::new(Moto::start().await);
    let network = moto.network("shoot--example-nodes").await;
    let server = Server::start("aws-e2e");
    let class = std::fs::read_to_string(examples_aws("01-machine-class.yaml"))
        .unwrap()
        .replace("subnet-0123456789abcdef0", &network.subnet_id)
        .replace("sg-0123456789abcdef0", &network.security_group_id);
    let class_file = server.write("01-machine-class.yaml", &class);

    let endpoint = format!("unix://{}", server.dir.join("aws.sock").display());
    let mut provider = Command::new(env!("CARGO_BIN_EXE_mcm"));
    provider
        .args(["provider", "aws", "serve", "--endpoint", &endpoint])
        .env("AWS_ENDPOINT_URL", &moto.endpoint)
        .env("MC_LOG_LEVEL", "trace");
    let provider = Background::spawn(provider, "mcm provider aws serve".into());
    provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));
    let mut run = mcm_run_command(&server, &["--provider-endpoint", &endpoint]);
    run.args([
        "--leader-elect=false",
        "--machine-safety-orphan-vms-period=2s",
        "--machine-safety-orphan-vms-grace=3s",
        "--v=4",
    ]);
    let run = Arc::new(Background::spawn(run, "mcm run".into()));
    {
        let run = run.clone();
        *LOGS.lock().unwrap() = Some(Box::new(move || run.stderr()));
    }

    let file = Kubeconfig::read_from(server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet = tokio::spawn(kubelet(moto.clone(), client, stop.clone()));

    server.kubectl_ok(&["apply", "-f", support::arg(&examples_aws("00-secret.yaml"))]);
    server.kubectl_ok(&["apply", "-f", support::arg(&class_file)]);

    // A VM "the reference" created for machine adopted-0 (its tags and Name) is adopted, not duplicated.
    let theirs = {
        let params = [
            ("ImageId", mcm_provider_aws::testing::MOTO_AMI),
            ("InstanceType", "m5.large"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("SubnetId", network.subnet_id.as_str()),
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", "Name"),
            ("TagSpecification.1.Tag.1.Value", "adopted-0"),
            ("TagSpecification.1.Tag.2.Key", CLUSTER_TAG),
            ("TagSpecification.1.Tag.2.Value", "1"),
            ("TagSpecification.1.Tag.3.Key", "kubernetes.io/role/node"),
            ("TagSpecification.1.Tag.3.Value", "1"),
        ];
        let xml = moto.ec2("RunInstances", &params).await.unwrap();
        mcm_provider_aws::testing::first_text(&xml, "instanceId").unwrap()
    };
    let machine = server.write(
        "adopted.yaml",
        "apiVersion: machine.sapcloud.io/v1alpha1\nkind: Machine\nmetadata:\n  name: adopted-0\n  namespace: default\n\
         spec:\n  class:\n    kind: MachineClass\n    name: aws-workers\n",
    );
    server.kubectl_ok(&["apply", "-f", support::arg(&machine)]);
    let provider_id = until("machine adopted-0 Running", || {
        let found = machines(&server);
        async move {
            found
                .iter()
                .find(|m| m.0 == "adopted-0" && m.1 == "Running")
                .map(|m| m.2.clone())
        }
    })
    .await;
    assert_eq!(
        provider_id,
        format!("aws:///eu-west-1/{theirs}"),
        "adopted the reference's VM"
    );
    let adopted: Vec<_> = live_instances(&moto)
        .await
        .into_iter()
        .filter(|i| i.1 == "adopted-0")
        .collect();
    assert_eq!(adopted.len(), 1, "not duplicated: {adopted:?}");
    server.kubectl_ok(&["delete", "machine", "adopted-0", "--wait=true", "--timeout=60s"]);

    // The error path: a class with an unknown AMI; the machine's status says so, naming the field, and carries no
    // secret (nor does any Event or object).
    let broken_class = class
        .replace("name: aws-workers", "name: aws-broken")
        .replace("ami-12c6146b", "ami-00000000000000000");
    server.kubectl_ok(&[
        "apply",
        "-f",
        support::arg(&server.write("broken-class.yaml", &broken_class)),
    ]);
    let broken = server.write(
        "broken.yaml",
        "apiVersion: machine.sapcloud.io/v1alpha1\nkind: Machine\nmetadata:\n  name: broken-0\n  namespace: default\n\
         spec:\n  class:\n    kind: MachineClass\n    name: aws-broken\n",
    );
    server.kubectl_ok(&["apply", "-f", support::arg(&broken)]);
    until("broken-0 reports the unknown AMI", || {
        let description = server.kubectl_ok(&[
            "get",
            "machine",
            "broken-0",
            "-o",
            "jsonpath={.status.lastOperation.description}",
        ]);
        async move { description.contains("providerSpec.ami").then_some(()) }
    })
    .await;
    let objects = server.kubectl_ok(&["get", "machines,events", "-A", "-o", "yaml"]);
    for secret in SECRETS {
        assert!(!objects.contains(secret), "{secret} in an object or Event");
    }
    server.kubectl_ok(&["delete", "machine", "broken-0", "--wait=true", "--timeout=60s"]);

    // Three machines of the deployment, each on an instance tagged with its name, its node the private DNS name.
    server.kubectl_ok(&[
        "apply",
        "-f",
        support::arg(&examples_aws("30-machine-deployment.yaml")),
    ]);
    let first = until("three Running machines with their instances", || {
        let found = machines(&server);
        let moto = moto.clone();
        async move {
            let instances = live_instances(&moto).await;
            saw(format!("machines {found:?}, instances {instances:?}"));
            let running: Vec<_> = found.iter().filter(|m| m.1 == "Running").cloned().collect();
            (running.len() == 3 && found.len() == 3 && instances.len() == 3).then_some((running, instances))
        }
    })
    .await;
    let (running, instances) = first;
    for (name, _, provider_id, node) in &running {
        let instance = instances
            .iter()
            .find(|i| provider_id.ends_with(&format!("/{}", i.0)))
            .unwrap_or_else(|| panic!("{name}: no instance {provider_id} in {instances:?}"));
        assert_eq!(&instance.1, name, "the instance is tagged Name={name}");
        assert_eq!(&instance.2, node, "the node name is the private DNS name");
        assert!(provider_id.starts_with("aws:///eu-west-1/i-"), "{provider_id}");
    }
    let old: BTreeSet<String> = running.iter().map(|m| m.0.clone()).collect();

    // A roll replaces all three.
    server.kubectl_ok(&[
        "patch",
        "machinedeployment",
        "aws-workers",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"metadata":{"labels":{"pool":"aws-workers","rev":"2"}}}}}"#,
    ]);
    until("three new Running machines and only their instances", || {
        let found = machines(&server);
        let moto = moto.clone();
        let old = old.clone();
        async move {
            let instances = live_instances(&moto).await;
            saw(format!("machines {found:?}, instances {instances:?}"));
            let fresh = found
                .iter()
                .filter(|m| !old.contains(&m.0) && m.1 == "Running")
                .count();
            let names: BTreeSet<_> = instances.iter().map(|i| i.1.clone()).collect();
            (fresh == 3 && found.len() == 3 && instances.len() == 3 && names.is_disjoint(&old)).then_some(())
        }
    })
    .await;

    // Scale to 0 terminates every instance.
    server.kubectl_ok(&[
        "patch",
        "machinedeployment",
        "aws-workers",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":0}}"#,
    ]);
    until("no machine and no instance", || {
        let found = machines(&server);
        let moto = moto.clone();
        async move { (found.is_empty() && live_instances(&moto).await.is_empty()).then_some(()) }
    })
    .await;

    // An instance created outside with the cluster's tags and no machine is collected as an orphan.
    let orphan = {
        let params = [
            ("ImageId", mcm_provider_aws::testing::MOTO_AMI),
            ("InstanceType", "m5.large"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", "Name"),
            ("TagSpecification.1.Tag.1.Value", "orphan-vm"),
            ("TagSpecification.1.Tag.2.Key", CLUSTER_TAG),
            ("TagSpecification.1.Tag.2.Value", "1"),
            ("TagSpecification.1.Tag.3.Key", "kubernetes.io/role/node"),
            ("TagSpecification.1.Tag.3.Value", "1"),
        ];
        let xml = moto.ec2("RunInstances", &params).await.unwrap();
        mcm_provider_aws::testing::first_text(&xml, "instanceId").unwrap()
    };
    until("the orphan terminated", || {
        let moto = moto.clone();
        let orphan = orphan.clone();
        async move {
            let xml = moto
                .ec2("DescribeInstances", &[("InstanceId.1", &orphan)])
                .await
                .ok()?;
            all_texts(&xml, "name")
                .iter()
                .any(|s| s == "terminated" || s == "shutting-down")
                .then_some(())
        }
    })
    .await;

    stop.store(true, Ordering::SeqCst);
    let _ = kubelet.await;
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&provider.stop().stderr),
        String::from_utf8_lossy(&{
            LOGS.lock().unwrap().take();
            Arc::try_unwrap(run)
                .ok()
                .expect("the log reader let go of mcm run")
                .stop()
                .stderr
        })
    );
    for secret in SECRETS {
        assert!(!logs.contains(secret), "{secret} in the logs");
    }
    drop(server);
    Arc::try_unwrap(moto)
        .expect("the kubelet let go of moto")
        .stop()
        .await;
}
