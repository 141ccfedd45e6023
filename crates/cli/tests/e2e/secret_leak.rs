//! End to end: no secret value ever reaches a log line, an Event, an object's status, an error or a metric.
//!
//! Canaries sit in every place a secret lives: the userData, cloud credentials in the class's secret, a separate
//! credentials secret (`credentialsSecretRef`), a secret without userData that makes machines fail (the error path),
//! the bootstrap tokens the controller creates for the machines, and the API server's admin token — and in a Secret
//! whose `data` is not base64 (as the reference AWS provider's sample secret), stored as a real cluster can hold it
//! (the API server's `--test-raw-object` hook). The provider echoes every request in its first answer to each call
//! (`--echo-requests`: secret values, rendered userData and bootstrap token, raw and base64), as some cloud APIs
//! do. The whole lifecycle runs (a deployment created, rolled, scaled down, failing machines deleted) with `mcm run`
//! logging at trace level in JSON, the provider out of process logging at trace level too; then every log, Event,
//! status and the metrics are searched for each canary, as it is, base64-encoded, and inside every base64-looking
//! run of text, decoded.
//!
//! The AWS provider runs the same search on its own lifecycle against moto's EC2 (out of process, at trace
//! level): canary credentials and userData in the class's Secret, a machine created and deleted, a class whose AMI
//! does not exist.

use crate::support;

use std::time::Duration;

use base64::Engine as _;
use support::{
    Background, CONDITION_DEADLINE, Server, address_of, arg, get, mcm_run_command, poll, start_sim_provider,
};

const USER_DATA_CANARY: &str = "userdata-canary-7f3a91c0";
const ACCESS_KEY_CANARY: &str = "akid-canary-51c2e8d7";
const SECRET_KEY_CANARY: &str = "sak-canary-9d04b6a3";
const CREDENTIALS_CANARY: &str = "pk-canary-e6b8f215";
const BROKEN_CANARY: &str = "pw-canary-22aa4c19";
const PLAIN_USER_DATA_CANARY: &str = "plain-userdata-canary-0b7e4d21";
const PLAIN_KEY_CANARY: &str = "AKIA-plain-text-canary-6c1f";

/// The Secret whose `data` values are not base64 (as the reference AWS provider's sample secret), as JSON: stored
/// as it is by the API server's test hook, as a real cluster can hold it.
fn plain_text_secret() -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": "leak-plaintext", "namespace": "default" },
        "type": "Opaque",
        "data": {
            "userData": format!("#!/bin/bash\necho {PLAIN_USER_DATA_CANARY}"),
            "providerAccessKeyId": PLAIN_KEY_CANARY,
        },
    })
    .to_string()
}

#[allow(clippy::too_many_lines)] // one YAML document
fn manifests() -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata:
  name: leak-worker
  namespace: default
type: Opaque
stringData:
  userData: |
    #!/bin/sh
    # {USER_DATA_CANARY}
    exec mcm node-agent --node-name "<<MACHINE_NAME>>" --bootstrap-token "<<BOOTSTRAP_TOKEN>>"
  providerAccessKeyId: {ACCESS_KEY_CANARY}
  providerSecretAccessKey: {SECRET_KEY_CANARY}
---
apiVersion: v1
kind: Secret
metadata:
  name: leak-credentials
  namespace: default
type: Opaque
stringData:
  serviceaccount.json: '{{"private_key": "{CREDENTIALS_CANARY}"}}'
---
apiVersion: v1
kind: Secret
metadata:
  name: leak-no-userdata
  namespace: default
type: Opaque
stringData:
  password: {BROKEN_CANARY}
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineClass
metadata:
  name: leak-small
  namespace: default
provider: sim
providerSpec:
  vmPool: leak-pool
  size: small
  tags:
    kubernetes.io/cluster/leak: "1"
    kubernetes.io/role/node: "1"
secretRef:
  name: leak-worker
  namespace: default
credentialsSecretRef:
  name: leak-credentials
  namespace: default
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineClass
metadata:
  name: leak-medium
  namespace: default
provider: sim
providerSpec:
  vmPool: leak-pool
  size: medium
  tags:
    kubernetes.io/cluster/leak: "1"
    kubernetes.io/role/node: "1"
