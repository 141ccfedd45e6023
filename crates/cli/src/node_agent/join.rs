//! Join: the node's client from the saved credentials, or a CertificateSigningRequest made with the bootstrap token
//! and watched (by name, as kubelet does) until it is issued, refused or `--bootstrap-timeout` passes.

use base64::Engine as _;
use k8s_openapi::{
    ByteString,
    api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    Backoff, Failure,
    credentials::{CLIENT_PEM, Credentials, PKI_DIR, certificate_of, load_credentials, save_credentials},
    settings::{Settings, flag},
};

/// The signer of kubelet client certificates.
const KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// A client of the cluster as `user` (a kubeconfig `user` entry), with the CA of `--ca-file`.
async fn cluster_client(settings: &Settings, user: Value) -> Result<Client, Failure> {
    let b64 = |data: &str| base64::engine::general_purpose::STANDARD.encode(data);
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "cluster", "cluster": {
            "server": settings.api_server,
            "certificate-authority-data": b64(&settings.ca_pem),
        } }],
        "users": [{ "name": "node-agent", "user": user }],
        "contexts": [{ "name": "node-agent", "context": { "cluster": "cluster", "user": "node-agent" } }],
        "current-context": "node-agent",
    });
    // Errors below describe the configuration's shape, never its credentials.
    let kubeconfig: Kubeconfig = serde_json::from_value(kubeconfig)
        .map_err(|err| Failure::Failed(format!("cannot build the client configuration: {err}")))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|err| {
            Failure::Misconfigured(format!(
                "{} or {}: {err}",
                flag("api-server", Some("MCM_LOCAL_API_SERVER")),
                flag("ca-file", Some("MCM_LOCAL_CA_FILE"))
            ))
        })?;
    Client::try_from(config).map_err(|err| Failure::Failed(format!("cannot build the client: {err}")))
}

/// A client with the node's key and certificate (`credentials`: both PEM, key first).
async fn node_client(settings: &Settings, credentials: &Credentials) -> Result<Client, Failure> {
    let b64 = |data: &str| base64::engine::general_purpose::STANDARD.encode(data);
    cluster_client(
        settings,
        json!({
            "client-certificate-data": b64(&credentials.cert_pem),
            "client-key-data": b64(&credentials.key_pem),
        }),
    )
    .await
}

/// Obtains the node's client: from the saved credentials when they are still good, else by joining with the token.
pub(super) async fn join(settings: &Settings) -> Result<Client, Failure> {
    let pki = settings.machine_dir.join(PKI_DIR);
    match load_credentials(&pki, settings) {
        Ok(credentials) => {
            tracing::info!(
                path = %pki.join(CLIENT_PEM).display(),
                expires = %credentials.not_after,
                "reusing the saved client certificate"
            );
            return node_client(settings, &credentials).await;
        }
        Err(why) => tracing::info!(reason = %why, "no saved client certificate to reuse; joining"),
    }
    let Some(token) = &settings.token else {
        return Err(Failure::Misconfigured(format!(
            "--bootstrap-token is required: there is no valid client certificate in {}",
            pki.display()
        )));
    };
    let key = rcgen::KeyPair::generate()
        .map_err(|err| Failure::Failed(format!("cannot generate a private key: {err}")))?;
    let request = certificate_request(&key, &settings.node_name)?;
    let bootstrap = cluster_client(settings, json!({ "token": token.bearer() })).await?;
    let cert_pem = request_certificate(bootstrap, request, settings, &token.id).await?;
    let credentials = Credentials {
        key_pem: key.serialize_pem(),
        not_after: certificate_of(&cert_pem)
            .map(|c| c.not_after)
            .map_err(|why| Failure::Failed(format!("the issued certificate is unusable: {why}")))?,
        cert_pem,
    };
    match save_credentials(&pki, &credentials, &settings.ca_pem) {
        Ok(()) => tracing::info!(
            path = %pki.join(CLIENT_PEM).display(),
            expires = %credentials.not_after,
            "joined: client certificate issued and saved"
        ),
        Err(err) => tracing::warn!(
            path = %pki.display(),
            error = %err,
            "joined, but the client certificate could not be saved: a restart will need a valid token"
        ),
    }
    node_client(settings, &credentials).await
}

