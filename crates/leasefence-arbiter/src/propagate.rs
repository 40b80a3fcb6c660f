//! Carrying a [`Fence`] through every hop to the final writer, in the one
//! convention of `leasefence-core`: the resource and the decimal token under
//! [`HEADER_RESOURCE`] / [`HEADER_TOKEN`] (HTTP headers, gRPC metadata, message
//! headers) or [`ENV_RESOURCE`] / [`ENV_TOKEN`] (a child process's environment).
//! A signed fence also carries the coordinator's signature, under
//! [`HEADER_SIGNATURE`] / [`ENV_SIGNATURE`]: set when the fence has one,
//! read when present (an arbiter that holds a key checks it; see
//! `leasefence_core::signing`).
//!
//! Extraction is strict: neither part present is `Ok(None)` (the request is
//! not fenced); exactly one present, a repeated header, or a value that is not
//! valid UTF-8, not a valid resource or not a token is an [`Invalid`] naming
//! the header or variable, so a half-propagated fence is never mistaken for
//! "no fence". A signature without the resource and token is such a half
//! fence too; its content is not checked here (only an arbiter with the key
//! can tell a good one), but it must be one valid, printable value.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use leasefence_core::{
    ENV_RESOURCE, ENV_SIGNATURE, ENV_TOKEN, Fence, HEADER_RESOURCE, HEADER_SIGNATURE, HEADER_TOKEN, Invalid,
};

/// Sets (replacing any previous values) the fence headers on `headers`: the
/// resource, the token, and the signature when the fence has one (else any
/// old signature header is removed: it would belong to another fence).
/// A non-ASCII resource travels as its UTF-8 bytes (HTTP `obs-text`). Fails
/// only on bytes a header value cannot hold (controls), which a `ResourceId`
/// already excludes.
pub fn fence_to_headers(fence: &Fence, headers: &mut HeaderMap) -> Result<(), Invalid> {
    let resource = HeaderValue::from_bytes(fence.resource.as_str().as_bytes())
        .map_err(|e| Invalid::new("resource", format!("cannot be an HTTP header value: {e}")))?;
    headers.insert(HeaderName::from_static(HEADER_RESOURCE), resource);
    headers.insert(
        HeaderName::from_static(HEADER_TOKEN),
        HeaderValue::from(fence.token.get()),
    );
    match &fence.signature {
        Some(signature) => {
            let value = HeaderValue::from_str(signature)
                .map_err(|e| Invalid::new("signature", format!("cannot be an HTTP header value: {e}")))?;
            headers.insert(HeaderName::from_static(HEADER_SIGNATURE), value);
        }
        None => {
            headers.remove(HEADER_SIGNATURE);
        }
    }
    Ok(())
}

/// The fence carried by `headers`, `None` when neither header is present.
pub fn fence_from_headers(headers: &HeaderMap) -> Result<Option<Fence>, Invalid> {
    let one = |name: &'static str| -> Result<Option<&str>, Invalid> {
        let mut values = headers.get_all(name).iter();
        let Some(first) = values.next() else { return Ok(None) };
        if values.next().is_some() {
            return Err(Invalid::new("header", format!("{name} appears more than once")));
        }
        std::str::from_utf8(first.as_bytes())
            .map(Some)
            .map_err(|_| Invalid::new("header", format!("{name} is not valid UTF-8")))
    };
    let fence = combine(one(HEADER_RESOURCE)?, one(HEADER_TOKEN)?, HEADER_RESOURCE, HEADER_TOKEN)?;
    sign(fence, one(HEADER_SIGNATURE)?, HEADER_SIGNATURE)
}

/// The fence headers as `(name, value)` pairs, for message headers (NATS,
/// RabbitMQ, Kafka-style) or gRPC metadata: resource, token, and the
/// signature when the fence has one.
pub fn fence_to_pairs(fence: &Fence) -> Vec<(&'static str, String)> {
    let mut pairs = vec![
        (HEADER_RESOURCE, fence.resource.to_string()),
        (HEADER_TOKEN, fence.token.to_string()),
    ];
    if let Some(signature) = &fence.signature {
        pairs.push((HEADER_SIGNATURE, signature.clone()));
    }
    pairs
}

