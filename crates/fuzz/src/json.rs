//! Arbitrary JSON values biased towards the shapes the targets read (Kubernetes metadata keys, label-like strings,
//! small numbers), so that the fuzzer reaches past the first type check.

use arbitrary::{Result, Unstructured};
use serde_json::{Map, Value, json};

/// Keys the API objects and provider specs use, picked more often than arbitrary strings.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "generateName",
    "labels",
    "annotations",
    "finalizers",
    "resourceVersion",
    "uid",
    "ownerReferences",
    "deletionTimestamp",
    "spec",
    "status",
    "replicas",
    "selector",
    "matchLabels",
    "template",
    "class",
    "providerID",
    "nodeTemplate",
    "data",
    "stringData",
    "type",
    "provider",
    "providerSpec",
    "secretRef",
    "credentialsSecretRef",
    "image",
    "size",
    "tags",
    "ami",
    "region",
    "machineType",
    "blockDevices",
    "ebs",
    "volumeSize",
    "volumeType",
    "networkInterfaces",
    "subnetID",
    "iam",
    "keyName",
    "currentStatus",
    "phase",
    "lastOperation",
    "conditions",
    "items",
    "op",
    "path",
    "value",
    "from",
    "$patch",
    "$retainKeys",
    "$setElementOrder/conditions",
    "$deleteFromPrimitiveList/finalizers",
    "capacity",
    "resources",
];

/// Strings that are meaningful somewhere (names, versions, quantities, label syntax), or arbitrary ones.
const STRINGS: &[&str] = &[
    "",
    "a",
    "m1",
    "default",
    "machine.sapcloud.io/v1alpha1",
    "v1",
    "Machine",
    "MachineClass",
    "MachineSet",
    "Secret",
    "Pod",
    "Node",
    "sim",
    "local",
    "aws",
    "small",
    "large",
    "ubuntu",
    "1",
    "0",
    "-1",
    "1Gi",
    "500m",
    "Running",
    "Pending",
    "Failed",
    "a/b",
    "example.com/x",
    "add",
    "remove",
    "replace",
    "move",
    "copy",
    "test",
    "/metadata/labels/a",
    "/spec/replicas",
    "/-",
    "/",
    "~1",
    "merge",
    "delete",
    "replace",
    "Bad_Name",
];

/// A string from [`STRINGS`] or an arbitrary one.
pub fn string(u: &mut Unstructured<'_>) -> Result<String> {
    if u.ratio(2, 3)? {
        Ok((*u.choose(STRINGS)?).to_owned())
    } else {
        u.arbitrary()
    }
}

/// A key from [`KEYS`] or an arbitrary one.
pub fn key(u: &mut Unstructured<'_>) -> Result<String> {
    if u.ratio(3, 4)? {
        Ok((*u.choose(KEYS)?).to_owned())
    } else {
        u.arbitrary()
    }
}

/// A string-to-string map (labels, annotations, secret data).
pub fn string_map(u: &mut Unstructured<'_>) -> Result<Value> {
    let mut map = Map::new();
    for _ in 0..u.int_in_range(0..=4)? {
        map.insert(string(u)?, json!(string(u)?));
    }
    Ok(Value::Object(map))
}

/// An arbitrary value, nested at most `depth` levels.
pub fn value(u: &mut Unstructured<'_>, depth: u8) -> Result<Value> {
    let choice = if depth == 0 {
        u.int_in_range(0..=4)?
    } else {
        u.int_in_range(0..=7)?
    };
    Ok(match choice {
        0 => Value::Null,
        1 => json!(u.arbitrary::<bool>()?),
        2 => json!(u.int_in_range(-3..=100_i64)?),
        3 => {
            let f: f64 = u.arbitrary()?;
            if f.is_finite() {
                json!(f)
            } else {
                json!(u.arbitrary::<i64>()?)
            }
        }
        4 => json!(string(u)?),
        5 => string_map(u)?,
        6 => {
            let mut list = Vec::new();
            for _ in 0..u.int_in_range(0..=3)? {
                list.push(value(u, depth - 1)?);
            }
            Value::Array(list)
        }
        _ => {
            let mut map = Map::new();
            for _ in 0..u.int_in_range(0..=5)? {
                map.insert(key(u)?, value(u, depth - 1)?);
            }
            Value::Object(map)
        }
    })
}

/// An object with apiVersion, kind and metadata (name, labels, annotations, ...) and arbitrary other fields.
pub fn object(u: &mut Unstructured<'_>) -> Result<Value> {
    let mut meta = Map::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let field = *u.choose(&[
            "name",
            "generateName",
            "namespace",
            "labels",
            "annotations",
            "resourceVersion",
            "finalizers",
            "uid",
            "ownerReferences",
        ])?;
        let v = match field {
            "labels" | "annotations" => string_map(u)?,
            "finalizers" => json!([string(u)?]),
            "ownerReferences" => value(u, 2)?,
            _ => json!(string(u)?),
        };
        meta.insert(field.to_owned(), v);
    }
    let mut object = Map::new();
    if u.ratio(7, 8)? {
        object.insert("apiVersion".into(), json!(string(u)?));
    }
    if u.ratio(7, 8)? {
        object.insert("kind".into(), json!(string(u)?));
    }
    object.insert("metadata".into(), Value::Object(meta));
    for _ in 0..u.int_in_range(0..=3)? {
        object.insert(key(u)?, value(u, 3)?);
    }
    Ok(Value::Object(object))
}
