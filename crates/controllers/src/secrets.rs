//! Secrets read one at a time, so that one bad Secret cannot stop a namespace.
//!
//! A real cluster can hold a Secret whose `data` values are not base64 (written by an old client or straight into
//! etcd; the reference AWS provider's sample secret is one). Read as `Secret`, such an object fails the decoding of
//! the whole list or watch event it comes in: the cache never syncs and no machine of the namespace is reconciled,
//! and kube's client logs the body of the response — the Secret's values — at WARN. Here Secrets are watched as
//! dynamic objects (any JSON decodes) and each is decoded alone: a good one goes to the cache, a bad one goes to the
//! cache with its metadata only and is recorded in [`Undecodable`] by name, with the keys that are wrong (never a
//! value). The machine controller reports it on the machines that use it and goes on with every other machine.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    runtime::watcher,
};
use mcm_api::MachineClass;

/// The secret a class's provider gets: the data of `secrets` merged in order, a later key winning. Given the Secrets
/// of [`mcm_core::validity::secret_references`] in that order, the `credentialsSecretRef` data lies on top of the
/// `secretRef` data, as in the reference.
pub fn merged(secrets: impl IntoIterator<Item = Secret>) -> Secret {
    let mut data = BTreeMap::new();
    for secret in secrets {
        data.extend(secret.data.unwrap_or_default());
    }
    Secret {
        data: Some(data),
        ..Secret::default()
    }
}

/// Why a stored Secret cannot be read as a Secret. Names keys, never values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretDecodeError {
    /// Values of `data` that are not base64 strings.
    #[error("{}: not valid base64", .keys.iter().map(|k| format!("data.{k}")).collect::<Vec<_>>().join(", "))]
    NotBase64 {
        /// The keys whose values are wrong.
        keys: Vec<String>,
    },
    /// Something else does not fit the Secret schema.
    #[error("the object does not fit the Secret schema ({0})")]
    Malformed(String),
}

/// Decodes one stored Secret on its own.
pub fn decode(object: &DynamicObject) -> Result<Secret, SecretDecodeError> {
    let value = serde_json::to_value(object).map_err(|err| SecretDecodeError::Malformed(class_of(&err)))?;
    match serde_json::from_value::<Secret>(value) {
        Ok(secret) => Ok(secret),
        Err(err) => {
            let keys: Vec<String> = object
                .data
                .get("data")
                .and_then(serde_json::Value::as_object)
                .map(|data| {
                    data.iter()
                        .filter(|(_, v)| !is_base64_string(v))
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .unwrap_or_default();
            if keys.is_empty() {
                Err(SecretDecodeError::Malformed(class_of(&err)))
            } else {
                Err(SecretDecodeError::NotBase64 { keys })
            }
        }
    }
}

fn is_base64_string(value: &serde_json::Value) -> bool {
    use base64::Engine as _;
    value.is_null()
        || value
            .as_str()
            .is_some_and(|text| base64::engine::general_purpose::STANDARD.decode(text).is_ok())
}

/// The class of a JSON error, without its text (which can quote a value).
pub(crate) fn class_of(err: &serde_json::Error) -> String {
    let class = match err.classify() {
        serde_json::error::Category::Io => "I/O",
        serde_json::error::Category::Syntax => "syntax",
        serde_json::error::Category::Data => "data",
        serde_json::error::Category::Eof => "end of input",
    };
    if err.line() == 0 {
        format!("{class} error")
    } else {
        format!("{class} error at line {}, column {}", err.line(), err.column())
    }
}

/// The Secrets that could not be decoded: `namespace/name` → why (keys, never values).
#[derive(Clone, Debug, Default)]
pub struct Undecodable(Arc<Mutex<BTreeMap<String, SecretDecodeError>>>);

impl Undecodable {
    fn key(namespace: &str, name: &str) -> String {
        format!("{namespace}/{name}")
    }

    fn set(&self, namespace: &str, name: &str, error: Option<SecretDecodeError>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let key = Self::key(namespace, name);
        match error {
            Some(error) => {
                if map.get(&key) != Some(&error) {
                    tracing::warn!(secret = name, namespace, error = %error,
                        "Secret cannot be decoded; it is skipped until it is fixed");
                }
                map.insert(key, error);
            }
            None => {
                map.remove(&key);
            }
        }
    }

    /// Why the Secret cannot be decoded, if it cannot.
    pub fn get(&self, namespace: &str, name: &str) -> Option<SecretDecodeError> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&Self::key(namespace, name))
            .cloned()
    }

    /// What is wrong with the Secrets a class refers to, as a field path and a reason
    /// (`secretRef: Secret "ns/x" cannot be decoded: data.userData: not valid base64`); None when they are fine.
    pub fn problem_of(&self, class: &MachineClass, default_namespace: &str) -> Option<String> {
        let problems: Vec<String> = [
            ("secretRef", &class.secret_ref),
            ("credentialsSecretRef", &class.credentials_secret_ref),
        ]
        .into_iter()
        .filter_map(|(field, reference)| {
            let reference = reference.as_ref()?;
            let name = reference.name.as_deref()?;
            let namespace = reference
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(default_namespace);
            let error = self.get(namespace, name)?;
            Some(format!(
                "{field}: Secret \"{namespace}/{name}\" cannot be decoded: {error}"
            ))
        })
        .collect();
        (!problems.is_empty()).then(|| problems.join("; "))
    }
}

