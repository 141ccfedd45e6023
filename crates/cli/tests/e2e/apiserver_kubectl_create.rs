//! End to end: the kubectl commands that talk protobuf to the real `mcm apiserver`. `kubectl create secret`,
//! `create namespace` and `certificate approve|deny` use kubectl's typed clients, which send their bodies as
//! `application/vnd.kubernetes.protobuf` and ask for protobuf answers first; without it they failed with 415.
//! Each test reads the object back (as JSON) and checks what a user would.

use crate::support;

use base64::Engine as _;
use serde_json::Value;
use support::{Server, arg};

/// `kubectl get <what> -o json`, parsed.
fn get_json(server: &Server, what: &[&str]) -> Value {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend(["-o", "json"]);
    serde_json::from_str(&server.kubectl_ok(&args)).expect("kubectl -o json prints JSON")
}

/// A Secret's `data[key]`, decoded.
fn secret_value(secret: &Value, key: &str) -> String {
    let encoded = secret["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no data[{key}] in {secret}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("data values are base64");
    String::from_utf8(bytes).expect("UTF-8 value")
}

#[test]
fn create_secret_generic_sends_protobuf_and_stores_the_literals() {
    let server = Server::start("create-secret-generic");
    // -v=8 shows the request and response headers: this command must really go through protobuf.
    let output = server.kubectl(&[
        "create",
        "secret",
        "generic",
        "creds",
        "--from-literal=user=admin",
        "--from-literal=password=p@ss w0rd",
        "-v=8",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kubectl failed:\n{stderr}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("secret/creds created"),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(
        stderr.contains("Content-Type: application/vnd.kubernetes.protobuf"),
        "kubectl sent or received no protobuf:\n{stderr}"
    );

    let secret = get_json(&server, &["secret", "creds"]);
    assert_eq!(secret_value(&secret, "user"), "admin");
    assert_eq!(secret_value(&secret, "password"), "p@ss w0rd");
    assert_eq!(secret["metadata"]["namespace"], "default");
    assert_eq!(
        secret["type"], "Opaque",
        "kubectl sends an empty type; the server defaults it as kube-apiserver does"
    );

    // A second create is refused with a protobuf Status, whose message kubectl prints.
    let err = server.kubectl_err(&["create", "secret", "generic", "creds", "--from-literal=a=b"]);
    assert!(
        err.contains("failed to create secret secrets \"creds\" already exists"),
        "{err}"
    );
}

#[test]
fn create_secret_tls_stores_the_certificate_and_key() {
    let server = Server::start("create-secret-tls");
    let issued =
        rcgen::generate_simple_self_signed(vec!["web.example.com".to_owned()]).expect("a certificate");
    let cert_pem = issued.cert.pem();
    let key_pem = issued.signing_key.serialize_pem();
    let cert = server.write("tls.crt", &cert_pem);
    let key = server.write("tls.key", &key_pem);

    let out = server.kubectl_ok(&[
        "create",
        "secret",
        "tls",
        "web-tls",
        "--cert",
        arg(&cert),
        "--key",
        arg(&key),
    ]);
    assert!(out.contains("secret/web-tls created"), "{out}");

    let secret = get_json(&server, &["secret", "web-tls"]);
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(secret_value(&secret, "tls.crt"), cert_pem);
    assert_eq!(secret_value(&secret, "tls.key"), key_pem);
}

#[test]
fn create_secret_docker_registry_stores_the_docker_config() {
    let server = Server::start("create-secret-docker");
    let out = server.kubectl_ok(&[
        "create",
        "secret",
        "docker-registry",
        "regcred",
        "--docker-server=registry.example.com",
        "--docker-username=robot",
        "--docker-password=s3cret",
        "--docker-email=robot@example.com",
    ]);
    assert!(out.contains("secret/regcred created"), "{out}");

    let secret = get_json(&server, &["secret", "regcred"]);
    assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
    let config: Value =
        serde_json::from_str(&secret_value(&secret, ".dockerconfigjson")).expect("the docker config is JSON");
    let auth = &config["auths"]["registry.example.com"];
    assert_eq!(auth["username"], "robot", "{config}");
    assert_eq!(auth["password"], "s3cret", "{config}");
    assert_eq!(auth["email"], "robot@example.com", "{config}");
}

#[test]
fn create_namespace_makes_an_active_namespace() {
    let server = Server::start("create-namespace");
    let out = server.kubectl_ok(&["create", "namespace", "team-a"]);
    assert!(out.contains("namespace/team-a created"), "{out}");

    let namespace = get_json(&server, &["namespace", "team-a"]);
    assert_eq!(namespace["status"]["phase"], "Active", "{namespace}");
    assert!(namespace["metadata"]["uid"].is_string(), "{namespace}");
    // Objects can be created in it at once.
    let out = server.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=k=v",
        "-n",
        "team-a",
    ]);
    assert!(out.contains("secret/s created"), "{out}");
    let err = server.kubectl_err(&["create", "namespace", "Team_A"]);
    assert!(
        err.contains("Invalid"),
        "a bad name is refused with the reason:\n{err}"
    );
}

/// A kubelet client certificate request for node `node` (the kind this server signs), as a manifest.
fn node_csr_manifest(name: &str, node: &str) -> String {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::default();
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    subject.push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name = subject;
    let pem = params
        .serialize_request(&key)
        .and_then(|request| request.pem())
        .expect("a certificate request");
    let request = base64::engine::general_purpose::STANDARD.encode(pem);
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: {name}\nspec:\n  \
         request: {request}\n  signerName: kubernetes.io/kube-apiserver-client-kubelet\n  usages:\n  - digital \
         signature\n  - client auth\n"
    )
}