/// The fence in generic `(name, value)` message headers, `None` when neither
/// header is present. Names match case-insensitively (HTTP/2 and gRPC
/// lower-case them, some brokers keep the sender's case); a repeated name is
/// an error.
pub fn fence_from_pairs<I, K, V>(pairs: I) -> Result<Option<Fence>, Invalid>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let (mut resource, mut token, mut signature): (Option<String>, Option<String>, Option<String>) = (None, None, None);
    for (k, v) in pairs {
        let slot = match k.as_ref() {
            k if k.eq_ignore_ascii_case(HEADER_RESOURCE) => (&mut resource, HEADER_RESOURCE),
            k if k.eq_ignore_ascii_case(HEADER_TOKEN) => (&mut token, HEADER_TOKEN),
            k if k.eq_ignore_ascii_case(HEADER_SIGNATURE) => (&mut signature, HEADER_SIGNATURE),
            _ => continue,
        };
        if slot.0.replace(v.as_ref().to_string()).is_some() {
            return Err(Invalid::new("header", format!("{} appears more than once", slot.1)));
        }
    }
    let fence = combine(resource.as_deref(), token.as_deref(), HEADER_RESOURCE, HEADER_TOKEN)?;
    sign(fence, signature.as_deref(), HEADER_SIGNATURE)
}

/// The environment a child process needs to carry `fence`: pass it to
/// `std::process::Command::envs`. Holds the signature when the fence has one.
pub fn fence_to_env(fence: &Fence) -> Vec<(&'static str, String)> {
    let mut env = vec![
        (ENV_RESOURCE, fence.resource.to_string()),
        (ENV_TOKEN, fence.token.to_string()),
    ];
    if let Some(signature) = &fence.signature {
        env.push((ENV_SIGNATURE, signature.clone()));
    }
    env
}

/// The fence in this process's environment, `None` when neither variable is set.
pub fn fence_from_env() -> Result<Option<Fence>, Invalid> {
    fence_from_env_with(|name| std::env::var_os(name).map(|v| v.into_string()))
}

/// [`fence_from_env`] with the lookup injected (for tests and for callers
/// holding an environment map). The lookup returns `None` for an unset
/// variable and `Some(Err(raw))` for one that is not valid UTF-8.
pub fn fence_from_env_with<F, R>(lookup: F) -> Result<Option<Fence>, Invalid>
where
    F: Fn(&str) -> Option<Result<String, R>>,
{
    let get = |name: &'static str| -> Result<Option<String>, Invalid> {
        lookup(name)
            .transpose()
            .map_err(|_| Invalid::new("env", format!("{name} is not valid UTF-8")))
    };
    let (resource, token) = (get(ENV_RESOURCE)?, get(ENV_TOKEN)?);
    let fence = combine(resource.as_deref(), token.as_deref(), ENV_RESOURCE, ENV_TOKEN)?;
    sign(fence, get(ENV_SIGNATURE)?.as_deref(), ENV_SIGNATURE)
}

/// Longest signature accepted in transit (a `v1` one is at most 100 bytes).
const SIGNATURE_LEN_MAX: usize = 256;

/// `fence` with `signature` attached; a signature without a fence, or one
/// that is too long or holds anything but printable ASCII, is an error
/// naming `name`. An empty one is passed on: an arbiter with a key refuses
/// it as malformed, one without ignores it, as any other.
fn sign(fence: Option<Fence>, signature: Option<&str>, name: &str) -> Result<Option<Fence>, Invalid> {
    match (fence, signature) {
        (fence, None) => Ok(fence),
        (None, Some(_)) => Err(Invalid::new(
            "fence",
            format!("{name} is set but the resource and token are missing: a signature belongs to a fence"),
        )),
        (Some(fence), Some(s)) => {
            if s.len() > SIGNATURE_LEN_MAX || !s.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Invalid::new(
                    "signature",
                    format!(
                        "{name} must be at most {SIGNATURE_LEN_MAX} printable ASCII characters (`v1.<key id>.<hex>`)"
                    ),
                ));
            }
            Ok(Some(fence.with_signature(s)))
        }
    }
}

/// Both or neither; one alone is a half-propagated fence.
fn combine(resource: Option<&str>, token: Option<&str>, r_name: &str, t_name: &str) -> Result<Option<Fence>, Invalid> {
    match (resource, token) {
        (None, None) => Ok(None),
        (Some(r), Some(t)) => Fence::from_parts(r, t)
            .map(Some)
            .map_err(|e| Invalid::new(e.field(), format!("{r_name}/{t_name}: {}", e.message()))),
        (Some(_), None) => Err(missing(t_name, r_name)),
        (None, Some(_)) => Err(missing(r_name, t_name)),
    }
}

fn missing(absent: &str, present: &str) -> Invalid {
    Invalid::new(
        "fence",
        format!("{present} is set but {absent} is missing: a fence needs both"),
    )
}

#[cfg(test)]
#[path = "propagate_tests.rs"]
mod tests;
