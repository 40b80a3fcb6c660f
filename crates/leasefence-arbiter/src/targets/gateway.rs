//! The gateway conformance target: a running `leasefence gateway`, spoken to
//! over HTTP (reqwest). The effect model of a resource is one object, named
//! by the resource and fenced by it, holding `{"kv": {…}, "history": […]}`:
//! a unit reads it, changes it, and writes it back with the fence and
//! `If-Match` (or `If-None-Match: *`), re-reading on 412 as any
//! read-modify-write client of an object store does. The fence decides
//! first, so a stale unit is a 409 whatever the object looks like.
//!
//! [`Outcome::Abort`] sends half a body and then breaks the stream: the
//! gateway must commit neither the object nor the fence. `cleanup` deletes
//! the objects under the namespace (fenced, with each resource's current
//! token, signed with [`GatewayTarget::with_signer`]'s key when the gateway
//! requires signatures); the fences stay, because the gateway never forgets
//! a fence over HTTP.

use futures_util::stream;
use leasefence_core::signing::FenceKey;
use leasefence_core::{Fence, FenceMode, HEADER_RESOURCE, HEADER_SIGNATURE, HEADER_TOKEN, ResourceId, Token};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::ArbiterError;
use crate::conformance::{ConformanceTarget, Outcome};
use crate::gateway::client::{bad_signature_from, encode_path, gw, stale_from, transport};
use crate::gateway::{HEADER_MODE, LIST_LIMIT_MAX, SERVICE};

/// Rounds of read-modify-write a unit tries before giving up on 412s.
const ATTEMPTS_MAX: u32 = 10_000;

pub struct GatewayTarget {
    http: reqwest::Client,
    base: String,
    namespace: String,
    /// Signs the fences of `cleanup`'s deletes.
    signer: Option<FenceKey>,
}

impl GatewayTarget {
    /// Connects to the gateway at `url` (`http://HOST:PORT`) and checks it is one.
    pub async fn connect(url: &str) -> Result<GatewayTarget, ArbiterError> {
        let base = url.trim_end_matches('/').to_string();
        let http = reqwest::Client::builder()
            .timeout(crate::pause_kit::STEP_TIMEOUT)
            // Well within the gateway's deadline for the next request head,
            // after which it closes an idle connection: a pooled connection
            // is dropped here first, so no request crosses that close.
            .pool_idle_timeout(crate::gateway::HEADER_READ_TIMEOUT / 2)
            .build()
            .map_err(|e| transport(&base, e))?;
        let target = GatewayTarget {
            http,
            base,
            namespace: super::fresh_namespace(),
            signer: None,
        };
        target.check_service().await?;
        Ok(target)
    }

    /// Signs the deletes of `cleanup` with `key` (for a gateway started
    /// with fence keys; the units send the fences they are given as they are).
    pub fn with_signer(mut self, key: FenceKey) -> GatewayTarget {
        self.signer = Some(key);
        self
    }

    /// `GET /` must name the gateway service; returns its version.
    pub async fn check_service(&self) -> Result<String, ArbiterError> {
        let url = format!("{}/", self.base);
        let resp = self.http.get(&url).send().await.map_err(|e| transport(&url, e))?;
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if body["service"] != SERVICE {
            return Err(gw(format!("{url} is not a leasefence gateway: it answered {body}")));
        }
        Ok(body["version"].as_str().unwrap_or("unknown").to_string())
    }

    fn object_url(&self, key: &str) -> String {
        format!("{}/objects/{}", self.base, encode_path(key))
    }

    /// The model object of `resource` and its ETag, or an empty model.
    async fn state(&self, resource: &ResourceId) -> Result<(Option<String>, Value), ArbiterError> {
        let url = self.object_url(resource.as_str());
        let resp = self.http.get(&url).send().await.map_err(|e| transport(&url, e))?;
        match resp.status() {
            StatusCode::NOT_FOUND => Ok((None, json!({"kv": {}, "history": []}))),
            StatusCode::OK => {
                let etag = resp
                    .headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let body = resp.bytes().await.map_err(|e| transport(&url, e))?;
                let state = serde_json::from_slice(&body).map_err(|e| gw(format!("{url}: not a model object: {e}")))?;
                Ok((etag, state))
            }
            other => Err(gw(format!("GET {url}: {other}"))),
        }
    }

