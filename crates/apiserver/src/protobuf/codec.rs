//! The Kubernetes protobuf encoding of the built-in kinds, converted to and from our JSON objects by walking the
//! message descriptors of `proto/k8s.proto` (one generic converter instead of code per type).
//!
//! A body is the magic `k8s\0` followed by a `runtime.Unknown` envelope: `typeMeta` (apiVersion, kind) and `raw`,
//! the object's message. The JSON forms that are not a plain field-by-field mapping are handled once, by message:
//! `resource.Quantity` (a string), `meta.v1.Time` / `MicroTime` (RFC 3339 strings), `meta.v1.Duration` (a Go
//! duration string), `intstr.IntOrString` (a number or a string), `runtime.RawExtension` and `meta.v1.FieldsV1`
//! (embedded JSON), and `bytes` fields (base64).

use std::sync::LazyLock;

use base64::Engine as _;
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage as _,
    Value as Proto,
};
use serde_json::{Map, Value};

/// The four bytes every Kubernetes protobuf body starts with.
pub const MAGIC: &[u8; 4] = b"k8s\0";

const QUANTITY: &str = "k8s.apimachinery_pkg_api_resource_Quantity";
const TIME: &str = "k8s.apimachinery_pkg_apis_meta_v1_Time";
const MICRO_TIME: &str = "k8s.apimachinery_pkg_apis_meta_v1_MicroTime";
const DURATION: &str = "k8s.apimachinery_pkg_apis_meta_v1_Duration";
const INT_OR_STRING: &str = "k8s.apimachinery_pkg_util_intstr_IntOrString";
const RAW_EXTENSION: &str = "k8s.apimachinery_pkg_runtime_RawExtension";
const FIELDS_V1: &str = "k8s.apimachinery_pkg_apis_meta_v1_FieldsV1";
const UNKNOWN: &str = "k8s.apimachinery_pkg_runtime_Unknown";
const META_V1: &str = "k8s.apimachinery_pkg_apis_meta_v1_";
/// The name prefix of a field Go embeds (`json:",inline"`): its fields sit in the parent's JSON object.
const INLINE: &str = "inline_";

/// The descriptors compiled from `proto/k8s.proto` by build.rs.
static POOL: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/k8s.bin")).as_ref())
        .map_err(|err| err.to_string())
});

/// Why a body cannot be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The body does not start with `k8s\0`.
    #[error("the protobuf body does not start with the Kubernetes magic prefix k8s\\0")]
    NoMagic,
    /// The envelope or the object's message is not valid protobuf.
    #[error("the protobuf body cannot be decoded: {0}")]
    Malformed(String),
    /// The envelope names an encoding we do not read (`contentEncoding`).
    #[error("the protobuf envelope's contentEncoding {0:?} is not supported")]
    ContentEncoding(String),
    /// No message describes this kind.
    #[error("{kind} in version {api_version:?} has no protobuf encoding on this server")]
    UnknownKind {
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
    },
    /// A field's JSON value does not fit its protobuf type.
    #[error("{path}: {reason}")]
    Field {
        /// The field's JSON path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The compiled descriptors could not be loaded (a build defect).
    #[error("the protobuf descriptors cannot be loaded: {0}")]
    Descriptors(String),
}

fn pool() -> Result<&'static DescriptorPool, CodecError> {
    POOL.as_ref().map_err(|err| CodecError::Descriptors(err.clone()))
}

/// The message of a kind: `api.<first label of the group>.<version>.<Kind>`, else a `meta.k8s.io/v1` kind (Status,
/// DeleteOptions, WatchEvent) that every group version carries.
pub fn message_for(api_version: &str, kind: &str) -> Result<MessageDescriptor, CodecError> {
    let pool = pool()?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let short = group
        .split('.')
        .next()
        .filter(|g| !g.is_empty())
        .unwrap_or("core");
    let short = if group == "meta.k8s.io" { "" } else { short };
    pool.get_message_by_name(&format!("k8s.api_{short}_{version}_{kind}"))
        .or_else(|| pool.get_message_by_name(&format!("{META_V1}{kind}")))
        .ok_or_else(|| CodecError::UnknownKind {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        })
}

