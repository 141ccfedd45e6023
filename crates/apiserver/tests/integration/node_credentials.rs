//! Node credentials through the real `kube` client over HTTPS: a node agent joins with a bootstrap token, obtains
//! its own client certificate through a CertificateSigningRequest (kubelet TLS bootstrapping), keeps working on it
//! after the token is gone, and may act only on its own Node and Lease and what a kubelet needs. Bootstrap tokens
//! follow Kubernetes' Secret format (expiry, usages); the admin approves what is not approved automatically.

use crate::support;

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::{
    ByteString,
    api::{
        certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{Node, Secret},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::wait::await_condition,
};
use mcm_api::{Machine, builders::NodeBuilder};
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestServer, expect_status, machine, meta, within};

const TOKEN_ID: &str = "abcdef";
const TOKEN_SECRET: &str = "0123456789abcdef";
const KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

fn token() -> String {
    format!("{TOKEN_ID}.{TOKEN_SECRET}")
}

/// A bootstrap token Secret as `kubeadm token create` writes it, with `extra` entries added or replaced.
fn bootstrap_secret(id: &str, secret: &str, extra: &[(&str, &str)]) -> Secret {
    let mut data: BTreeMap<String, String> = [
        ("token-id", id),
        ("token-secret", secret),
        ("usage-bootstrap-authentication", "true"),
        ("usage-bootstrap-signing", "true"),
        (
            "auth-extra-groups",
            "system:bootstrappers:kubeadm:default-node-token",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (key, value) in extra {
        data.insert((*key).to_owned(), (*value).to_owned());
    }
    Secret {
        metadata: meta(&format!("bootstrap-token-{id}"), &[]),
        type_: Some("bootstrap.kubernetes.io/token".into()),
        string_data: Some(data),
        ..Secret::default()
    }
}

async fn create_token_secret(t: &TestServer, secret: &Secret) {
    Api::<Secret>::namespaced(t.client.clone(), "kube-system")
        .create(&PostParams::default(), secret)
        .await
        .expect("the admin creates the bootstrap token secret");
}

/// A client of the server's cluster and CA with other credentials than the admin's: the kubeconfig's user is
/// replaced by `user` (kubeconfig `user` fields: `token`, or `client-certificate-data` and `client-key-data`).
async fn client_as(t: &TestServer, user: serde_json::Value) -> Client {
    let text = std::fs::read_to_string(t.kubeconfig()).expect("the kubeconfig");
    let mut kubeconfig: serde_json::Value = serde_saphyr::from_str(&text).expect("the kubeconfig is YAML");
    kubeconfig["users"][0]["user"] = user;
    let kubeconfig: Kubeconfig = serde_json::from_value(kubeconfig).expect("still a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a client configuration");
    Client::try_from(config).expect("a client")
}

async fn bearer_client(t: &TestServer, token: &str) -> Client {
    client_as(t, json!({ "token": token })).await
}

/// A client that authenticates with a client certificate and its private key (both PEM).
async fn certificate_client(t: &TestServer, cert_pem: &str, key_pem: &str) -> Client {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    client_as(
        t,
        json!({ "client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem) }),
    )
    .await
}

/// A new key pair and a CertificateSigningRequest object for `CN=<common_name>, O=system:nodes`, as a kubelet
/// makes one for its client certificate. Returns (object, private key PEM).
fn node_csr(name: &str, common_name: &str) -> (CertificateSigningRequest, String) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::default();
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::CommonName, common_name);
    subject.push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name = subject;
    let pem = params
        .serialize_request(&key)
        .and_then(|request| request.pem())
        .expect("a certificate request");
    let csr = CertificateSigningRequest {
        metadata: meta(name, &[]),
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.into_bytes()),
            signer_name: KUBELET_SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            expiration_seconds: Some(3600),
            // The server replaces what the client claims with who it is.
            username: Some("admin".into()),
            groups: Some(vec!["system:masters".into()]),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    (csr, key.serialize_pem())
}

/// Waits (with the harness deadline) until the CSR has a certificate, watching it by name as a kubelet does;
/// returns the CSR and the certificate PEM.
async fn issued_certificate(
    api: &Api<CertificateSigningRequest>,
    name: &str,
) -> (CertificateSigningRequest, String) {
    let issued = |csr: Option<&CertificateSigningRequest>| {
        csr.and_then(|c| c.status.as_ref())
            .and_then(|s| s.certificate.as_ref())
            .is_some_and(|c| !c.0.is_empty())
    };
    let csr = within(
        "the CSR's certificate",
        await_condition(api.clone(), name, issued),
    )
    .await
    .expect("watching the own CSR is allowed")
    .expect("the CSR exists");
    let pem = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .map(|c| String::from_utf8(c.0.clone()).expect("PEM text"))
        .expect("a certificate");
    (csr, pem)
}

/// A node labelled with its hostname, as a kubelet registers it.
fn node(name: &str) -> Node {
    NodeBuilder::new(name)
        .label("kubernetes.io/hostname", name)
        .build()
}

fn lease(name: &str) -> Lease {
    Lease {
        metadata: meta(name, &[]),
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// Asserts a 403 Forbidden and returns its Status.
#[track_caller]
fn forbidden<T: std::fmt::Debug>(result: kube::Result<T>) -> Box<kube::core::Status> {
    expect_status(result, 403, "Forbidden")
}

/// A Ready condition as a kubelet posts it.
fn ready() -> serde_json::Value {
    json!({ "status": { "conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }] } })
}

/// The node agent of `n1`, with nothing but the bootstrap token, asks for its client certificate and waits for it.
/// Returns the bootstrap client's CSR API, the certificate PEM and the private key PEM.
async fn join_as_n1(t: &TestServer) -> (Api<CertificateSigningRequest>, String, String) {
    let csrs: Api<CertificateSigningRequest> = Api::all(bearer_client(t, &token()).await);
    let (request, key_pem) = node_csr("node-csr-n1", "system:node:n1");
    let created = csrs
        .create(&PostParams::default(), &request)
        .await
        .expect("a bootstrap token creates a CSR");
    assert_eq!(created.spec.username.as_deref(), Some("system:bootstrap:abcdef"));
    assert_eq!(
        created.spec.groups,
        Some(vec![
            "system:bootstrappers".to_owned(),
            "system:bootstrappers:kubeadm:default-node-token".to_owned()
        ])
    );
    let (csr, cert_pem) = issued_certificate(&csrs, "node-csr-n1").await;
    let conditions = csr.status.and_then(|s| s.conditions).unwrap_or_default();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(
        (conditions[0].type_.as_str(), conditions[0].reason.as_deref()),
        ("Approved", Some("AutoApproved"))
    );
    assert!(cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    (csrs, cert_pem, key_pem)
}

/// The whole join: bootstrap token → CSR → own certificate → Node, status, Lease; then the token is deleted and
/// the node carries on while the token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_with_a_bootstrap_token_and_keeps_working_on_its_certificate_after_the_token_is_deleted()
{
    let t = TestServer::start().await;
    create_token_secret(&t, &bootstrap_secret(TOKEN_ID, TOKEN_SECRET, &[])).await;
    let (bootstrap_csrs, cert_pem, key_pem) = join_as_n1(&t).await;

    // From now on the node authenticates with its certificate and the key that never left it.
    let node_client = certificate_client(&t, &cert_pem, &key_pem).await;
    let nodes: Api<Node> = Api::all(node_client.clone());
    let leases: Api<Lease> = Api::namespaced(node_client.clone(), "kube-node-lease");
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .expect("the node creates its Node");
    let patched = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&ready()))
        .await
        .expect("the node patches its status");
    assert_eq!(patched.status.unwrap().conditions.unwrap()[0].type_, "Ready");
    let first = leases
        .create(&PostParams::default(), &lease("n1"))
        .await
        .expect("the node creates its Lease");
    let renew = || json!({ "spec": { "renewTime": MicroTime(jiff::Timestamp::now()) } });
    let renewed = leases
        .patch("n1", &PatchParams::default(), &Patch::Merge(renew()))
        .await
        .expect("the node renews its Lease");
    assert!(support::rv(&renewed) > support::rv(&first));

    // The admin deletes the bootstrap token: it stops working at once, the node's certificate does not.
    Api::<Secret>::namespaced(t.client.clone(), "kube-system")
        .delete("bootstrap-token-abcdef", &DeleteParams::default())
        .await
        .expect("the admin deletes the token");
    expect_status(bootstrap_csrs.get("node-csr-n1").await, 401, "Unauthorized");
    let renewed_again = leases
        .patch("n1", &PatchParams::default(), &Patch::Merge(renew()))
        .await
        .expect("the node still renews its Lease");
    assert!(support::rv(&renewed_again) > support::rv(&renewed));
    let own = nodes.get("n1").await.expect("and reads its Node");
    assert_eq!(own.metadata.name.as_deref(), Some("n1"));

    // The certificate outlives a restart of the server (same data directory, same CA).
    let mut t = t;
    t.restart().await;
    leases
        .patch("n1", &PatchParams::default(), &Patch::Merge(renew()))
        .await
        .expect("the node renews its Lease after a restart");
}

/// The node's certificate reaches nothing that is not its own (another Node, another Lease, machines, secrets),
/// and reads what a kubelet reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_is_refused_on_other_nodes_leases_machines_and_secrets() {
    let t = TestServer::start().await;
    create_token_secret(&t, &bootstrap_secret(TOKEN_ID, TOKEN_SECRET, &[])).await;
    let (_, cert_pem, key_pem) = join_as_n1(&t).await;
    let node_client = certificate_client(&t, &cert_pem, &key_pem).await;
    let nodes: Api<Node> = Api::all(node_client.clone());
    let leases: Api<Lease> = Api::namespaced(node_client.clone(), "kube-node-lease");
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .expect("the node creates its Node");
    Api::<Node>::all(t.client.clone())
        .create(&PostParams::default(), &node("n2"))
        .await
        .expect("the admin creates n2");

    let status = forbidden(nodes.create(&PostParams::default(), &node("n3")).await);
    assert_eq!(
        status.message,
        "nodes \"n3\" is forbidden: User \"system:node:n1\" cannot create resource \"nodes\" in API group \"\" at \
         the cluster scope: a node may only create and change its own Node"
    );
    forbidden(
        nodes
            .patch_status("n2", &PatchParams::default(), &Patch::Merge(&ready()))
            .await,
    );
    forbidden(
        nodes
            .patch("n2", &PatchParams::default(), &Patch::Merge(&ready()))
            .await,
    );
    forbidden(nodes.delete("n2", &DeleteParams::default()).await);
    let status = forbidden(leases.create(&PostParams::default(), &lease("n2")).await);
    let details = status.details.expect("details");
    assert_eq!(
        (
            details.name.as_str(),
            details.group.as_str(),
            details.kind.as_str()
        ),
        ("n2", "coordination.k8s.io", "leases")
    );
    let machines: Api<Machine> = Api::namespaced(node_client.clone(), "default");
    forbidden(machines.create(&PostParams::default(), &machine("m1", &[])).await);
    forbidden(machines.list(&ListParams::default()).await);
    let secrets: Api<Secret> = Api::namespaced(node_client.clone(), "kube-system");
    forbidden(secrets.list(&ListParams::default()).await);
    forbidden(secrets.get("bootstrap-token-abcdef").await);

    // What a kubelet reads is readable.
    let listed = nodes.list(&ListParams::default()).await.expect("list nodes");
    assert_eq!(support::names(listed.items), ["n1", "n2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_or_non_authentication_or_wrong_bootstrap_tokens_are_401() {
    let t = TestServer::start().await;
    create_token_secret(
        &t,
        &bootstrap_secret("expird", TOKEN_SECRET, &[("expiration", "2020-01-01T00:00:00Z")]),
    )
    .await;
    create_token_secret(
        &t,
        &bootstrap_secret(
            "nouse1",
            TOKEN_SECRET,
            &[("usage-bootstrap-authentication", "false")],
        ),
    )
    .await;
    create_token_secret(
        &t,
        &bootstrap_secret(TOKEN_ID, TOKEN_SECRET, &[("expiration", "2999-01-01T00:00:00Z")]),
    )
    .await;
    let (request, _) = node_csr("node-csr-n1", "system:node:n1");
    for refused in [
        format!("expird.{TOKEN_SECRET}"),
        format!("nouse1.{TOKEN_SECRET}"),
        format!("{TOKEN_ID}.0123456789abcdee"),
        format!("zzzzzz.{TOKEN_SECRET}"),
    ] {
        let client = bearer_client(&t, &refused).await;
        let csrs: Api<CertificateSigningRequest> = Api::all(client);
        expect_status(
            csrs.create(&PostParams::default(), &request).await,
            401,
            "Unauthorized",
        );
    }
    // The same secret with an expiry in the future works.
    let csrs: Api<CertificateSigningRequest> = Api::all(bearer_client(&t, &token()).await);
    csrs.create(&PostParams::default(), &request)
        .await
        .expect("a valid token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_token_may_only_create_csrs_and_read_its_own() {
    let t = TestServer::start().await;
    create_token_secret(&t, &bootstrap_secret(TOKEN_ID, TOKEN_SECRET, &[])).await;
    let bootstrap = bearer_client(&t, &token()).await;
    let status = expect_status(
        Api::<Secret>::namespaced(bootstrap.clone(), "kube-system")
            .list(&ListParams::default())
            .await,
        403,
        "Forbidden",
    );
    assert_eq!(
        status.message,
        "secrets is forbidden: User \"system:bootstrap:abcdef\" cannot list resource \"secrets\" in API group \"\" \
         in the namespace \"kube-system\""
    );
    expect_status(
        Api::<Node>::all(bootstrap.clone())
            .create(&PostParams::default(), &node("n1"))
            .await,
        403,
        "Forbidden",
    );
    // The admin's CSR is not the bootstrap token's to read, nor is the whole list.
    let admin_csrs: Api<CertificateSigningRequest> = Api::all(t.client.clone());
    admin_csrs
        .create(&PostParams::default(), &node_csr("admins", "system:node:n9").0)
        .await
        .expect("the admin creates a CSR");
    let csrs: Api<CertificateSigningRequest> = Api::all(bootstrap);
    expect_status(csrs.get("admins").await, 403, "Forbidden");
    expect_status(csrs.list(&ListParams::default()).await, 403, "Forbidden");
    // Nor may it approve anything.
    let approve =
        json!({ "status": { "conditions": [{ "type": "Approved", "status": "True", "reason": "Self" }] } });
    expect_status(
        csrs.patch_subresource(
            "approval",
            "admins",
            &PatchParams::default(),
            &Patch::Merge(&approve),
        )
        .await,
        403,
        "Forbidden",
    );
}

/// Requests that are not approved automatically wait for the admin: approval through the `approval` subresource
/// signs a kubelet client request for any node; a denied request is never signed. A node renews its own
/// certificate at once but cannot get one for another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_approves_or_denies_pending_csrs_and_a_node_renews_only_its_own() {
    let t = TestServer::start().await;
    let admin_csrs: Api<CertificateSigningRequest> = Api::all(t.client.clone());
    let (request, key_pem) = node_csr("for-n5", "system:node:n5");
    let pending = admin_csrs
        .create(&PostParams::default(), &request)
        .await
        .expect("create");
    assert_eq!(pending.status, None, "an admin's request is not auto-approved");
    let approval = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": { "name": "for-n5" },
        "status": { "conditions": [{
            "type": "Approved", "status": "True", "reason": "AdminApproved", "message": "approved by the admin"
        }] },
    });
    let approved = admin_csrs
        .replace_subresource("approval", "for-n5", &PostParams::default(), &approval)
        .await
        .expect("the admin approves (PUT, as kubectl certificate approve)");
    let cert = approved
        .status
        .and_then(|s| s.certificate)
        .expect("signed on approval");
    let n5 = certificate_client(&t, &String::from_utf8(cert.0).unwrap(), &key_pem).await;
    Api::<Node>::all(n5.clone())
        .create(&PostParams::default(), &node("n5"))
        .await
        .expect("the certificate is n5's");

    // Renewal: n5 asks for a new certificate of its own (approved at once) and for n6's (left pending).
    let n5_csrs: Api<CertificateSigningRequest> = Api::all(n5);
    let (renewal, _) = node_csr("n5-renewal", "system:node:n5");
    n5_csrs
        .create(&PostParams::default(), &renewal)
        .await
        .expect("a node creates a CSR");
    let (renewed, _) = issued_certificate(&n5_csrs, "n5-renewal").await;
    assert_eq!(renewed.spec.username.as_deref(), Some("system:node:n5"));
    let (foreign, _) = node_csr("n6-by-n5", "system:node:n6");
    let foreign = n5_csrs
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create");
    assert_eq!(foreign.status, None, "not the node's own name: pending");

    // The admin denies it (merge patch on /approval): it is never signed, and cannot be approved afterwards.
    let deny =
        json!({ "status": { "conditions": [{ "type": "Denied", "status": "True", "reason": "NotYours" }] } });
    let denied = admin_csrs
        .patch_subresource(
            "approval",
            "n6-by-n5",
            &PatchParams::default(),
            &Patch::Merge(&deny),
        )
        .await
        .expect("the admin denies");
    let status = denied.status.expect("status");
    assert_eq!(status.conditions.unwrap()[0].type_, "Denied");
    assert_eq!(status.certificate, None);
    let approve = json!({ "status": { "conditions": [
        { "type": "Denied", "status": "True", "reason": "NotYours" },
        { "type": "Approved", "status": "True", "reason": "Changed my mind" },
    ] } });
    expect_status(
        admin_csrs
            .patch_subresource(
                "approval",
                "n6-by-n5",
                &PatchParams::default(),
                &Patch::Merge(&approve),
            )
            .await,
        422,
        "Invalid",
    );
    assert_eq!(
        admin_csrs
            .get("n6-by-n5")
            .await
            .unwrap()
            .status
            .unwrap()
            .certificate,
        None
    );
}

/// A request body that lies about the requestor or arrives already approved is corrected; a CSR whose request is
/// not a signed PEM CERTIFICATE REQUEST is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_records_the_requestor_and_refuses_invalid_requests() {
    let t = TestServer::start().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(t.client.clone());
    let (mut request, _) = node_csr("forged", "system:node:n1");
    request.status = Some(
        k8s_openapi::api::certificates::v1::CertificateSigningRequestStatus {
            certificate: Some(ByteString(b"forged".to_vec())),
            conditions: None,
        },
    );
    let created = csrs
        .create(&PostParams::default(), &request)
        .await
        .expect("create");
    assert_eq!(created.spec.username.as_deref(), Some("admin"));
    assert_eq!(created.spec.groups, Some(vec!["system:masters".to_owned()]));
    assert_eq!(created.status, None, "a client cannot create a signed request");

    let (mut garbage, _) = node_csr("garbage", "system:node:n1");
    garbage.spec.request = ByteString(
        b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".to_vec(),
    );
    let status = expect_status(
        csrs.create(&PostParams::default(), &garbage).await,
        422,
        "Invalid",
    );
    assert!(status.message.contains("spec.request"), "{status:?}");
}
