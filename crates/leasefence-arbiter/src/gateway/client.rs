//! The client side of the gateway's API, for the command line and the
//! conformance target: a fenced PUT, and the pieces every caller needs
//! (percent-encoded keys, the 409 body as a typed [`Stale`], transport
//! errors with their causes).

use leasefence_core::signing::SignatureError;
use leasefence_core::{Fence, FenceMode, HEADER_RESOURCE, HEADER_SIGNATURE, HEADER_TOKEN, ResourceId, Stale, Token};
use reqwest::StatusCode;
use serde_json::Value;

use super::HEADER_MODE;
use crate::ArbiterError;

pub(crate) fn gw(msg: impl Into<String>) -> ArbiterError {
    ArbiterError::Gateway(msg.into())
}

/// A reqwest error with its causes ("error sending request" alone says little).
pub(crate) fn transport(url: &str, e: reqwest::Error) -> ArbiterError {
    let mut msg = format!("{url}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    gw(msg)
}

/// Percent-encodes a key for a path or a query value, keeping `/` and the
/// unreserved characters.
pub fn encode_path(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The typed rejection in a 409's JSON.
pub(crate) fn stale_from(url: &str, body: Value) -> Result<Stale, ArbiterError> {
    let resource = body["resource"].as_str().and_then(|r| ResourceId::new(r).ok());
    let presented = body["presented"].as_u64().and_then(Token::new);
    let current = body["current"].as_u64().and_then(Token::new);
    match (body["error"].as_str(), resource, presented, current) {
        (Some("stale"), Some(resource), Some(presented), Some(current)) => Ok(Stale {
            resource,
            presented,
            current,
        }),
        _ => Err(gw(format!("{url}: 409 without a stale rejection: {body}"))),
    }
}

/// The typed refusal in a 403's JSON (`bad_signature`).
pub(crate) fn bad_signature_from(url: &str, body: Value) -> ArbiterError {
    let resource = body["resource"].as_str().and_then(|r| ResourceId::new(r).ok());
    let key = body["key"].as_str().unwrap_or_default();
    let reason = body["reason"]
        .as_str()
        .and_then(|r| SignatureError::from_reason(r, key));
    match (body["error"].as_str(), resource, reason) {
        (Some("bad_signature"), Some(resource), Some(reason)) => ArbiterError::BadSignature { resource, reason },
        _ => gw(format!("{url}: 403 without a signature refusal: {body}")),
    }
}

/// `PUT {base}/objects/{key}` of `body` under `fence`; returns the new ETag.
/// A stale fence is [`ArbiterError::Stale`], a refused signature
/// [`ArbiterError::BadSignature`]; any other refusal an
/// [`ArbiterError::Gateway`] with the gateway's message.
pub async fn put(base: &str, fence: &Fence, mode: FenceMode, key: &str, body: Vec<u8>) -> Result<String, ArbiterError> {
    let url = format!("{}/objects/{}", base.trim_end_matches('/'), encode_path(key));
    let mut req = reqwest::Client::new()
        .put(&url)
        .header(HEADER_RESOURCE, fence.resource.as_str())
        .header(HEADER_TOKEN, fence.token.get())
        .header(HEADER_MODE, mode.as_str());
    if let Some(signature) = &fence.signature {
        req = req.header(HEADER_SIGNATURE, signature);
    }
    let resp = req.body(body).send().await.map_err(|e| transport(&url, e))?;
    match resp.status() {
        StatusCode::OK | StatusCode::CREATED => {
            let etag = resp.headers().get("etag").and_then(|v| v.to_str().ok());
            Ok(etag.unwrap_or_default().to_string())
        }
        StatusCode::CONFLICT => Err(stale_from(&url, resp.json().await.unwrap_or(Value::Null))?.into()),
        StatusCode::FORBIDDEN => Err(bad_signature_from(&url, resp.json().await.unwrap_or(Value::Null))),
        other => {
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            let msg = body["message"]
                .as_str()
                .map_or_else(|| body.to_string(), str::to_string);
            Err(gw(format!("PUT {url}: {other}: {msg}")))
        }
    }
}
