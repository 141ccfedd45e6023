//! Limits on the request head (the request line and the header fields), answered with a Status body.
//!
//! kube-apiserver's Go HTTP server refuses a head over `MaxHeaderBytes` (1 MiB by default) with a bare-text 431
//! before any handler runs, and has no separate limit on the request line. hyper, which serves this API server,
//! refuses a request target over 65,534 bytes (414) and a head over its read buffer (about 400 KiB, 431), both with
//! an empty body. So that a client gets a `Status` saying which limit it hit, the limits here are lower than
//! hyper's and checked first: [`MAX_URI_BYTES`] for the request target, [`MAX_HEADER_BYTES`] for the header fields.

use http::request::Parts;

use crate::error::ApiError;

/// The longest request target (path and query) answered: longer ones get a 414 Status. Below hyper's own 65,534.
pub const MAX_URI_BYTES: usize = 32 * 1024;
/// The largest header section (each field counted as `name: value` and its line end) answered: larger ones get a
/// 431 Status. Below hyper's read buffer.
pub const MAX_HEADER_BYTES: usize = 256 * 1024;

/// 414 or 431 when the request head is over a limit.
pub fn check_head(parts: &Parts) -> Result<(), ApiError> {
    let uri = parts.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if uri > MAX_URI_BYTES {
        return Err(ApiError::UriTooLong(format!(
            "the request URI is {uri} bytes long, more than the limit of {MAX_URI_BYTES} bytes"
        )));
    }
    let headers: usize = parts
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers > MAX_HEADER_BYTES {
        return Err(ApiError::HeadersTooLarge(format!(
            "the request header fields are {headers} bytes, more than the limit of {MAX_HEADER_BYTES} bytes"
        )));
    }
    Ok(())
}