secretRef:
  name: leak-worker
  namespace: default
credentialsSecretRef:
  name: leak-credentials
  namespace: default
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineClass
metadata:
  name: leak-broken
  namespace: default
provider: sim
providerSpec:
  vmPool: leak-pool
  size: small
  tags:
    kubernetes.io/cluster/leak: "1"
    kubernetes.io/role/node: "1"
secretRef:
  name: leak-no-userdata
  namespace: default
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineClass
metadata:
  name: leak-plaintext
  namespace: default
provider: sim
providerSpec:
  vmPool: leak-pool
  size: small
  tags:
    kubernetes.io/cluster/leak: "1"
    kubernetes.io/role/node: "1"
secretRef:
  name: leak-plaintext
  namespace: default
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: Machine
metadata:
  name: leak-plaintext-machine
  namespace: default
spec:
  class:
    kind: MachineClass
    name: leak-plaintext
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: Machine
metadata:
  name: leak-broken-machine
  namespace: default
spec:
  class:
    kind: MachineClass
    name: leak-broken
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineDeployment
metadata:
  name: leak-deployment
  namespace: default
spec:
  replicas: 2
  selector:
    matchLabels:
      name: leak-deployment
  template:
    metadata:
      labels:
        name: leak-deployment
    spec:
      class:
        kind: MachineClass
        name: leak-small
"#
    )
}

/// The bootstrap token secrets (`<id>.<secret>`) seen in a `kubectl get secrets -n kube-system -w -o json` stream.
fn bootstrap_tokens(watch_output: &str) -> Vec<String> {
    let decode = |value: &serde_json::Value| {
        value.as_str().and_then(|b64| {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
        })
    };
    serde_json::Deserializer::from_str(watch_output)
        .into_iter::<serde_json::Value>()
        .filter_map(Result::ok)
        .filter(|secret| secret["type"] == "bootstrap.kubernetes.io/token")
        .filter_map(|secret| {
            let id = decode(&secret["data"]["token-id"])?;
            let token = decode(&secret["data"]["token-secret"])?;
            Some(format!("{id}.{token}"))
        })
        .collect()
}

/// Every base64-looking run of `text` (standard or URL-safe characters, at least 8), decoded from each of its four
/// alignments (the encoded text may start anywhere in the run), and the runs of those decodings decoded again.
fn decoded_base64_runs(text: &str, depth: u32) -> String {
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let is_b64 = |c: char| c.is_ascii_alphanumeric() || "+/-_".contains(c);
    let mut out = String::new();
    for run in text.split(|c: char| !is_b64(c)).filter(|run| run.len() >= 8) {
        let normalized: String = run
            .chars()
            .map(|c| match c {
                '-' => '+',
                '_' => '/',
                c => c,
            })
            .collect();
        for offset in 0..4 {
            let mut part = &normalized[offset..];
            if part.len() % 4 == 1 {
                part = &part[..part.len() - 1];
            }
            if let Ok(bytes) = lenient.decode(part) {
                out.push_str(&String::from_utf8_lossy(&bytes));
                out.push('\n');
            }
        }
    }
    if depth > 1 {
        let deeper = decoded_base64_runs(&out, depth - 1);
        out.push_str(&deeper);
    }
    out
}

/// Panics when any of `secrets` (what, value) is in any of `places` (where, text): as it is, base64-encoded, or
/// inside a longer base64 run, decoded (twice over).
fn assert_no_canary(places: &[(&str, &String)], secrets: &[(String, String)]) {
    let base64 = |value: &str| base64::engine::general_purpose::STANDARD.encode(value);
    for (place, text) in places {
        let decoded = decoded_base64_runs(text, 2);
        for (what, value) in secrets {
            assert!(value.len() >= 6, "{what} is a real value");
            assert!(
                !text.contains(value.as_str()),
                "{what} leaked into {place}: {}",
                text.lines()
                    .find(|l| l.contains(value.as_str()))
                    .unwrap_or_default()
            );
            assert!(
                !text.contains(&base64(value)),
                "{what} leaked base64-encoded into {place}"
            );
            assert!(
                !decoded.contains(value.as_str()),
                "{what} leaked into {place} inside a longer base64 text"
            );
        }
    }
}