/// A Secret as the cache holds it: decoded, or with its metadata only when it cannot be (recorded in `undecodable`).
fn admit(object: DynamicObject, undecodable: &Undecodable) -> Secret {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    match decode(&object) {
        Ok(secret) => {
            undecodable.set(&namespace, &name, None);
            secret
        }
        Err(error) => {
            undecodable.set(&namespace, &name, Some(error));
            Secret {
                metadata: object.metadata,
                ..Secret::default()
            }
        }
    }
}

/// A watch of the Secrets of `namespace` that never fails on a Secret's content: each is decoded alone (see the
/// module). Feed it to a reflector as any watcher stream.
pub fn watch(
    client: Client,
    namespace: &str,
    undecodable: Undecodable,
) -> impl Stream<Item = Result<watcher::Event<Secret>, watcher::Error>> + Send + 'static {
    let resource = ApiResource::erase::<Secret>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &resource);
    watcher(api, watcher::Config::default()).map(move |event| {
        event.map(|event| match event {
            watcher::Event::Apply(object) => watcher::Event::Apply(admit(object, &undecodable)),
            watcher::Event::InitApply(object) => watcher::Event::InitApply(admit(object, &undecodable)),
            watcher::Event::Delete(object) => {
                // Gone: forgotten, without a word about its content.
                undecodable.set(
                    object.metadata.namespace.as_deref().unwrap_or_default(),
                    object.metadata.name.as_deref().unwrap_or_default(),
                    None,
                );
                let metadata = object.metadata.clone();
                watcher::Event::Delete(decode(&object).unwrap_or_else(|_| Secret {
                    metadata,
                    ..Secret::default()
                }))
            }
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
        })
    })
}

#[cfg(test)]
mod tests {
    use mcm_api::builders::MachineClassBuilder;

    use super::*;

    #[allow(clippy::needless_pass_by_value)] // json! values read best inline
    fn object(data: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "aws", "namespace": "ns"},
            "type": "Opaque",
            "data": data,
        }))
        .unwrap()
    }

    #[test]
    fn the_merged_secret_has_the_later_secrets_keys_on_top() {
        let secret = |pairs: &[(&str, &str)]| Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), k8s_openapi::ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let user_data = secret(&[("userData", "boot"), ("region", "eu")]);
        let credentials = secret(&[("region", "us"), ("accessKeyID", "AKIA")]);
        let merged = merged([user_data, credentials, Secret::default()]);
        let text: BTreeMap<&str, &[u8]> = merged
            .data
            .as_ref()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.0.as_slice()))
            .collect();
        assert_eq!(
            text,
            BTreeMap::from([
                ("accessKeyID", b"AKIA".as_slice()),
                ("region", b"us".as_slice()),
                ("userData", b"boot".as_slice())
            ])
        );
        assert_eq!(merged.metadata.name, None, "the merge is no stored Secret");
    }

    #[test]
    fn a_good_secret_decodes() {
        let secret = decode(&object(serde_json::json!({"userData": "IyEvYmluL2Jhc2g="}))).unwrap();
        assert_eq!(secret.data.unwrap()["userData"].0, b"#!/bin/bash");
    }

    #[test]
    fn a_secret_with_plain_text_values_names_its_keys_and_no_value() {
        let bad = object(serde_json::json!({
            "userData": "#!/bin/bash\necho hi",
            "providerAccessKeyId": "AKIA-plain-text",
            "region": "ZXUtd2VzdC0x",
        }));
        let error = decode(&bad).unwrap_err();
        let text = error.to_string();
        assert_eq!(text, "data.providerAccessKeyId, data.userData: not valid base64");

        let undecodable = Undecodable::default();
        let cached = admit(bad, &undecodable);
        assert!(cached.data.is_none(), "no value is kept");
        assert_eq!(cached.metadata.name.as_deref(), Some("aws"));
        let class = MachineClassBuilder::new("aws").secret_ref("aws", "ns").build();
        let problem = undecodable.problem_of(&class, "other").unwrap();
        assert_eq!(
            problem,
            "secretRef: Secret \"ns/aws\" cannot be decoded: data.providerAccessKeyId, data.userData: not valid base64"
        );
        assert!(!problem.contains("AKIA") && !problem.contains("echo"));
        // Fixed: forgotten.
        admit(object(serde_json::json!({"userData": "aGk="})), &undecodable);
        assert_eq!(undecodable.problem_of(&class, "other"), None);
    }

    #[test]
    fn other_misfits_give_the_error_class_only() {
        let bad: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "x"},
            "type": {"secret-looking": "AKIA-in-a-wrong-place"},
        }))
        .unwrap();
        let text = decode(&bad).unwrap_err().to_string();
        assert_eq!(text, "the object does not fit the Secret schema (data error)");
    }
}
