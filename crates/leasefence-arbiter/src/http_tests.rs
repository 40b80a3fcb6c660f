//! The HTTP answers without sockets: bodies, status codes, and the client's
//! decode of a stale answer. `tests/http.rs` runs them over real sockets.

use axum::body::to_bytes;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::client::stale_from_json;
use super::*;
use leasefence_core::{ResourceId, Token};

fn stale(resource: &str, presented: u64, current: u64) -> Stale {
    Stale {
        resource: ResourceId::new(resource).expect("resource"),
        presented: Token::new(presented).expect("token"),
        current: Token::new(current).expect("token"),
    }
}

async fn answer(r: impl IntoResponse) -> (StatusCode, Value) {
    let r = r.into_response();
    let status = r.status();
    let body = to_bytes(r.into_body(), 1 << 16).await.expect("body");
    (status, serde_json::from_slice(&body).expect("JSON body"))
}

#[tokio::test]
async fn stale_is_409_with_exact_tokens_and_decodes_back() {
    let s = stale("tenant/7 orders/ß", u64::MAX - 1, u64::MAX);
    let (status, body) = answer(StaleResponse(s.clone())).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "stale");
    assert_eq!(body["resource"], "tenant/7 orders/ß");
    assert_eq!(body["presented"].as_u64(), Some(u64::MAX - 1));
    assert_eq!(body["current"].as_u64(), Some(u64::MAX));
    let bytes = serde_json::to_vec(&body).expect("encode");
    assert_eq!(stale_from_json(&bytes), Some(s.clone()));
    let (status, through) = answer(ArbiterResponse::from(ArbiterError::Stale(s))).await;
    assert_eq!((status, &through), (StatusCode::CONFLICT, &body));
}

#[test]
fn only_a_stale_body_decodes_as_stale() {
    let ok = json!({"error": "stale", "resource": "r", "presented": 4, "current": 5});
    assert_eq!(stale_from_json(ok.to_string().as_bytes()), Some(stale("r", 4, 5)));
    let not_stale = [
        json!({"error": "busy", "resource": "r", "presented": 4, "current": 5}),
        json!({"error": "stale", "resource": "r", "presented": 0, "current": 5}),
        json!({"error": "stale", "resource": "r", "presented": -4, "current": 5}),
        json!({"error": "stale", "resource": "r", "presented": "4", "current": 5}),
        json!({"error": "stale", "resource": "", "presented": 4, "current": 5}),
        json!({"error": "stale", "presented": 4, "current": 5}),
        json!({"error": "stale", "resource": "r", "presented": 4}),
    ];
    for body in not_stale {
        assert_eq!(stale_from_json(body.to_string().as_bytes()), None, "{body}");
    }
    assert_eq!(stale_from_json(b"stale"), None);
}

#[tokio::test]
async fn refusals_name_the_headers_and_what_is_allowed() {
    let (status, body) = answer(FenceRejection::Missing).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(body["error"], "fence_required");
    let (status, bad) = answer(FenceRejection::Malformed(Invalid::new("token", "got \"abc\""))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"], "bad_fence");
    for message in [&body["message"], &bad["message"]] {
        let m = message.as_str().expect("message");
        assert!(m.contains(HEADER_RESOURCE) && m.contains(HEADER_TOKEN), "{m}");
        assert!(m.contains(&u64::MAX.to_string()), "{m}");
    }
    assert!(bad["message"].as_str().is_some_and(|m| m.contains("abc")), "{bad}");
}

#[tokio::test]
async fn arbiter_errors_map_to_status_without_leaking_internals() {
    let invalid = ArbiterError::Invalid(Invalid::new("token", "above the limit"));
    let (status, body) = answer(ArbiterResponse(invalid)).await;
    assert_eq!((status, &body["error"]), (StatusCode::BAD_REQUEST, &json!("invalid")));
    assert!(body["message"].as_str().is_some_and(|m| m.contains("above the limit")));

    let internal = ArbiterError::Task("connection to 10.0.0.7 reset, password=hunter2".into());
    let (status, body) = answer(ArbiterResponse(internal)).await;
    assert_eq!(
        (status, &body["error"]),
        (StatusCode::INTERNAL_SERVER_ERROR, &json!("internal"))
    );
    let text = body.to_string();
    assert!(!text.contains("hunter2") && !text.contains("10.0.0.7"), "{text}");
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_retryable_conflict_is_503() {
    let busy = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None);
    let e = ArbiterError::Sqlite(busy);
    assert!(e.is_retryable());
    let (status, body) = answer(ArbiterResponse(e)).await;
    assert_eq!(
        (status, &body["error"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("retry"))
    );
}

#[tokio::test]
async fn a_refused_signature_is_403_naming_the_reason() {
    let refused = ArbiterError::BadSignature {
        resource: ResourceId::new("orders/7").expect("valid"),
        reason: leasefence_core::signing::SignatureError::Mismatch,
    };
    let (status, body) = answer(ArbiterResponse(refused)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        (&body["error"], &body["reason"], &body["resource"]),
        (&json!("bad_signature"), &json!("mismatch"), &json!("orders/7"))
    );
}