/// True when the kind of this apiVersion has a protobuf encoding here.
pub fn has_message(api_version: &str, kind: &str) -> bool {
    message_for(api_version, kind).is_ok()
}

/// Encodes a JSON object (with `apiVersion` and `kind`) as a Kubernetes protobuf body.
pub fn encode(object: &Value) -> Result<Vec<u8>, CodecError> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let descriptor = message_for(api_version, kind)?;
    let raw = to_message(&descriptor, object, "")?.encode_to_vec();
    let envelope = json_envelope(api_version, kind);
    let mut message = to_message(&unknown()?, &envelope, "")?;
    set(&mut message, "raw", Proto::Bytes(raw.into()));
    let mut body = MAGIC.to_vec();
    message
        .encode(&mut body)
        .map_err(|err| CodecError::Malformed(err.to_string()))?;
    Ok(body)
}

/// Decodes a Kubernetes protobuf body into a JSON object carrying `apiVersion` and `kind` from the envelope.
pub fn decode(body: &[u8]) -> Result<Value, CodecError> {
    let rest = body.strip_prefix(MAGIC.as_slice()).ok_or(CodecError::NoMagic)?;
    let envelope =
        DynamicMessage::decode(unknown()?, rest).map_err(|err| CodecError::Malformed(err.to_string()))?;
    let meta = to_json(&envelope).unwrap_or_default();
    let encoding = meta["contentEncoding"].as_str().unwrap_or_default();
    if !encoding.is_empty() {
        return Err(CodecError::ContentEncoding(encoding.to_owned()));
    }
    let api_version = meta["typeMeta"]["apiVersion"].as_str().unwrap_or_default();
    let kind = meta["typeMeta"]["kind"].as_str().unwrap_or_default();
    let raw = match envelope.get_field_by_name("raw").as_deref() {
        Some(Proto::Bytes(raw)) => raw.clone(),
        _ => bytes::Bytes::new(),
    };
    decode_raw(api_version, kind, &raw)
}

/// Decodes an object's message (the envelope's `raw`) of a known kind into a JSON object with `apiVersion` and
/// `kind`.
pub fn decode_raw(api_version: &str, kind: &str, raw: &[u8]) -> Result<Value, CodecError> {
    let descriptor = message_for(api_version, kind)?;
    let message =
        DynamicMessage::decode(descriptor, raw).map_err(|err| CodecError::Malformed(err.to_string()))?;
    let mut object = Map::new();
    object.insert("apiVersion".into(), Value::String(api_version.to_owned()));
    object.insert("kind".into(), Value::String(kind.to_owned()));
    if let Some(Value::Object(fields)) = to_json(&message) {
        object.extend(fields);
    }
    Ok(Value::Object(object))
}

/// A watch event as the protobuf watch stream frames it: a `meta.v1.WatchEvent` without envelope whose
/// `object.raw` is the object's own protobuf body ([`encode`]).
pub fn encode_watch_event(event_type: &str, object: &Value) -> Result<Vec<u8>, CodecError> {
    let event = message_for("meta.k8s.io/v1", "WatchEvent")?;
    let mut message = DynamicMessage::new(event.clone());
    set(&mut message, "type", Proto::String(event_type.to_owned()));
    let raw_extension = pool()?
        .get_message_by_name(RAW_EXTENSION)
        .ok_or_else(|| CodecError::Descriptors(format!("{RAW_EXTENSION} is missing")))?;
    let mut raw = DynamicMessage::new(raw_extension);
    set(&mut raw, "raw", Proto::Bytes(encode(object)?.into()));
    set(&mut message, "object", Proto::Message(raw));
    Ok(message.encode_to_vec())
}

