//! Test hook of `mcm apiserver --test-raw-object FILE`: objects written straight into the store at start, with no
//! admission, validation or defaulting, as a real cluster can hold objects the API server would refuse today
//! (written by an old client, or into etcd directly): e.g. a Secret whose `data` is not base64. Tests use it to
//! check that the controllers cope with such objects. Never needed outside tests.

use std::path::Path;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// Stores every object of the YAML or JSON documents of `file` as it is (see the module). The resource is the
/// kind in lower case plus `s` (`Secret` → `secrets`, `Node` → `nodes`); a missing `uid` and `creationTimestamp`
/// are filled in, the resourceVersion is the store's.
pub(crate) fn store(server: &mcm_apiserver::ApiServer, file: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("--test-raw-object {}", file.display()))?;
    let objects: Vec<Value> = serde_saphyr::from_multiple(&text)
        .with_context(|| format!("--test-raw-object {}: not YAML or JSON", file.display()))?;
    for (index, mut object) in objects.into_iter().enumerate() {
        let field = |path: &str| object.pointer(path).and_then(Value::as_str).map(str::to_owned);
        let (Some(api_version), Some(kind), Some(name)) =
            (field("/apiVersion"), field("/kind"), field("/metadata/name"))
        else {
            bail!(
                "--test-raw-object {}: document {index} needs apiVersion, kind and metadata.name",
                file.display()
            );
        };
        let namespace = field("/metadata/namespace").unwrap_or_default();
        let group = api_version
            .rsplit_once('/')
            .map_or("", |(group, _)| group)
            .to_owned();
        let resource = format!("{group}/{}s", kind.to_lowercase());
        let created = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata
                .entry("uid")
                .or_insert_with(|| json!(format!("raw-{namespace}-{name}")));
            metadata
                .entry("creationTimestamp")
                .or_insert_with(|| json!(created));
        }
        server
            .store()
            .mutate(&resource, &namespace, &name, |_| {
                Ok(mcm_apiserver::store::Mutation::Put(object))
            })
            .map_err(|err| anyhow::anyhow!("--test-raw-object {}: {err}", file.display()))?;
        println!("mcm apiserver: stored {resource} {namespace}/{name} as it is (test hook)");
    }
    Ok(())
}