    /// One write of the model; `Ok(false)` when a precondition failed.
    async fn put_state(
        &self,
        fence: &Fence,
        mode: FenceMode,
        etag: Option<&str>,
        state: &Value,
        outcome: Outcome,
    ) -> Result<bool, ArbiterError> {
        let url = self.object_url(fence.resource.as_str());
        let bytes = serde_json::to_vec(state).map_err(|e| gw(format!("cannot encode the model: {e}")))?;
        let mut req = self
            .http
            .put(&url)
            .header(HEADER_RESOURCE, fence.resource.as_str())
            .header(HEADER_TOKEN, fence.token.get())
            .header(HEADER_MODE, mode.as_str());
        if let Some(signature) = &fence.signature {
            req = req.header(HEADER_SIGNATURE, signature);
        }
        req = match etag {
            Some(e) => req.header("if-match", e),
            None => req.header("if-none-match", "*"),
        };
        if outcome == Outcome::Abort {
            let half = bytes::Bytes::from(bytes[..bytes.len() / 2].to_vec());
            let broken: Vec<Result<bytes::Bytes, std::io::Error>> =
                vec![Ok(half), Err(std::io::Error::other("the writer abandons its unit"))];
            return match req.body(reqwest::Body::wrap_stream(stream::iter(broken))).send().await {
                Ok(resp) if resp.status().is_success() => Err(gw(format!(
                    "PUT {url}: a broken body was committed ({})",
                    resp.status()
                ))),
                _ => Ok(true),
            };
        }
        let resp = req.body(bytes).send().await.map_err(|e| transport(&url, e))?;
        match resp.status() {
            StatusCode::OK | StatusCode::CREATED => Ok(true),
            StatusCode::PRECONDITION_FAILED => Ok(false),
            StatusCode::CONFLICT => Err(stale_from(&url, resp.json().await.unwrap_or(Value::Null))?.into()),
            StatusCode::FORBIDDEN => Err(bad_signature_from(&url, resp.json().await.unwrap_or(Value::Null))),
            other => {
                let body = resp.text().await.unwrap_or_default();
                Err(gw(format!("PUT {url}: {other}: {body}")))
            }
        }
    }

    async fn last_fence(&self, resource: &str) -> Result<Option<Token>, ArbiterError> {
        let url = format!("{}/fences/{}", self.base, encode_path(resource));
        let resp = self.http.get(&url).send().await.map_err(|e| transport(&url, e))?;
        match resp.status() {
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::OK => {
                let body: Value = resp.json().await.map_err(|e| transport(&url, e))?;
                let t = body["token"].as_u64().and_then(Token::new);
                t.map(Some).ok_or_else(|| gw(format!("GET {url}: no token in {body}")))
            }
            other => Err(gw(format!("GET {url}: {other}"))),
        }
    }
}

impl ConformanceTarget for GatewayTarget {
    fn backend(&self) -> &'static str {
        "gateway"
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn admit_and_write(
        &self,
        fence: &Fence,
        mode: FenceMode,
        key: &str,
        value: &str,
        outcome: Outcome,
    ) -> Result<(), ArbiterError> {
        for _ in 0..ATTEMPTS_MAX {
            let (etag, mut state) = self.state(&fence.resource).await?;
            state["kv"][key] = json!(value);
            match state["history"].as_array_mut() {
                Some(h) => h.push(json!(fence.token.get())),
                None => return Err(gw(format!("the model of {} has no history", fence.resource))),
            }
            if self.put_state(fence, mode, etag.as_deref(), &state, outcome).await? {
                return Ok(());
            }
        }
        Err(gw(format!(
            "{}: {ATTEMPTS_MAX} writes in a row lost their If-Match race",
            fence.resource
        )))
    }

    async fn read(&self, resource: &ResourceId, key: &str) -> Result<Option<String>, ArbiterError> {
        let (_, state) = self.state(resource).await?;
        Ok(state["kv"][key].as_str().map(str::to_string))
    }

    async fn last_token(&self, resource: &ResourceId) -> Result<Option<Token>, ArbiterError> {
        self.last_fence(resource.as_str()).await
    }

    async fn history(&self, resource: &ResourceId) -> Result<Vec<Token>, ArbiterError> {
        let (_, state) = self.state(resource).await?;
        let tokens = state["history"].as_array().cloned().unwrap_or_default();
        tokens
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(Token::new)
                    .ok_or_else(|| gw(format!("history holds {t}")))
            })
            .collect()
    }

    async fn cleanup(&self) -> Result<(), ArbiterError> {
        loop {
            let ns = encode_path(&self.namespace);
            let url = format!("{}/objects?prefix={ns}&limit={LIST_LIMIT_MAX}", self.base);
            let resp = self.http.get(&url).send().await.map_err(|e| transport(&url, e))?;
            let page: Value = resp.json().await.map_err(|e| transport(&url, e))?;
            let objects = page["objects"].as_array().cloned().unwrap_or_default();
            if objects.is_empty() {
                return Ok(());
            }
            for o in &objects {
                let (Some(key), Some(resource)) = (o["key"].as_str(), o["resource"].as_str()) else {
                    return Err(gw(format!("a listing entry without key or resource: {o}")));
                };
                let token = self
                    .last_fence(resource)
                    .await?
                    .ok_or_else(|| gw(format!("{resource}: no fence")))?;
                let url = self.object_url(key);
                let mut req = self
                    .http
                    .delete(&url)
                    .header(HEADER_RESOURCE, resource)
                    .header(HEADER_TOKEN, token.get())
                    .header(HEADER_MODE, FenceMode::Monotonic.as_str());
                if let Some(signer) = &self.signer {
                    let resource = ResourceId::new(resource).map_err(ArbiterError::from)?;
                    req = req.header(HEADER_SIGNATURE, signer.sign(&Fence::new(resource, token)));
                }
                let resp = req.send().await.map_err(|e| transport(&url, e))?;
                if !resp.status().is_success() && resp.status() != StatusCode::NOT_FOUND {
                    return Err(gw(format!("DELETE {url}: {}", resp.status())));
                }
            }
        }
    }
}