/// Decodes a `meta.v1.WatchEvent` of a protobuf watch stream (no envelope): its type and object.
pub fn decode_watch_event(frame: &[u8]) -> Result<(String, Value), CodecError> {
    let event = message_for("meta.k8s.io/v1", "WatchEvent")?;
    let message =
        DynamicMessage::decode(event, frame).map_err(|err| CodecError::Malformed(err.to_string()))?;
    let event_type = match message.get_field_by_name("type").as_deref() {
        Some(Proto::String(text)) => text.clone(),
        _ => String::new(),
    };
    let object = match message.get_field_by_name("object").as_deref() {
        Some(Proto::Message(raw)) => to_json(raw).unwrap_or_default(),
        _ => Value::Null,
    };
    Ok((event_type, object))
}

fn unknown() -> Result<MessageDescriptor, CodecError> {
    pool()?
        .get_message_by_name(UNKNOWN)
        .ok_or_else(|| CodecError::Descriptors(format!("{UNKNOWN} is missing")))
}

/// The envelope's fields other than `raw`, as kube-apiserver writes them (empty encoding and type).
fn json_envelope(api_version: &str, kind: &str) -> Value {
    serde_json::json!({
        "typeMeta": { "apiVersion": api_version, "kind": kind },
        "contentEncoding": "",
        "contentType": "",
    })
}

fn set(message: &mut DynamicMessage, name: &str, value: Proto) {
    if let Some(field) = message.descriptor().get_field_by_name(name) {
        message.set_field(&field, value);
    }
}

fn field_error(path: &str, reason: impl Into<String>) -> CodecError {
    CodecError::Field {
        path: path.trim_start_matches('.').to_owned(),
        reason: reason.into(),
    }
}

/// A JSON value as the message `descriptor`; `path` names it in errors.
fn to_message(
    descriptor: &MessageDescriptor,
    value: &Value,
    path: &str,
) -> Result<DynamicMessage, CodecError> {
    let mut message = DynamicMessage::new(descriptor.clone());
    match descriptor.full_name() {
        QUANTITY => {
            let text = match value {
                Value::String(text) => text.clone(),
                Value::Number(number) => number.to_string(),
                _ => return Err(field_error(path, "a quantity must be a string or a number")),
            };
            set(&mut message, "string", Proto::String(text));
        }
        TIME | MICRO_TIME => {
            let text = value
                .as_str()
                .ok_or_else(|| field_error(path, "a time must be an RFC 3339 string"))?;
            let time: jiff::Timestamp = text
                .parse()
                .map_err(|err| field_error(path, format!("{text:?} is not an RFC 3339 time: {err}")))?;
            set(&mut message, "seconds", Proto::I64(time.as_second()));
            set(&mut message, "nanos", Proto::I32(time.subsec_nanosecond()));
        }
        DURATION => {
            let text = value.as_str().unwrap_or_default();
            let nanos = super::duration::parse(text)
                .ok_or_else(|| field_error(path, format!("{text:?} is not a duration")))?;
            set(&mut message, "duration", Proto::I64(nanos));
        }
        INT_OR_STRING => match value {
            Value::Number(number) => {
                let int = number
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| field_error(path, "an int-or-string number must fit 32 bits"))?;
                set(&mut message, "type", Proto::I64(0));
                set(&mut message, "intVal", Proto::I32(int));
            }
            Value::String(text) => {
                set(&mut message, "type", Proto::I64(1));
                set(&mut message, "strVal", Proto::String(text.clone()));
            }
            _ => return Err(field_error(path, "an int-or-string must be a number or a string")),
        },
        RAW_EXTENSION | FIELDS_V1 => {
            let raw = serde_json::to_vec(value).unwrap_or_default();
            set(&mut message, "raw", Proto::Bytes(raw.into()));
        }
        _ => {
            let Value::Object(fields) = value else {
                return Err(field_error(path, "expected an object"));
            };
            for (name, item) in fields {
                // Fields the message does not have (apiVersion, kind) have no place on the wire.
                let Some(field) = descriptor.get_field_by_name(name) else {
                    continue;
                };
                if item.is_null() {
                    continue;
                }
                let path = format!("{path}.{name}");
                let converted = field_value(&field, item, &path)?;
                message.set_field(&field, converted);
            }
            for field in descriptor.fields().filter(|f| f.name().starts_with(INLINE)) {
                if let Kind::Message(inner) = field.kind() {
                    let embedded = to_message(&inner, value, path)?;
                    if embedded.fields().next().is_some() {
                        message.set_field(&field, Proto::Message(embedded));
                    }
                }
            }
        }
    }
    Ok(message)
}