/// The PEM CERTIFICATE REQUEST of a kubelet client certificate for `node`.
fn certificate_request(key: &rcgen::KeyPair, node: &str) -> Result<String, Failure> {
    let mut params = rcgen::CertificateParams::default();
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::OrganizationName, "system:nodes");
    subject.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = subject;
    params
        .serialize_request(key)
        .and_then(|request| request.pem())
        .map_err(|err| Failure::Failed(format!("cannot make the certificate request: {err}")))
}

/// Whether a failed request may succeed later: no answer, or 429 and 5xx.
fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        _ => true,
    }
}

fn api_reason(status: &kube::core::Status) -> String {
    if status.message.is_empty() || status.message == status.reason {
        format!("{} ({})", status.reason, status.code)
    } else {
        format!("{} ({} {})", status.message, status.code, status.reason)
    }
}

/// Creates the CertificateSigningRequest with the bootstrap client and waits for its certificate (PEM).
async fn request_certificate(
    bootstrap: Client,
    request_pem: String,
    settings: &Settings,
    token_id: &str,
) -> Result<String, Failure> {
    let deadline = Instant::now() + settings.bootstrap_timeout;
    let api: Api<CertificateSigningRequest> = Api::all(bootstrap);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request_pem.into_bytes()),
            signer_name: KUBELET_SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let mut backoff = Backoff::new();
    let created = loop {
        match api.create(&PostParams::default(), &csr).await {
            Ok(created) => break created,
            Err(kube::Error::Api(status)) if status.code == 401 => {
                return Err(Failure::Failed(format!(
                    "the API server refused the bootstrap token {token_id} (Secret \
                     kube-system/bootstrap-token-{token_id}): {}; it may have expired or been deleted",
                    api_reason(&status)
                )));
            }
            Err(err) if is_transient(&err) && Instant::now() < deadline => {
                let delay = backoff.next();
                tracing::warn!(error = %err, retry_in = ?delay, "creating the certificate signing request failed");
                tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
            }
            Err(kube::Error::Api(status)) => {
                return Err(Failure::Failed(format!(
                    "the API server refused the certificate signing request: {}",
                    api_reason(&status)
                )));
            }
            Err(err) => {
                return Err(Failure::Failed(format!(
                    "could not create the certificate signing request within {:?}: {err}",
                    settings.bootstrap_timeout
                )));
            }
        }
    };
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, "certificate signing request created");
    let mut current = Some(created);
    loop {
        if let Some(csr) = &current {
            if let Some(pem) = issued(csr) {
                tracing::info!(csr = %name, "certificate issued");
                return Ok(pem);
            }
            if let Some(refusal) = refused(csr) {
                return Err(Failure::Failed(format!(
                    "the certificate signing request {name} was {refusal}"
                )));
            }
        } else {
            return Err(Failure::Failed(format!(
                "the certificate signing request {name} was deleted before a certificate was issued"
            )));
        }
        let decided = |csr: Option<&CertificateSigningRequest>| {
            csr.is_none_or(|csr| issued(csr).is_some() || refused(csr).is_some())
        };
        let wait = kube::runtime::wait::await_condition(api.clone(), &name, decided);
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(csr)) => current = csr,
            Ok(Err(err)) => {
                let delay = backoff.next();
                tracing::warn!(csr = %name, error = %err, retry_in = ?delay, "watching the certificate signing request failed");
                tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
                if Instant::now() >= deadline {
                    return Err(not_issued(&name, settings));
                }
            }
            Err(_) => return Err(not_issued(&name, settings)),
        }
    }
}

fn not_issued(name: &str, settings: &Settings) -> Failure {
    Failure::Failed(format!(
        "no certificate was issued for the certificate signing request {name} within {:?} (--bootstrap-timeout); \
         an admin may approve it",
        settings.bootstrap_timeout
    ))
}

/// The certificate of a signed request (PEM).
fn issued(csr: &CertificateSigningRequest) -> Option<String> {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .filter(|c| !c.0.is_empty())
        .map(|c| String::from_utf8_lossy(&c.0).into_owned())
}

/// How a request was refused: `denied (<reason>: <message>)` or `failed (...)`.
fn refused(csr: &CertificateSigningRequest) -> Option<String> {
    let conditions = csr.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| matches!(c.type_.as_str(), "Denied" | "Failed") && c.status == "True")
        .map(|c| {
            format!(
                "{} ({}: {})",
                c.type_.to_lowercase(),
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        })
}
