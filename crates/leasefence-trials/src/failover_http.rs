//! The failover trials speak the coordinators' HTTP/JSON edge: acquire,
//! release, status and `/healthz`, with every answer sorted into what a
//! client does next — a grant, a leader hint to follow, or try another.

use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

/// What an acquire (or a status) was answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200 with a token.
    Granted { token: u64, lease_id: String },
    /// 503 `not_leader`: the active coordinator's URL, when it knows one.
    NotLeader { leader: Option<String> },
    /// 503 `unavailable` (its engine cannot be reached, or its leadership is
    /// no longer confirmed) or `outcome_unknown` (it lost its engine while
    /// writing): either way, try another coordinator.
    Unavailable,
    /// Any other answer that refuses (busy, …): the status code.
    Refused(u16),
    /// No answer: refused connection, timeout, a body that is not JSON.
    Unanswered,
}

/// Sorts a status code and body into an [`Answer`].
pub fn classify(code: u16, body: &Value) -> Answer {
    match (code, body["error"].as_str()) {
        (200, _) => match (body["token"].as_u64(), body["lease_id"].as_str()) {
            (Some(token), Some(id)) => Answer::Granted {
                token,
                lease_id: id.to_string(),
            },
            _ => Answer::Unanswered,
        },
        (503, Some("not_leader")) => Answer::NotLeader {
            leader: body["leader"].as_str().map(str::to_string),
        },
        (503, Some("unavailable" | "outcome_unknown")) => Answer::Unavailable,
        (code, _) => Answer::Refused(code),
    }
}

/// One HTTP client with one per-request time limit.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
}

impl Http {
    pub fn new(limit: Duration) -> anyhow::Result<Http> {
        let client = reqwest::Client::builder()
            .timeout(limit)
            .build()
            .context("cannot build an HTTP client")?;
        Ok(Http { client })
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Option<(u16, Value)> {
        let r = req.send().await.ok()?;
        let code = r.status().as_u16();
        Some((code, r.json().await.ok()?))
    }

    pub async fn acquire(&self, url: &str, resource: &str, ttl: Duration, wait: Duration) -> Answer {
        let body = json!({
            "resource": resource,
            "ttl_ms": ttl.as_millis() as u64,
            "wait_ms": wait.as_millis() as u64,
        });
        let req = self.client.post(format!("{url}/v1/acquire")).json(&body);
        match self.send(req).await {
            Some((code, v)) => classify(code, &v),
            None => Answer::Unanswered,
        }
    }

    /// Best effort: whether it released does not matter to the checks.
    pub async fn release(&self, url: &str, resource: &str, lease_id: &str) {
        let body = json!({ "resource": resource, "lease_id": lease_id });
        let _ = self
            .send(self.client.post(format!("{url}/v1/release")).json(&body))
            .await;
    }

    /// `last_token` of `resource` (`Ok(0)` when never granted), or the
    /// answer that refused.
    pub async fn last_token(&self, url: &str, resource: &str) -> Result<u64, Answer> {
        let Ok(mut status) = reqwest::Url::parse(&format!("{url}/v1/status")) else {
            return Err(Answer::Unanswered);
        };
        status.query_pairs_mut().append_pair("resource", resource);
        match self.send(self.client.get(status)).await {
            Some((200, v)) if v["last_token"].is_null() => Ok(0),
            Some((200, v)) => v["last_token"].as_u64().ok_or(Answer::Unanswered),
            Some((code, v)) => Err(classify(code, &v)),
            None => Err(Answer::Unanswered),
        }
    }

    /// The body of `/healthz` when it answers 200.
    pub async fn health(&self, url: &str) -> Option<String> {
        let r = self.client.get(format!("{url}/healthz")).send().await.ok()?;
        if r.status().as_u16() != 200 {
            return None;
        }
        r.text().await.ok()
    }
}

/// The epoch in `ok: active, epoch E`, the health of the active coordinator.
pub fn active_epoch(health: &str) -> Option<u64> {
    health.trim().strip_prefix("ok: active, epoch ")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_sorted_by_code_and_error() {
        let granted = json!({"token": 7, "lease_id": "x"});
        assert_eq!(
            classify(200, &granted),
            Answer::Granted {
                token: 7,
                lease_id: "x".into()
            }
        );
        let hint = json!({"error": "not_leader", "leader": "http://127.0.0.1:1"});
        assert_eq!(
            classify(503, &hint),
            Answer::NotLeader {
                leader: Some("http://127.0.0.1:1".into())
            }
        );
        let none = json!({"error": "not_leader", "leader": null});
        assert_eq!(classify(503, &none), Answer::NotLeader { leader: None });
        assert_eq!(classify(503, &json!({"error": "unavailable"})), Answer::Unavailable);
        assert_eq!(classify(503, &json!({"error": "outcome_unknown"})), Answer::Unavailable);
        assert_eq!(classify(409, &json!({"error": "busy"})), Answer::Refused(409));
        assert_eq!(classify(200, &json!({})), Answer::Unanswered);
    }

    #[test]
    fn the_epoch_is_read_from_an_active_health_line() {
        assert_eq!(active_epoch("ok: active, epoch 12\n"), Some(12));
        assert_eq!(active_epoch("ok: standby, the active coordinator is http://x"), None);
        assert_eq!(active_epoch("ok"), None);
    }
}
