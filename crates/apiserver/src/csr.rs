//! CertificateSigningRequests (`certificates.k8s.io/v1`), for kubelet TLS bootstrapping.
//!
//! On create the server does what kube-apiserver does (the requestor goes into `spec.username` and `spec.groups`,
//! whatever the client sent; the status is cleared; the request must be a PEM `CERTIFICATE REQUEST` whose signature
//! verifies) and then, in the same write, what kube-controller-manager's csrapproving and csrsigning controllers do
//! for kubelet client certificates: a request for signer `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `CN=system:node:<name>, O=system:nodes`, usages digital signature and client auth (key encipherment allowed), no
//! subject alternative names, made by a bootstrap token (group `system:bootstrappers`) or by that very node
//! (renewal), is approved (`Approved`, reason `AutoApproved`) and signed by the server's CA for its own public
//! key, valid `spec.expirationSeconds` (at most a year) or a year. Anything else stays pending until an admin
//! approves it through the `approval` subresource, which signs a kubelet client request of any node name; a
//! `Denied` request is never signed.

use crate::objects::timestamp;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::{
    auth::{NODE_USER_PREFIX, NODES_GROUP, User},
    error::{ApiError, Cause},
    objects::{Context, Outcome},
    patch::{self, PatchType},
    pki::Pki,
    registry::ResourceDef,
    store::{Mutation, Store},
    x509::CertificateRequest,
};

/// The signer of kubelet client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The longest validity the signer grants, and the validity when the request names none
/// (kube-controller-manager's `--cluster-signing-duration`).
pub const MAX_VALIDITY: Duration = Duration::from_hours(365 * 24);
/// The shortest `spec.expirationSeconds` accepted.
const MIN_EXPIRATION_SECONDS: i64 = 600;

/// The key usages Kubernetes knows (`spec.usages`).
const KNOWN_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// True for the CertificateSigningRequest resource.
pub fn is_csr(def: &ResourceDef) -> bool {
    def.group == "certificates.k8s.io" && def.plural == "certificatesigningrequests"
}

fn invalid(
    def: &ResourceDef,
    object: &Value,
    field: &str,
    reason: &'static str,
    message: String,
) -> ApiError {
    ApiError::invalid(
        def,
        object["metadata"]["name"].as_str().unwrap_or_default(),
        vec![Cause {
            reason,
            message,
            field: field.to_owned(),
        }],
    )
}

/// The request of `spec.request` (base64 of a PEM CERTIFICATE REQUEST), with its signature verified.
fn certificate_request(spec: &Value) -> Result<CertificateRequest, String> {
    let encoded = spec["request"].as_str().ok_or("Required value")?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "Invalid value: not base64".to_owned())?;
    CertificateRequest::from_pem(&pem).map_err(|err| format!("Invalid value: {err}"))
}

