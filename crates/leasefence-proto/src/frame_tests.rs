//! Unit tests of the frame codec: every frame round-trips, a cut or padded
//! frame is refused with a message that says what is wrong, and strings are
//! bounded on a character boundary.

use super::*;

fn id(n: u8) -> LeaseId {
    LeaseId::from_bytes([n; 16])
}

fn requests() -> Vec<Request> {
    vec![
        Request::Hello {
            version: VERSION,
            token: None,
        },
        Request::Hello {
            version: 7,
            token: Some("s3cret".into()),
        },
        Request::Acquire {
            resource: "orders/7".into(),
            holder: "wörker-a".into(),
            ttl_ms: 10_000,
            wait_ms: 250,
            lock_delay_ms: u64::MAX,
        },
        Request::Renew {
            resource: "a".into(),
            lease_id: id(1),
        },
        Request::Release {
            resource: "b".into(),
            lease_id: id(2),
        },
        Request::Status { resource: "c".into() },
    ]
}

fn responses() -> Vec<Response> {
    vec![
        Response::Welcome { version: VERSION },
        Response::Lease {
            token: u64::MAX,
            lease_id: id(9),
            holder: "h".into(),
            ttl_ms: 1,
            expires_in_ms: 0,
            signature: "v1.abc".into(),
        },
        Response::Released { token: 3 },
        Response::Closing,
        Response::Status {
            last_token: 0,
            held: None,
            waiters: 0,
        },
        Response::Status {
            last_token: 4,
            held: Some(HeldBy {
                holder: "x".into(),
                token: 4,
                expires_in_ms: 99,
            }),
            waiters: u32::MAX,
        },
        Response::Refused(Refusal::new("not_leader", "ask elsewhere")),
        Response::Refused(Refusal {
            kind: "busy".into(),
            message: "busy".into(),
            leader: "http://10.0.0.1:7740".into(),
            busy: Some(Busy {
                holder: "y".into(),
                token: 8,
                expires_in_ms: 5,
                reason: 1,
                retry_in_ms: 6,
            }),
        }),
    ]
}

#[test]
fn every_request_and_response_round_trips() {
    let mut buf = Vec::new();
    for r in requests() {
        encode_request(&r, &mut buf);
        let len = body_len([buf[0], buf[1], buf[2], buf[3]]).expect("length in bounds");
        assert_eq!(len, buf.len() - 4);
        assert_eq!(decode_request(&buf[4..]), Ok(r));
    }
    for r in responses() {
        encode_response(&r, &mut buf);
        assert_eq!(decode_response(&buf[4..]), Ok(r));
    }
}

#[test]
fn every_cut_short_frame_is_refused_and_so_are_extra_bytes() {
    let mut buf = Vec::new();
    for r in requests() {
        encode_request(&r, &mut buf);
        for end in 4..buf.len() {
            assert!(decode_request(&buf[4..end]).is_err(), "{r:?} cut at {end}");
        }
        buf.push(0);
        assert_eq!(decode_request(&buf[4..]), Err(FrameError::Trailing(1)));
    }
    for r in responses() {
        encode_response(&r, &mut buf);
        for end in 4..buf.len() {
            assert!(decode_response(&buf[4..end]).is_err(), "{r:?} cut at {end}");
        }
    }
}

#[test]
fn bad_frames_say_what_is_wrong() {
    assert_eq!(decode_request(&[0x7f]), Err(FrameError::Type(0x7f)));
    assert_eq!(decode_request(&[WELCOME, 1]), Err(FrameError::Type(WELCOME)));
    assert_eq!(decode_response(&[HELLO, 1]), Err(FrameError::Type(HELLO)));
    assert_eq!(
        decode_request(&[STATUS, 0, 2, 0xff, 0xfe]),
        Err(FrameError::Utf8("resource"))
    );
    assert_eq!(
        decode_request(&[STATUS, 0xff, 0xff]),
        Err(FrameError::TooLong {
            field: "resource",
            len: 0xffff,
            max: STRING_MAX
        })
    );
    assert_eq!(
        decode_request(&[RENEW, 0, 1, b'a', 1, 2]),
        Err(FrameError::Short("lease_id"))
    );
    let mut status = vec![STATUS_ANSWER];
    status.extend_from_slice(&[0; 8]);
    status.push(2);
    assert_eq!(
        decode_response(&status),
        Err(FrameError::Value {
            field: "held",
            value: 2
        })
    );
    assert_eq!(body_len([0, 0, 0, 0]), Err(FrameError::Length(0)));
    assert_eq!(body_len([0, 0, 0x40, 1]), Err(FrameError::Length(FRAME_MAX + 1)));
    assert_eq!(body_len([0, 0, 0x40, 0]), Ok(FRAME_MAX));
    assert_eq!(
        FrameError::Type(9).invalid().to_string(),
        "invalid frame: unknown frame type 0x09"
    );
}

#[test]
fn a_string_longer_than_allowed_is_cut_on_a_character_boundary() {
    let long = "é".repeat(STRING_MAX);
    let mut buf = Vec::new();
    encode_response(&Response::Refused(Refusal::new("internal", long)), &mut buf);
    let Ok(Response::Refused(r)) = decode_response(&buf[4..]) else {
        panic!("a cut message still decodes")
    };
    assert_eq!(r.message.len(), STRING_MAX);
    assert!(buf.len() - 4 <= FRAME_MAX);
}

#[test]
fn lease_refusals_round_trip_and_others_are_not_lease_outcomes() {
    let r = ResourceId::new("orders/1").expect("valid");
    let busy = LeaseError::Busy {
        resource: r.clone(),
        holder: Holder::new("worker-a").expect("valid"),
        token: Token::new(41).expect("non-zero"),
        expires_in: Duration::ZERO,
        reason: BusyReason::LockDelay {
            retry_in: Duration::from_millis(4500),
        },
    };
    for e in [
        busy,
        LeaseError::LeaseLost { resource: r.clone() },
        LeaseError::TokensExhausted { resource: r.clone() },
        LeaseError::Invalid(Invalid::new("ttl_ms", "must be in 100..=200 ms, got 5 ms")),
        LeaseError::Invalid(FrameError::Type(3).invalid()),
    ] {
        assert_eq!(Refusal::from_lease(&e).to_lease(&r), Some(e));
    }
    assert_eq!(Refusal::new("unauthenticated", "no token").to_lease(&r), None);
    // A busy refusal without its details is no lease outcome either.
    assert_eq!(Refusal::new("busy", "?").to_lease(&r), None);
}

#[tokio::test]
async fn read_frame_bounds_the_length_and_tells_a_clean_close_from_a_cut() {
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    encode_request(&Request::Status { resource: "a".into() }, &mut frames);
    let one = frames.clone();
    frames.extend_from_slice(&one);
    let mut r = &frames[..];
    for _ in 0..2 {
        assert!(read_frame(&mut r, &mut buf).await.expect("a whole frame"));
        assert_eq!(decode_request(&buf), Ok(Request::Status { resource: "a".into() }));
    }
    assert!(!read_frame(&mut r, &mut buf).await.expect("a clean close"));
    let mut cut = &one[..one.len() - 1];
    let e = read_frame(&mut cut, &mut buf).await.expect_err("cut inside the body");
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    let mut cut = &one[..2];
    let e = read_frame(&mut cut, &mut buf).await.expect_err("cut inside the header");
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    let mut huge: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1];
    let e = read_frame(&mut huge, &mut buf).await.expect_err("too long");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("frame length 4294967295"), "{e}");
}