#[test]
#[allow(clippy::too_many_lines)] // one lifecycle, then one search per place a secret could leak
fn no_secret_value_appears_in_logs_events_statuses_errors_or_metrics() {
    let server = Server::start_with("secret-leak", |dir| {
        let file = dir.join("plain-text-secret.json");
        std::fs::write(&file, plain_text_secret()).expect("write the raw Secret");
        // The API server logs at trace level too: every process runs at its highest level.
        vec![
            "--test-raw-object".into(),
            file.display().to_string(),
            "--v".into(),
            "9".into(),
        ]
    });
    let (provider, endpoint) = start_sim_provider(&server, |command| {
        command
            .args(["--sim-heartbeat-interval", "1s", "--echo-requests"])
            .env("MC_LOG_LEVEL", "trace")
            .env("RUST_LOG", "trace");
    });

    let mut run = mcm_run_command(&server, &["--provider-endpoint", &endpoint]);
    run.args(["--log-format", "json", "--v", "9"])
        .env_remove("RUST_LOG");
    let run = Background::spawn(run, "mcm run".into());
    let address = address_of(&run);

    let tokens_watch =
        server.kubectl_background(&["get", "secrets", "-n", "kube-system", "-w", "-o", "json"]);
    let file = server.write("leak.yaml", &manifests());
    server.kubectl_ok(&["apply", "-f", arg(&file)]);

    // Every first provider call fails (the echo) and is retried after the back-off: minutes, not seconds.
    poll("both deployment machines Running", Duration::from_mins(2), || {
        let phases = server.machine_phases(&["-l", "name=leak-deployment"]);
        (phases.iter().filter(|p| *p == "Running").count() == 2).then_some(())
    });
    // The Secret that cannot be decoded is reported by name on the machine that uses it; the others went on.
    let plain = poll(
        "the machine of the plain-text Secret reported",
        CONDITION_DEADLINE,
        || {
            let description = server.kubectl_ok(&[
                "get",
                "machine",
                "leak-plaintext-machine",
                "-o",
                "jsonpath={.status.lastOperation.description}",
            ]);
            description.contains("cannot be decoded").then_some(description)
        },
    );
    assert!(
        plain.contains("secretRef: Secret \"default/leak-plaintext\" cannot be decoded")
            && plain.contains("data.userData")
            && plain.contains("not valid base64"),
        "{plain}"
    );
    let (ready, readyz) = get(address, "/readyz");
    assert_eq!(ready, 200, "a bad Secret does not make a watch fail: {readyz}");
    assert!(readyz.contains("[+]watch-secret ok"), "{readyz}");
    let broken = poll(
        "the machine without userData to fail",
        Duration::from_mins(1),
        || {
            let description = server.kubectl_ok(&[
                "get",
                "machine",
                "leak-broken-machine",
                "-o",
                "jsonpath={.status.lastOperation.description}",
            ]);
            description.contains("userData").then_some(description)
        },
    );

    // Roll to the other class, then scale down and delete everything: every step handles the secrets again.
    server.kubectl_ok(&[
        "patch",
        "machinedeployment",
        "leak-deployment",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"class":{"name":"leak-medium"}}}}}"#,
    ]);
    poll("the rollout to finish", Duration::from_mins(3), || {
        let classes = server.kubectl_ok(&[
            "get",
            "machines",
            "-l",
            "name=leak-deployment",
            "-o",
            "jsonpath={range .items[*]}{.spec.class.name}={.status.currentStatus.phase}{\"\\n\"}{end}",
        ]);
        (classes.lines().count() == 2 && classes.lines().all(|l| l == "leak-medium=Running")).then_some(())
    });
    let metrics = get(address, "/metrics").1;
    let all = [
        "get",
        "machines,machinesets,machinedeployments,machineclasses",
        "-A",
        "-o",
        "yaml",
    ];
    let mut statuses = server.kubectl_ok(&all);
    server.kubectl_ok(&["scale", "machinedeployment", "leak-deployment", "--replicas=0"]);
    poll("the deployment's machines gone", Duration::from_mins(1), || {
        server
            .machine_phases(&["-l", "name=leak-deployment"])
            .is_empty()
            .then_some(())
    });
    server.kubectl_ok(&[
        "delete",
        "machine",
        "leak-broken-machine",
        "leak-plaintext-machine",
        "--timeout=60s",
    ]);

    statuses.push_str(&server.kubectl_ok(&all));
    let events = server.kubectl_ok(&["get", "events", "-A", "-o", "yaml"]);
    let run_output = run.stop();
    let provider_output = provider.stop();
    let tokens = bootstrap_tokens(&String::from_utf8_lossy(&tokens_watch.stop().stdout));
    let admin_token = std::fs::read_to_string(server.kubeconfig())
        .expect("the kubeconfig")
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("token:")
                .map(|t| t.trim().trim_matches('"').to_owned())
        })
        .expect("the admin token in the kubeconfig");

    let run_logs = format!(
        "{}{}",
        String::from_utf8_lossy(&run_output.stdout),
        String::from_utf8_lossy(&run_output.stderr)
    );
    let provider_logs = format!(
        "{}{}",
        String::from_utf8_lossy(&provider_output.stdout),
        String::from_utf8_lossy(&provider_output.stderr)
    );

    // The searches can fail: the places searched are full of what happened, and the canaries were really used.
    assert!(
        tokens.len() >= 4,
        "a bootstrap token per machine created: {tokens:?}"
    );
    assert!(
        broken.contains("leak-no-userdata") || broken.contains("userData"),
        "{broken}"
    );
    assert!(statuses.contains("leak-broken-machine"), "{statuses}");
    assert!(events.contains("leak-deployment"), "{events}");
    assert!(metrics.contains("mcm_machine_items_total"), "{metrics}");
    assert!(provider_logs.lines().count() > 10, "{provider_logs}");
    let json_lines: Vec<serde_json::Value> = run_logs
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {line}")))
        .collect();
    assert!(
        json_lines.len() > 50,
        "mcm run logged at trace level in JSON:\n{run_logs}"
    );
    // Structured logs: the objects' names are fields, not only text.
    for (field, value) in [
        ("machine", "leak-broken-machine"),
        ("set", ""),
        ("deployment", "leak-deployment"),
    ] {
        let has_field = |line: &serde_json::Value| {
            let mut objects = vec![&line["fields"], &line["span"]];
            objects.extend(line["spans"].as_array().into_iter().flatten());
            objects
                .iter()
                .any(|fields| fields[field].as_str().is_some_and(|v| v.contains(value)))
        };
        assert!(
            json_lines.iter().any(has_field),
            "no JSON log line has the field {field:?} = {value:?}"
        );
    }

    let mut secrets: Vec<(String, String)> = [
        ("userData", USER_DATA_CANARY),
        ("providerAccessKeyId", ACCESS_KEY_CANARY),
        ("providerSecretAccessKey", SECRET_KEY_CANARY),
        ("credentialsSecretRef", CREDENTIALS_CANARY),
        ("a secret without userData", BROKEN_CANARY),
        ("the plain-text Secret's userData", PLAIN_USER_DATA_CANARY),
        ("the plain-text Secret's access key", PLAIN_KEY_CANARY),
    ]
    .into_iter()
    .map(|(what, value)| (what.to_owned(), value.to_owned()))
    .collect();
    secrets.push(("the admin token".into(), admin_token));
    for token in tokens {
        let secret_part = token
            .split_once('.')
            .map(|(_, s)| s.to_owned())
            .unwrap_or_default();
        secrets.push((format!("bootstrap token {token}"), token));
        secrets.push(("a bootstrap token's secret".into(), secret_part));
    }
    let places = [
        ("mcm run's logs", &run_logs),
        ("the provider's logs", &provider_logs),
        ("the API server's logs", &server.logs()),
        ("Events", &events),
        ("statuses", &statuses),
        ("/metrics", &metrics),
    ];
    // The provider really echoed: its answers quoted the secrets (which the controllers then redacted).
    assert!(
        events.contains("[redacted]") || statuses.contains("[redacted]"),
        "the echoing provider's messages were recorded, redacted:\n{events}"
    );
    assert_no_canary(&places, &secrets);
}