/// Prepares a CertificateSigningRequest for create by `user`: records the requestor, clears the status, validates
/// the request and, when the kubelet client rules allow it, approves and signs it (see the module doc).
pub fn prepare_create(
    pki: &Pki,
    user: &User,
    def: &ResourceDef,
    object: &mut Value,
    now: jiff::Timestamp,
) -> Result<(), ApiError> {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return Err(invalid(
            def,
            object,
            "spec",
            "FieldValueRequired",
            "Required value".into(),
        ));
    };
    spec.insert("username".into(), json!(user.name));
    spec.insert("groups".into(), json!(user.groups));
    spec.remove("uid");
    spec.remove("extra");
    if let Some(o) = object.as_object_mut() {
        o.remove("status");
    }
    let spec = &object["spec"];
    let request = certificate_request(spec)
        .map_err(|message| invalid(def, object, "spec.request", "FieldValueInvalid", message))?;
    let signer = spec["signerName"].as_str().unwrap_or_default();
    if !is_signer_name(signer) {
        return Err(invalid(
            def,
            object,
            "spec.signerName",
            "FieldValueInvalid",
            format!(
                "Invalid value: \"{signer}\": must be a fully qualified domain and path of the form 'example.com/signer-name'"
            ),
        ));
    }
    let usages = usages(spec);
    if usages.is_empty() {
        return Err(invalid(
            def,
            object,
            "spec.usages",
            "FieldValueRequired",
            "Required value".into(),
        ));
    }
    if let Some((index, usage)) = usages.iter().enumerate().find(|(_, u)| !KNOWN_USAGES.contains(u)) {
        return Err(invalid(
            def,
            object,
            &format!("spec.usages[{index}]"),
            "FieldValueNotSupported",
            format!("Unsupported value: \"{usage}\""),
        ));
    }
    if let Some(seconds) = spec.get("expirationSeconds").filter(|v| !v.is_null())
        && seconds.as_i64().is_none_or(|s| s < MIN_EXPIRATION_SECONDS)
    {
        return Err(invalid(
            def,
            object,
            "spec.expirationSeconds",
            "FieldValueInvalid",
            format!(
                "Invalid value: {seconds}: may not specify a duration less than 600 seconds (10 minutes)"
            ),
        ));
    }
    if let Some(message) = auto_approval(user, spec, &request) {
        let mut conditions = vec![condition("Approved", "AutoApproved", message, now)];
        let certificate = sign(pki, spec, &request, &mut conditions, now);
        object["status"] = json!({ "conditions": conditions });
        if let Some(certificate) = certificate {
            object["status"]["certificate"] = json!(certificate);
        }
    }
    Ok(())
}

/// `example.com/signer-name`: a DNS subdomain, a slash, a path.
fn is_signer_name(signer: &str) -> bool {
    signer.split_once('/').is_some_and(|(domain, path)| {
        !path.is_empty() && mcm_api::validation::check_dns1123_subdomain(domain).is_ok()
    })
}

fn usages(spec: &Value) -> Vec<&str> {
    spec["usages"]
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn condition(type_: &str, reason: &str, message: &str, now: jiff::Timestamp) -> Value {
    json!({
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": timestamp(now),
        "lastTransitionTime": timestamp(now),
    })
}

/// Why a request is not a kubelet client certificate request, as the csrapproving and csrsigning controllers check
/// it; None when it is one.
fn kubelet_client_problem(spec: &Value, request: &CertificateRequest) -> Option<&'static str> {
    if spec["signerName"].as_str() != Some(KUBELET_CLIENT_SIGNER) {
        return Some("the signer is not kubernetes.io/kube-apiserver-client-kubelet");
    }
    if request.subject.organizations != [NODES_GROUP] {
        return Some("subject organization is not system:nodes");
    }
    let is_node = request
        .subject
        .common_name()
        .and_then(|cn| cn.strip_prefix(NODE_USER_PREFIX))
        .is_some_and(|node| !node.is_empty());
    if !is_node {
        return Some("subject common name does not begin with system:node:");
    }
    if request.has_subject_alt_names {
        return Some("subject alternative names are not allowed");
    }
    let mut usages = usages(spec);
    usages.sort_unstable();
    usages.dedup();
    let allowed: [&[&str]; 2] = [
        &["client auth", "digital signature"],
        &["client auth", "digital signature", "key encipherment"],
    ];
    if !allowed.contains(&usages.as_slice()) {
        return Some("usages must be digital signature and client auth (and key encipherment)");
    }
    None
}

/// The approval message when `user` may have this request approved at once: a bootstrap token for any node, a
/// node for itself.
fn auto_approval(user: &User, spec: &Value, request: &CertificateRequest) -> Option<&'static str> {
    if kubelet_client_problem(spec, request).is_some() {
        return None;
    }
    if user.is_bootstrap() {
        return Some("Auto approving kubelet client certificate after SubjectAccessReview.");
    }
    let requested = request.subject.common_name()?;
    (user.node_name().is_some() && user.name == requested)
        .then_some("Auto approving self kubelet client certificate after SubjectAccessReview.")
}