fn field_value(field: &FieldDescriptor, value: &Value, path: &str) -> Result<Proto, CodecError> {
    if field.is_map() {
        let Value::Object(entries) = value else {
            return Err(field_error(path, "expected an object"));
        };
        let Kind::Message(entry) = field.kind() else {
            return Err(field_error(path, "a map field without an entry message"));
        };
        let value_kind = entry.map_entry_value_field().kind();
        let mut map = std::collections::HashMap::new();
        for (key, item) in entries {
            if item.is_null() {
                continue;
            }
            let converted = single(&value_kind, item, &format!("{path}[{key}]"))?;
            map.insert(MapKey::String(key.clone()), converted);
        }
        return Ok(Proto::Map(map));
    }
    if field.is_list() {
        let Value::Array(items) = value else {
            return Err(field_error(path, "expected an array"));
        };
        let kind = field.kind();
        return items
            .iter()
            .enumerate()
            .map(|(index, item)| single(&kind, item, &format!("{path}[{index}]")))
            .collect::<Result<Vec<_>, _>>()
            .map(Proto::List);
    }
    single(&field.kind(), value, path)
}

fn single(kind: &Kind, value: &Value, path: &str) -> Result<Proto, CodecError> {
    let integer = |value: &Value| {
        value
            .as_i64()
            .ok_or_else(|| field_error(path, format!("expected an integer, got {}", type_name(value))))
    };
    Ok(match kind {
        Kind::Message(descriptor) => Proto::Message(to_message(descriptor, value, path)?),
        Kind::String => Proto::String(
            value
                .as_str()
                .ok_or_else(|| field_error(path, format!("expected a string, got {}", type_name(value))))?
                .to_owned(),
        ),
        Kind::Bytes => {
            let text = value
                .as_str()
                .ok_or_else(|| field_error(path, "expected a base64 string"))?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|_| field_error(path, "not valid base64"))?;
            Proto::Bytes(bytes.into())
        }
        Kind::Bool => Proto::Bool(
            value
                .as_bool()
                .ok_or_else(|| field_error(path, format!("expected a boolean, got {}", type_name(value))))?,
        ),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Proto::I32(
            i32::try_from(integer(value)?).map_err(|_| field_error(path, "out of the 32-bit range"))?,
        ),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Proto::I64(integer(value)?),
        Kind::Uint32 | Kind::Fixed32 => Proto::U32(
            u32::try_from(integer(value)?).map_err(|_| field_error(path, "out of the 32-bit range"))?,
        ),
        Kind::Uint64 | Kind::Fixed64 => Proto::U64(value.as_u64().ok_or_else(|| {
            field_error(
                path,
                format!("expected an unsigned integer, got {}", type_name(value)),
            )
        })?),
        Kind::Double | Kind::Float => {
            let number = value
                .as_f64()
                .ok_or_else(|| field_error(path, format!("expected a number, got {}", type_name(value))))?;
            if matches!(kind, Kind::Float) {
                #[allow(clippy::cast_possible_truncation)]
                Proto::F32(number as f32)
            } else {
                Proto::F64(number)
            }
        }
        Kind::Enum(_) => Proto::EnumNumber(i32::try_from(integer(value)?).unwrap_or_default()),
    })
}