const AWS_ACCESS_KEY_CANARY: &str = "AKIDAWSCANARY3B9E71F0";
const AWS_SECRET_KEY_CANARY: &str = "aws-sak-canary-8c2d45e1/Zq";
const AWS_USER_DATA_CANARY: &str = "aws-userdata-canary-6e0f13b9";

/// The AWS provider's objects: the class's Secret with canary credentials and userData, the example class (its
/// network put in) and a class whose AMI does not exist (the error path), a machine of each.
fn aws_manifests(network: &mcm_provider_aws::testing::Network) -> String {
    let class = std::fs::read_to_string(mcm_testkit::example("aws", "01-machine-class.yaml"))
        .expect("examples/aws/01-machine-class.yaml")
        .replace("name: aws-secret", "name: leak-aws")
        .replace("subnet-0123456789abcdef0", &network.subnet_id)
        .replace("sg-0123456789abcdef0", &network.security_group_id);
    let broken = class
        .replace("name: aws-workers", "name: aws-broken")
        .replace("ami-12c6146b", "ami-00000000000000000");
    format!(
        r"apiVersion: v1
kind: Secret
metadata:
  name: leak-aws
  namespace: default
type: Opaque
stringData:
  providerAccessKeyId: {AWS_ACCESS_KEY_CANARY}
  providerSecretAccessKey: {AWS_SECRET_KEY_CANARY}
  userData: |
    #!/bin/bash
    echo {AWS_USER_DATA_CANARY}
---
{class}
---
{broken}
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: Machine
metadata:
  name: leak-aws-0
  namespace: default
spec:
  class:
    kind: MachineClass
    name: aws-workers
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: Machine
metadata:
  name: leak-aws-broken-0
  namespace: default
spec:
  class:
    kind: MachineClass
    name: aws-broken
"
    )
}