/// Signs an approved kubelet client request: the base64 of the certificate PEM, or None after adding a `Failed`
/// condition saying why not.
fn sign(
    pki: &Pki,
    spec: &Value,
    request: &CertificateRequest,
    conditions: &mut Vec<Value>,
    now: jiff::Timestamp,
) -> Option<String> {
    if let Some(problem) = kubelet_client_problem(spec, request) {
        conditions.push(condition("Failed", "SignerValidationFailure", problem, now));
        return None;
    }
    let valid_for = spec["expirationSeconds"]
        .as_u64()
        .map_or(MAX_VALIDITY, |s| Duration::from_secs(s).min(MAX_VALIDITY));
    let key_encipherment = usages(spec).contains(&"key encipherment");
    match pki.sign_client_request(request, key_encipherment, valid_for) {
        Ok(pem) => Some(base64::engine::general_purpose::STANDARD.encode(pem)),
        Err(err) => {
            conditions.push(condition("Failed", "SigningError", &err.to_string(), now));
            None
        }
    }
}

/// A write to the `approval` subresource.
#[derive(Clone, Copy, Debug)]
pub enum ApprovalChange<'a> {
    /// PUT: the whole object; only its `status.conditions` are taken.
    Replace(&'a Value),
    /// PATCH of the object; only the patched `status.conditions` are taken.
    Patch(PatchType, &'a [u8]),
}

/// Writes the conditions of a CertificateSigningRequest through its `approval` subresource (as `kubectl
/// certificate approve|deny` does), then signs it when it is now approved, not denied, not failed, not yet signed
/// and a kubelet client request. Only the conditions change; Approved and Denied must be `True`, exclude each other
/// and cannot be removed once set.
pub fn write_approval(
    store: &Store,
    ctx: &Context,
    pki: &Pki,
    name: &str,
    change: ApprovalChange<'_>,
) -> Result<Outcome, ApiError> {
    let def = &ctx.def;
    let (stored, _) = crate::objects::commit(store, ctx, name, |current| {
        let current = current.ok_or_else(|| ApiError::not_found(def, name))?;
        let wanted = match change {
            ApprovalChange::Replace(object) => match object["metadata"]["name"].as_str() {
                Some(body_name) if !body_name.is_empty() && body_name != name => {
                    return Err(ApiError::BadRequest(format!(
                        "the name of the object ({body_name}) does not match the name on the URL ({name})"
                    )));
                }
                _ => object.clone(),
            },
            ApprovalChange::Patch(patch_type, body) => patch::apply(patch_type, &def.kind, current, body)
                .map_err(|err| match err {
                    patch::PatchError::InvalidBody(message) | patch::PatchError::Failed(message) => {
                        ApiError::BadRequest(message)
                    }
                })?,
        };
        if let Some(rv) = wanted["metadata"]["resourceVersion"]
            .as_str()
            .filter(|rv| !rv.is_empty())
            && Some(rv) != current["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError::stale(def, name));
        }
        let conditions = approval_conditions(def, current, &wanted, ctx.now)?;
        let mut next = (**current).clone();
        if let Some(meta) = next["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        if !next.get("status").is_some_and(Value::is_object) {
            next["status"] = json!({});
        }
        next["status"]["conditions"] = Value::Array(conditions);
        sign_if_approved(pki, &mut next, ctx.now);
        let mut unchanged = (**current).clone();
        if let Some(meta) = unchanged["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        Ok(if unchanged == next {
            Mutation::Unchanged
        } else {
            Mutation::Put(next)
        })
    })?;
    Ok(Outcome {
        object: stored.map(|o| (*o).clone()).unwrap_or_default(),
        warnings: Vec::new(),
    })
}

const CONDITION_FIELDS: &[&str] = &[
    "type",
    "status",
    "reason",
    "message",
    "lastUpdateTime",
    "lastTransitionTime",
];