/// The types of a CSR's conditions.
fn condition_types(csr: &Value) -> Vec<String> {
    csr["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn certificate_approve_approves_and_the_certificate_is_issued() {
    let server = Server::start("certificate-approve");
    let manifest = server.write("csr.yaml", &node_csr_manifest("node-csr-a", "a"));
    server.kubectl_ok(&["create", "-f", arg(&manifest)]);

    let out = server.kubectl_ok(&["certificate", "approve", "node-csr-a"]);
    assert!(
        out.contains("certificatesigningrequest.certificates.k8s.io/node-csr-a approved"),
        "{out}"
    );
    let csr = support::poll(
        "the approved CSR's certificate",
        std::time::Duration::from_secs(30),
        || {
            let csr = get_json(&server, &["csr", "node-csr-a"]);
            csr["status"]["certificate"].is_string().then_some(csr)
        },
    );
    assert_eq!(condition_types(&csr), ["Approved"], "{csr}");
    let approved = &csr["status"]["conditions"][0];
    assert_eq!(approved["status"], "True");
    assert_eq!(approved["reason"], "KubectlApprove");
}

#[test]
fn certificate_deny_denies_and_no_certificate_is_issued() {
    let server = Server::start("certificate-deny");
    let manifest = server.write("csr.yaml", &node_csr_manifest("node-csr-d", "d"));
    server.kubectl_ok(&["create", "-f", arg(&manifest)]);

    let out = server.kubectl_ok(&["certificate", "deny", "node-csr-d"]);
    assert!(
        out.contains("certificatesigningrequest.certificates.k8s.io/node-csr-d denied"),
        "{out}"
    );
    let csr = get_json(&server, &["csr", "node-csr-d"]);
    assert_eq!(condition_types(&csr), ["Denied"], "{csr}");
    assert_eq!(csr["status"]["conditions"][0]["reason"], "KubectlDeny");
    assert!(csr["status"]["certificate"].is_null(), "{csr}");
    // kubectl reads the request back (protobuf) before it writes: a denied request stays denied.
    let err = server.kubectl_err(&["certificate", "approve", "node-csr-d"]);
    assert!(err.contains("\"node-csr-d\" is already Denied"), "{err}");
}
