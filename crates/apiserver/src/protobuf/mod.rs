//! `application/vnd.kubernetes.protobuf`: request bodies and responses of the built-in kinds in the Kubernetes
//! protobuf encoding, which kubectl (`create secret`, `create namespace`, `certificate approve`) and Go clients send.
//!
//! Content negotiation and body checks live here; the encoding itself is [`codec`]. Custom resources (CRDs and the
//! machine kinds) stay JSON-only, as on kube-apiserver: a protobuf body there is 415, a protobuf-only Accept 406.
//! Status errors follow the Accept header for every resource.

pub mod codec;
pub mod duration;

use std::borrow::Cow;

use axum::body::Body;
use http::{HeaderMap, HeaderValue, Response, header};

use crate::{
    error::ApiError,
    registry::ResourceDef,
    rest::{self, Format},
};

/// The media type of the Kubernetes protobuf encoding.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The media type of a protobuf watch stream (length-prefixed `WatchEvent`s).
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// True when this resource's objects have a protobuf encoding: the built-in kinds, not custom resources.
pub fn serves(def: &ResourceDef) -> bool {
    !def.custom && !crate::crd::is_crd(def) && codec::has_message(&def.api_version(), &def.kind)
}

/// True when the first media range of Accept that we can answer is protobuf (`application/json` or `*/*` before it
/// wins, as does a range converting to another representation such as `as=Table`).
pub fn prefers(headers: &HeaderMap) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let base = parts.next().unwrap_or_default().to_ascii_lowercase();
        if parts.any(|p| p.starts_with("as=")) {
            continue;
        }
        match base.as_str() {
            MEDIA_TYPE => return true,
            "application/json" | "application/yaml" | "application/*" | "*/*" => return false,
            _ => {}
        }
    }
    false
}

/// [`rest::negotiate`] with protobuf: chosen when Accept lists it first and `allowed` (the resource has an
/// encoding, the verb answers with an object).
pub fn negotiate(headers: &HeaderMap, table_allowed: bool, allowed: bool) -> Result<Format, ApiError> {
    if allowed && prefers(headers) {
        return Ok(Format::Protobuf);
    }
    rest::negotiate(headers, table_allowed)
}

/// True when the request body is protobuf.
pub fn is_protobuf_body(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|text| text.split(';').next())
        .is_some_and(|base| base.trim().eq_ignore_ascii_case(MEDIA_TYPE))
}

/// 415 for a protobuf body sent to a resource without a protobuf encoding (custom resources).
pub fn check_body(def: &ResourceDef, headers: &HeaderMap) -> Result<(), ApiError> {
    if is_protobuf_body(headers) && !serves(def) {
        return Err(ApiError::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format ({MEDIA_TYPE}) - accepted media types include: {}",
            crate::options::BODY_MEDIA_TYPES
        )));
    }
    Ok(())
}

/// Decodes a protobuf request body into its JSON object; 400 naming what is wrong.
pub fn decode_body(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    codec::decode(body).map_err(|err| ApiError::BadRequest(format!("error decoding the request body: {err}")))
}

/// A body as JSON bytes: protobuf ones (a DeleteOptions) converted, the rest as they came.
pub fn json_body<'a>(headers: &HeaderMap, body: &'a [u8]) -> Result<Cow<'a, [u8]>, ApiError> {
    if !is_protobuf_body(headers) || body.is_empty() {
        return Ok(Cow::Borrowed(body));
    }
    Ok(Cow::Owned(
        serde_json::to_vec(&decode_body(body)?).unwrap_or_default(),
    ))
}

/// The protobuf body of a JSON object; 500 when it has no encoding (a defect: callers check [`serves`]).
pub fn encode(value: &serde_json::Value) -> Result<Vec<u8>, ApiError> {
    codec::encode(value)
        .map_err(|err| ApiError::Internal(format!("cannot encode the answer as protobuf: {err}")))
}

/// One frame of a protobuf watch stream: the event's length (4 bytes, big-endian) and the event. An object that
/// cannot be encoded (a defect) becomes an `ERROR` event with a 500 Status, so the watcher learns of it.
pub fn watch_frame(event_type: &str, object: &serde_json::Value) -> bytes::Bytes {
    let event = codec::encode_watch_event(event_type, object).or_else(|err| {
        tracing::warn!(error = %err, event_type, "cannot encode a watch event as protobuf");
        let status =
            ApiError::Internal(format!("cannot encode the watch event as protobuf: {err}")).to_status();
        codec::encode_watch_event("ERROR", &status)
    });
    let event = event.unwrap_or_default();
    let mut frame = Vec::with_capacity(event.len() + 4);
    frame.extend_from_slice(&u32::try_from(event.len()).unwrap_or(u32::MAX).to_be_bytes());
    frame.extend_from_slice(&event);
    bytes::Bytes::from(frame)
}

/// The Status response of an error, in protobuf when Accept asks for it first (for any resource, as
/// kube-apiserver encodes its Status answers).
pub fn error_response(headers: &HeaderMap, err: &ApiError) -> Response<Body> {
    let mut response = rest::error_response(err);
    if prefers(headers)
        && let Ok(body) = codec::encode(&err.to_status())
    {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(MEDIA_TYPE));
        *response.body_mut() = Body::from(body);
    }
    response
}

#[cfg(test)]
mod tests;