/// The conditions an approval write asks for, checked and completed (timestamps) against the current ones.
fn approval_conditions(
    def: &ResourceDef,
    current: &Value,
    wanted: &Value,
    now: jiff::Timestamp,
) -> Result<Vec<Value>, ApiError> {
    let fail = |(field, reason, message): Problem| {
        let name = current["metadata"]["name"].as_str().unwrap_or_default();
        ApiError::invalid(
            def,
            name,
            vec![Cause {
                reason,
                message,
                field,
            }],
        )
    };
    let old: Vec<&Value> = current["status"]["conditions"]
        .as_array()
        .map(|list| list.iter().collect())
        .unwrap_or_default();
    let asked = match &wanted["status"]["conditions"] {
        Value::Null => Vec::new(),
        Value::Array(list) => list.clone(),
        _ => {
            return Err(fail((
                "status.conditions".into(),
                "FieldValueTypeInvalid",
                "Invalid value: must be a list".into(),
            )));
        }
    };
    let mut out: Vec<Value> = Vec::new();
    for (index, condition) in asked.iter().enumerate() {
        let checked = checked_condition(index, condition, &old, now).map_err(fail)?;
        if matches!(checked["type"].as_str(), Some("Approved" | "Denied" | "Failed"))
            && out.iter().any(|c| c["type"] == checked["type"])
        {
            return Err(fail((
                format!("status.conditions[{index}].type"),
                "FieldValueDuplicate",
                format!("Duplicate value: {}", checked["type"]),
            )));
        }
        out.push(checked);
    }
    let has = |list: &[Value], type_: &str| list.iter().any(|c| c["type"] == type_);
    if has(&out, "Approved") && has(&out, "Denied") {
        return Err(fail((
            "status.conditions".into(),
            "FieldValueInvalid",
            "Invalid value: Approved and Denied conditions are mutually exclusive".into(),
        )));
    }
    for type_ in ["Approved", "Denied"] {
        if old.iter().any(|c| c["type"] == type_) && !has(&out, type_) {
            return Err(fail((
                "status.conditions".into(),
                "FieldValueForbidden",
                format!("Forbidden: updates may not remove a condition of type \"{type_}\""),
            )));
        }
    }
    Ok(out)
}