/// The JSON type of a value, for errors: never the value itself, which may be a secret.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A message as JSON; None for what JSON leaves out (a zero Time).
fn to_json(message: &DynamicMessage) -> Option<Value> {
    let text = |name: &str| match message.get_field_by_name(name).as_deref() {
        Some(Proto::String(text)) => text.clone(),
        _ => String::new(),
    };
    let number = |name: &str| {
        message
            .has_field_by_name(name)
            .then(|| message.get_field_by_name(name))
            .flatten()
            .and_then(|v| v.as_i64().or_else(|| v.as_i32().map(i64::from)))
    };
    match message.descriptor().full_name() {
        QUANTITY => Some(Value::String(text("string"))),
        name @ (TIME | MICRO_TIME) => {
            let seconds = number("seconds");
            let nanos = number("nanos").unwrap_or_default();
            if seconds.is_none() && nanos == 0 {
                return None;
            }
            let time = jiff::Timestamp::new(
                seconds.unwrap_or_default(),
                i32::try_from(nanos).unwrap_or_default(),
            )
            .ok()?;
            let format = if name == TIME {
                "%Y-%m-%dT%H:%M:%SZ"
            } else {
                "%Y-%m-%dT%H:%M:%S%.6fZ"
            };
            Some(Value::String(time.strftime(format).to_string()))
        }
        DURATION => Some(Value::String(super::duration::format(
            number("duration").unwrap_or_default(),
        ))),
        INT_OR_STRING => Some(if number("type") == Some(1) {
            Value::String(text("strVal"))
        } else {
            Value::from(number("intVal").unwrap_or_default())
        }),
        RAW_EXTENSION | FIELDS_V1 => {
            let raw = match message.get_field_by_name("raw").as_deref() {
                Some(Proto::Bytes(raw)) => raw.clone(),
                _ => return None,
            };
            if raw.starts_with(MAGIC) {
                return decode(&raw).ok();
            }
            serde_json::from_slice(&raw).ok()
        }
        _ => {
            let mut object = Map::new();
            for field in message.descriptor().fields() {
                if !message.has_field(&field) {
                    continue;
                }
                let value = message.get_field(&field);
                match value_json(&value) {
                    Some(Value::Object(fields)) if field.name().starts_with(INLINE) => object.extend(fields),
                    Some(json) => {
                        object.insert(field.name().to_owned(), json);
                    }
                    None => {}
                }
            }
            Some(Value::Object(object))
        }
    }
}

/// A field's value as JSON; None for what Go's JSON leaves out (empty strings, lists and maps).
fn value_json(value: &Proto) -> Option<Value> {
    Some(match value {
        Proto::Bool(b) => Value::Bool(*b),
        Proto::I32(n) | Proto::EnumNumber(n) => Value::from(*n),
        Proto::I64(n) => Value::from(*n),
        Proto::U32(n) => Value::from(*n),
        Proto::U64(n) => Value::from(*n),
        Proto::F32(n) => Value::from(f64::from(*n)),
        Proto::F64(n) => Value::from(*n),
        Proto::String(text) if text.is_empty() => return None,
        Proto::String(text) => Value::String(text.clone()),
        Proto::Bytes(bytes) => Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
        Proto::Message(message) => to_json(message)?,
        Proto::List(items) if items.is_empty() => return None,
        Proto::List(items) => Value::Array(items.iter().filter_map(item_json).collect()),
        Proto::Map(entries) if entries.is_empty() => return None,
        Proto::Map(entries) => Value::Object(
            entries
                .iter()
                .filter_map(|(key, item)| match key {
                    MapKey::String(key) => Some((key.clone(), item_json(item)?)),
                    _ => None,
                })
                .collect(),
        ),
    })
}

/// An element of a list or a map value: kept even when empty (an empty string in a list is data).
fn item_json(value: &Proto) -> Option<Value> {
    match value {
        Proto::String(text) => Some(Value::String(text.clone())),
        other => value_json(other).or(Some(Value::Null)),
    }
}