/// The address after `prefix` on a line of `text`, up to the first `/`.
fn printed_address(text: &str, prefix: &str) -> std::net::SocketAddr {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{prefix}<address> printed: {text}"))
}

/// The AWS provider out of process (`mcm provider aws serve` on moto, logging at trace level) behind `mcm run
/// --provider-endpoint` (trace, JSON) and `mcm apiserver` (`--v 9`): a machine created and deleted, a class whose
/// AMI does not exist failing its machine. The canary credentials and userData reached moto (the instance's
/// userData holds the canary) and appear in no log, Event, status or `/metrics` (the controllers' and the
/// provider's), raw, base64 or inside a longer base64 run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one lifecycle, then one search per place a secret could leak
async fn the_aws_provider_leaks_no_credential_or_user_data() {
    let moto = mcm_provider_aws::testing::Moto::start().await;
    let network = moto.network("shoot--example-nodes").await;
    let server = Server::start_with("secret-leak-aws", |_| vec!["--v".into(), "9".into()]);
    let endpoint = format!("unix://{}", server.dir.join("aws.sock").display());
    let mut provider = std::process::Command::new(env!("CARGO_BIN_EXE_mcm"));
    provider
        .args(["provider", "aws", "serve", "--endpoint", &endpoint])
        .args(["--metrics-address", "127.0.0.1:0"])
        .env("AWS_ENDPOINT_URL", &moto.endpoint)
        .env("MC_LOG_LEVEL", "trace")
        .env("RUST_LOG", "trace");
    let provider = Background::spawn(provider, "mcm provider aws serve".into());
    let provider_metrics = printed_address(
        &provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on")),
        "mcm provider aws: metrics on http://",
    );
    let mut run = mcm_run_command(&server, &["--provider-endpoint", &endpoint]);
    run.args(["--leader-elect=false", "--log-format", "json", "--v", "9"])
        .env_remove("RUST_LOG");
    let run = Background::spawn(run, "mcm run".into());
    let address = address_of(&run);

    let file = server.write("leak-aws.yaml", &aws_manifests(&network));
    server.kubectl_ok(&["apply", "-f", arg(&file)]);
    let jsonpath = |machine: &str, path: &str| {
        server.kubectl_ok(&["get", "machine", machine, "-o", &format!("jsonpath={path}")])
    };
    let provider_id = poll("leak-aws-0 created on moto", Duration::from_mins(1), || {
        let id = jsonpath("leak-aws-0", "{.spec.providerID}");
        id.starts_with("aws:///eu-west-1/i-").then_some(id)
    });
    let broken = poll(
        "leak-aws-broken-0 reports the unknown AMI",
        Duration::from_mins(1),
        || {
            let description = jsonpath("leak-aws-broken-0", "{.status.lastOperation.description}");
            description.contains("providerSpec.ami").then_some(description)
        },
    );
    // The canaries were really used: moto holds the canary userData of the instance.
    let instance = provider_id.rsplit('/').next().unwrap_or_default().to_owned();
    let attribute = moto
        .ec2(
            "DescribeInstanceAttribute",
            &[("InstanceId", instance.as_str()), ("Attribute", "userData")],
        )
        .await
        .expect("DescribeInstanceAttribute");
    let user_data = mcm_provider_aws::testing::first_text(&attribute, "value")
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default();
    assert!(
        user_data.contains(AWS_USER_DATA_CANARY),
        "the instance got the Secret's userData: {attribute}"
    );

    let all = ["get", "machines,machineclasses", "-A", "-o", "yaml"];
    let mut statuses = server.kubectl_ok(&all);
    let metrics = get(address, "/metrics").1;
    server.kubectl_ok(&[
        "delete",
        "machine",
        "leak-aws-0",
        "leak-aws-broken-0",
        "--wait=true",
        "--timeout=60s",
    ]);
    let xml = moto
        .ec2("DescribeInstances", &[("InstanceId.1", instance.as_str())])
        .await
        .expect("DescribeInstances");
    let instance_states = mcm_provider_aws::testing::all_texts(&xml, "name");
    assert!(
        instance_states
            .iter()
            .any(|s| s == "terminated" || s == "shutting-down"),
        "{instance} terminated with its machine: {instance_states:?}"
    );
    statuses.push_str(&server.kubectl_ok(&all));
    let events = server.kubectl_ok(&["get", "events", "-A", "-o", "yaml"]);
    let provider_metrics = get(provider_metrics, "/metrics").1;
    let run_output = run.stop();
    let provider_output = provider.stop();
    let run_logs = format!(
        "{}{}",
        String::from_utf8_lossy(&run_output.stdout),
        String::from_utf8_lossy(&run_output.stderr)
    );
    let provider_logs = format!(
        "{}{}",
        String::from_utf8_lossy(&provider_output.stdout),
        String::from_utf8_lossy(&provider_output.stderr)
    );

    // The searches can fail: the places searched are full of what happened.
    assert!(broken.contains("ami-00000000000000000"), "{broken}");
    assert!(statuses.contains("leak-aws-broken-0"), "{statuses}");
    assert!(events.contains("leak-aws-0"), "{events}");
    assert!(metrics.contains("mcm_machine_items_total"), "{metrics}");
    assert!(
        provider_metrics.contains(r#"mcm_cloud_api_requests_failed_total{provider="aws",service="ec2"}"#),
        "{provider_metrics}"
    );
    assert!(
        provider_logs.lines().any(|l| l.contains("TRACE")) && provider_logs.lines().count() > 10,
        "the provider logged at trace level:\n{provider_logs}"
    );
    assert!(
        run_logs.lines().filter(|l| l.starts_with('{')).count() > 50,
        "mcm run logged at trace level in JSON:\n{run_logs}"
    );

    let secrets: Vec<(String, String)> = [
        ("providerAccessKeyId", AWS_ACCESS_KEY_CANARY),
        ("providerSecretAccessKey", AWS_SECRET_KEY_CANARY),
        ("userData", AWS_USER_DATA_CANARY),
    ]
    .into_iter()
    .map(|(what, value)| (what.to_owned(), value.to_owned()))
    .collect();
    let places = [
        ("mcm run's logs", &run_logs),
        ("the provider's logs", &provider_logs),
        ("the API server's logs", &server.logs()),
        ("Events", &events),
        ("statuses", &statuses),
        ("mcm run's /metrics", &metrics),
        ("the provider's /metrics", &provider_metrics),
    ];
    assert_no_canary(&places, &secrets);
    drop(server);
    moto.stop().await;
}