/// A field, the reason and the message of an invalid condition.
type Problem = (String, &'static str, String);

/// One asked-for condition: only the condition fields (strings), a type, a status its type allows (Approved and
/// Denied only `True`), and timestamps (now, or for an unchanged status the previous transition time).
fn checked_condition(
    index: usize,
    condition: &Value,
    old: &[&Value],
    now: jiff::Timestamp,
) -> Result<Value, Problem> {
    let field = |key: &str| format!("status.conditions[{index}].{key}");
    let Some(fields) = condition.as_object() else {
        return Err((
            format!("status.conditions[{index}]"),
            "FieldValueTypeInvalid",
            "Invalid value: must be an object".into(),
        ));
    };
    let mut kept: Map<String, Value> = fields
        .iter()
        .filter(|(k, v)| CONDITION_FIELDS.contains(&k.as_str()) && v.is_string())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let text = |key: &str| {
        kept.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (type_, status) = (text("type"), text("status"));
    if type_.is_empty() {
        return Err((field("type"), "FieldValueRequired", "Required value".into()));
    }
    let allowed_statuses: &[&str] = if matches!(type_.as_str(), "Approved" | "Denied") {
        &["True"]
    } else {
        &["True", "False", "Unknown"]
    };
    if !allowed_statuses.contains(&status.as_str()) {
        return Err((
            field("status"),
            "FieldValueNotSupported",
            format!(
                "Unsupported value: \"{status}\": supported values: \"{}\"",
                allowed_statuses.join("\", \"")
            ),
        ));
    }
    kept.entry("lastUpdateTime")
        .or_insert_with(|| json!(timestamp(now)));
    if !kept.contains_key("lastTransitionTime") {
        let since = old
            .iter()
            .find(|c| c["type"] == type_.as_str() && c["status"] == status.as_str())
            .and_then(|c| c["lastTransitionTime"].as_str())
            .map_or_else(|| timestamp(now), str::to_owned);
        kept.insert("lastTransitionTime".into(), json!(since));
    }
    Ok(Value::Object(kept))
}

/// Signs the request of `csr` when it is approved, not denied or failed, not yet signed, and for the kubelet
/// client signer (requests for other signers wait for a signer this server does not run).
fn sign_if_approved(pki: &Pki, csr: &mut Value, now: jiff::Timestamp) {
    let conditions = csr["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let has = |type_: &str| conditions.iter().any(|c| c["type"] == type_);
    let signed = csr["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty());
    if !has("Approved") || has("Denied") || has("Failed") || signed {
        return;
    }
    if csr["spec"]["signerName"].as_str() != Some(KUBELET_CLIENT_SIGNER) {
        return;
    }
    let mut conditions = conditions;
    let certificate = match certificate_request(&csr["spec"]) {
        Ok(request) => sign(pki, &csr["spec"], &request, &mut conditions, now),
        Err(message) => {
            conditions.push(condition("Failed", "SignerValidationFailure", &message, now));
            None
        }
    };
    csr["status"]["conditions"] = Value::Array(conditions);
    if let Some(certificate) = certificate {
        csr["status"]["certificate"] = json!(certificate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{auth::BOOTSTRAPPERS_GROUP, objects::FieldValidation, registry::Registry};
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
    use std::sync::Arc;

    fn request_pem(common_name: &str, organization: &str) -> String {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, common_name);
        name.push(DnType::OrganizationName, organization);
        params.distinguished_name = name;
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn csr(common_name: &str, organization: &str, usages: &[&str]) -> Value {
        json!({
            "metadata": { "name": "c1" },
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(request_pem(common_name, organization)),
                "signerName": KUBELET_CLIENT_SIGNER,
                "usages": usages,
                "username": "forged",
                "groups": ["system:masters"],
            },
            "status": { "certificate": "Zm9yZ2Vk" },
        })
    }

    const KUBELET_USAGES: &[&str] = &["digital signature", "client auth"];

    fn def() -> Arc<ResourceDef> {
        Registry::new()
            .find("certificates.k8s.io", "v1", "certificatesigningrequests")
            .unwrap()
    }

    fn pki() -> (tempfile::TempDir, Pki) {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::load_or_create(dir.path(), &[]).unwrap();
        (dir, pki)
    }

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    fn bootstrapper() -> User {
        user("system:bootstrap:abcdef", &[BOOTSTRAPPERS_GROUP])
    }

    fn certificate_pem(object: &Value) -> String {
        let encoded = object["status"]["certificate"].as_str().expect("a certificate");
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(encoded).unwrap()).unwrap()
    }

    #[test]
    fn a_bootstrap_token_gets_a_kubelet_client_request_approved_and_signed_for_its_key() {
        let (_dir, pki) = pki();
        let mut object = csr("system:node:n1", "system:nodes", KUBELET_USAGES);
        prepare_create(&pki, &bootstrapper(), &def(), &mut object, jiff::Timestamp::now()).unwrap();
        assert_eq!(object["spec"]["username"], "system:bootstrap:abcdef");
        assert_eq!(object["spec"]["groups"], json!([BOOTSTRAPPERS_GROUP]));
        let conditions = object["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0]["type"], "Approved");
        assert_eq!(conditions[0]["reason"], "AutoApproved");
        let cert = certificate_pem(&object);
        let der = rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let user = crate::auth::user_from_certificate(&der).unwrap();
        assert_eq!(user, user_named_node("n1"));
    }

    use rustls::pki_types::pem::PemObject as _;

    fn user_named_node(node: &str) -> User {
        user(&format!("system:node:{node}"), &[NODES_GROUP])
    }

    #[test]
    fn a_node_renews_for_itself_but_not_for_another_node() {
        let (_dir, pki) = pki();
        let now = jiff::Timestamp::now();
        let mut own = csr(
            "system:node:n1",
            "system:nodes",
            &["key encipherment", "digital signature", "client auth"],
        );
        prepare_create(&pki, &user_named_node("n1"), &def(), &mut own, now).unwrap();
        assert!(own["status"]["certificate"].is_string());
        assert_eq!(own["status"]["conditions"][0]["reason"], "AutoApproved");

        let mut other = csr("system:node:n2", "system:nodes", KUBELET_USAGES);
        prepare_create(&pki, &user_named_node("n1"), &def(), &mut other, now).unwrap();
        assert!(other.get("status").is_none(), "pending: {other}");
    }

    #[test]
    fn requests_that_are_not_for_a_kubelet_client_stay_pending() {
        let (_dir, pki) = pki();
        let now = jiff::Timestamp::now();
        for mut object in [
            csr("system:node:n1", "system:masters", KUBELET_USAGES),
            csr("admin", "system:nodes", KUBELET_USAGES),
            csr(
                "system:node:n1",
                "system:nodes",
                &["digital signature", "client auth", "server auth"],
            ),
            csr("system:node:n1", "system:nodes", &["client auth"]),
            {
                let mut other_signer = csr("system:node:n1", "system:nodes", KUBELET_USAGES);
                other_signer["spec"]["signerName"] = json!("kubernetes.io/kube-apiserver-client");
                other_signer
            },
        ] {
            prepare_create(&pki, &bootstrapper(), &def(), &mut object, now).unwrap();
            assert!(object.get("status").is_none(), "pending: {}", object["spec"]);
        }
        // Only bootstrap tokens and the node itself: a stranger's request waits.
        let mut object = csr("system:node:n1", "system:nodes", KUBELET_USAGES);
        prepare_create(&pki, &user("someone", &[]), &def(), &mut object, now).unwrap();
        assert!(object.get("status").is_none());
    }

    #[test]
    fn invalid_requests_are_422() {
        let (_dir, pki) = pki();
        let now = jiff::Timestamp::now();
        let field_of = |error: ApiError| match error {
            ApiError::Invalid(_, causes) => causes[0].field.clone(),
            other => panic!("{other:?}"),
        };
        let mut garbage = csr("system:node:n1", "system:nodes", KUBELET_USAGES);
        garbage["spec"]["request"] = json!(base64::engine::general_purpose::STANDARD.encode("junk"));
        let error = prepare_create(&pki, &bootstrapper(), &def(), &mut garbage, now).unwrap_err();
        assert_eq!(field_of(error), "spec.request");

        let mut no_signer = csr("system:node:n1", "system:nodes", KUBELET_USAGES);
        no_signer["spec"]["signerName"] = json!("kubelet");
        let error = prepare_create(&pki, &bootstrapper(), &def(), &mut no_signer, now).unwrap_err();
        assert_eq!(field_of(error), "spec.signerName");

        let mut odd_usage = csr("system:node:n1", "system:nodes", &["client auth", "flying"]);
        let error = prepare_create(&pki, &bootstrapper(), &def(), &mut odd_usage, now).unwrap_err();
        assert_eq!(field_of(error), "spec.usages[1]");

        let mut short = csr("system:node:n1", "system:nodes", KUBELET_USAGES);
        short["spec"]["expirationSeconds"] = json!(60);
        let error = prepare_create(&pki, &bootstrapper(), &def(), &mut short, now).unwrap_err();
        assert_eq!(field_of(error), "spec.expirationSeconds");
    }

    fn stored_pending(store: &Store, ctx: &Context, pki: &Pki, common_name: &str, admin: &User) {
        let mut object = csr(common_name, "system:nodes", KUBELET_USAGES);
        prepare_create(pki, admin, &ctx.def, &mut object, ctx.now).unwrap();
        assert!(object.get("status").is_none());
        crate::objects::create(store, ctx, object).unwrap();
    }

    fn approve(reason: &str) -> Value {
        json!({ "status": { "conditions": [{ "type": "Approved", "status": "True", "reason": reason }] } })
    }

    #[test]
    fn an_admin_approval_signs_any_node_and_a_denial_never_signs() {
        let (_dir, pki) = pki();
        let store = Store::open(None, 100).unwrap();
        let ctx = Context {
            def: def(),
            namespace: String::new(),
            now: jiff::Timestamp::now(),
            field_validation: FieldValidation::Strict,
            admission: false,
            manager: None,
            dry_run: false,
        };
        let admin = user("admin", &["system:masters"]);
        stored_pending(&store, &ctx, &pki, "system:node:n7", &admin);
        let approved = write_approval(
            &store,
            &ctx,
            &pki,
            "c1",
            ApprovalChange::Replace(&approve("ByAdmin")),
        )
        .unwrap();
        assert_eq!(approved.object["status"]["conditions"][0]["reason"], "ByAdmin");
        assert!(approved.object["status"]["conditions"][0]["lastUpdateTime"].is_string());
        assert!(certificate_pem(&approved.object).starts_with("-----BEGIN CERTIFICATE-----"));
        // The approval cannot be taken back, nor turned into a denial.
        let error =
            write_approval(&store, &ctx, &pki, "c1", ApprovalChange::Replace(&json!({}))).unwrap_err();
        assert!(matches!(error, ApiError::Invalid(..)), "{error:?}");
        let both = json!({ "status": { "conditions": [
            { "type": "Approved", "status": "True" }, { "type": "Denied", "status": "True" }
        ] } });
        assert!(write_approval(&store, &ctx, &pki, "c1", ApprovalChange::Replace(&both)).is_err());

        // A denied request is never signed, even when someone approves it later.
        let mut second = csr("system:node:n8", "system:nodes", KUBELET_USAGES);
        second["metadata"]["name"] = json!("c2");
        prepare_create(&pki, &admin, &ctx.def, &mut second, ctx.now).unwrap();
        crate::objects::create(&store, &ctx, second).unwrap();
        let deny = br#"{"status":{"conditions":[{"type":"Denied","status":"True","reason":"No"}]}}"#;
        let outcome = write_approval(
            &store,
            &ctx,
            &pki,
            "c2",
            ApprovalChange::Patch(PatchType::Merge, deny),
        )
        .unwrap();
        assert_eq!(outcome.object["status"]["conditions"][0]["type"], "Denied");
        assert!(outcome.object["status"].get("certificate").is_none());
        let error = write_approval(
            &store,
            &ctx,
            &pki,
            "c2",
            ApprovalChange::Replace(&approve("Late")),
        )
        .unwrap_err();
        assert!(matches!(error, ApiError::Invalid(..)), "{error:?}");
    }

    #[test]
    fn an_approved_request_that_is_not_a_kubelet_client_request_fails_instead_of_being_signed() {
        let (_dir, pki) = pki();
        let store = Store::open(None, 100).unwrap();
        let ctx = Context {
            def: def(),
            namespace: String::new(),
            now: jiff::Timestamp::now(),
            field_validation: FieldValidation::Strict,
            admission: false,
            manager: None,
            dry_run: false,
        };
        let mut object = csr("admin", "system:nodes", KUBELET_USAGES);
        prepare_create(
            &pki,
            &user("admin", &["system:masters"]),
            &ctx.def,
            &mut object,
            ctx.now,
        )
        .unwrap();
        crate::objects::create(&store, &ctx, object).unwrap();
        let outcome = write_approval(
            &store,
            &ctx,
            &pki,
            "c1",
            ApprovalChange::Replace(&approve("ByAdmin")),
        )
        .unwrap();
        let conditions = outcome.object["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions[1]["type"], "Failed");
        assert_eq!(conditions[1]["reason"], "SignerValidationFailure");
        assert!(outcome.object["status"].get("certificate").is_none());
    }
}
