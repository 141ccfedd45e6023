//! providerSpec decoding of each provider (sim, local, aws, with aws's validation against a credentials Secret):
//! valid specs with fields replaced by arbitrary values, and arbitrary values. Must hold: no panic; a sim spec has
//! no differences from itself.

use std::collections::BTreeMap;

use arbitrary::{Result, Unstructured};
use k8s_openapi::{ByteString, api::core::v1::Secret};
use serde_json::{Value, json};

use crate::json;

/// A valid providerSpec of each provider, as the examples write them.
fn templates() -> [Value; 3] {
    [
        json!({ "image": "ubuntu", "size": "small", "tags": { "team": "a" } }),
        json!({ "size": "small", "image": "ubuntu:24.04", "tags": { "pool": "workers" } }),
        json!({
            "ami": "ami-123", "region": "eu-west-1", "machineType": "m5.large", "keyName": "key",
            "iam": { "name": "role" },
            "networkInterfaces": [{ "subnetID": "subnet-1", "securityGroupIDs": ["sg-1"] }],
            "blockDevices": [{ "ebs": { "volumeSize": 50, "volumeType": "gp3" } }],
            "tags": { "kubernetes.io/cluster/c": "1", "kubernetes.io/role/node": "1" },
        }),
    ]
}

fn spec(u: &mut Unstructured<'_>) -> Result<Value> {
    if u.ratio(1, 4)? {
        return json::value(u, 4);
    }
    let mut spec = u.choose(&templates())?.clone();
    for _ in 0..u.int_in_range(0..=3)? {
        if let Some(map) = spec.as_object_mut() {
            let key = if u.ratio(2, 3)? && !map.is_empty() {
                let keys: Vec<String> = map.keys().cloned().collect();
                u.choose(&keys)?.clone()
            } else {
                json::key(u)?
            };
            map.insert(key, json::value(u, 3)?);
        }
    }
    Ok(spec)
}

fn secret(u: &mut Unstructured<'_>) -> Result<Secret> {
    let mut data = BTreeMap::new();
    for _ in 0..u.int_in_range(0..=3)? {
        let key = *u.choose(&[
            "providerAccessKeyId",
            "providerSecretAccessKey",
            "userData",
            "accessKeyID",
            "secretAccessKey",
            "other",
        ])?;
        data.insert(key.to_owned(), ByteString(u.arbitrary()?));
    }
    Ok(Secret {
        data: Some(data),
        ..Secret::default()
    })
}

/// Decodes the providerSpec the bytes describe with each provider.
///
/// # Panics
///
/// When a sim spec differs from itself: the bug the target looks for.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(value), Ok(secret)) = (spec(&mut u), secret(&mut u)) else {
        return;
    };
    if let Ok(sim) = mcm_provider_sim::provider_spec::ProviderSpec::parse(&value) {
        assert!(
            sim.differences(&sim).is_empty(),
            "a sim spec equals itself: {value}"
        );
    }
    let _ = mcm_provider_local::spec::ProviderSpec::parse(&value);
    if let Ok(aws) = mcm_provider_aws::spec::parse(&value) {
        let _ = mcm_provider_aws::validation::problems(&aws, &secret);
    }
    let _ = mcm_provider_aws::validation::validated(&value, &secret);
}
