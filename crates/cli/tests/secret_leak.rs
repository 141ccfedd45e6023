//! End to end: no secret value ever reaches a log line, an Event, an object's status, an error or a metric.
//!
//! Canaries sit in every place a secret lives: the userData, cloud credentials in the class's secret, a separate
//! credentials secret (`credentialsSecretRef`), a secret without userData that makes machines fail (the error path),
//! the bootstrap tokens the controller creates for the machines, and the API server's admin token. The whole
//! lifecycle runs (a deployment created, rolled, scaled down, a failing machine deleted) with `mcm run` logging at
//! trace level in JSON, the provider out of process logging at trace level too; then every log, Event, status and
//! the metrics are searched for each canary.

mod support;

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

#[test]
#[allow(clippy::too_many_lines)] // one lifecycle, then one search per place a secret could leak
fn no_secret_value_appears_in_logs_events_statuses_errors_or_metrics() {
    let server = Server::start("secret-leak");
    let (provider, endpoint) = start_sim_provider(&server, |command| {
        command
            .args(["--sim-heartbeat-interval", "1s"])
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

    poll("both deployment machines Running", CONDITION_DEADLINE, || {
        let phases = server.machine_phases(&["-l", "name=leak-deployment"]);
        (phases.iter().filter(|p| *p == "Running").count() == 2).then_some(())
    });
    let broken = poll("the machine without userData to fail", CONDITION_DEADLINE, || {
        let description = server.kubectl_ok(&[
            "get",
            "machine",
            "leak-broken-machine",
            "-o",
            "jsonpath={.status.lastOperation.description}",
        ]);
        description.contains("userData").then_some(description)
    });

    // Roll to the other class, then scale down and delete everything: every step handles the secrets again.
    server.kubectl_ok(&[
        "patch",
        "machinedeployment",
        "leak-deployment",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"class":{"name":"leak-medium"}}}}}"#,
    ]);
    poll("the rollout to finish", Duration::from_mins(1), || {
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
    poll("the deployment's machines gone", CONDITION_DEADLINE, || {
        server
            .machine_phases(&["-l", "name=leak-deployment"])
            .is_empty()
            .then_some(())
    });
    server.kubectl_ok(&["delete", "machine", "leak-broken-machine", "--timeout=60s"]);

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
    let base64 = |value: &str| base64::engine::general_purpose::STANDARD.encode(value);
    let places = [
        ("mcm run's logs", &run_logs),
        ("the provider's logs", &provider_logs),
        ("the API server's logs", &server.logs()),
        ("Events", &events),
        ("statuses", &statuses),
        ("/metrics", &metrics),
    ];
    for (what, value) in &secrets {
        assert!(value.len() >= 6, "{what} is a real value");
        for (place, text) in &places {
            assert!(!text.contains(value.as_str()), "{what} leaked into {place}");
            assert!(
                !text.contains(&base64(value)),
                "{what} leaked base64-encoded into {place}"
            );
        }
    }
}
