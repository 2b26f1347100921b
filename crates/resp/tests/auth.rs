//! The password of the default user (Redis' `requirepass`): nothing but AUTH, HELLO …
//! AUTH and QUIT is served before it is given; a wrong one is refused and changes
//! nothing; an unauthenticated client's requests are held to small sizes; without a
//! password configured, AUTH says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

mod common;

use common::{pipeline, req, R};
use phoenix_resp::{Conn, Limits, MemoryStore, Password, ServerInfo, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

fn connect(store: &MemoryStore, password: Option<&[u8]>) -> DuplexStream {
    let (client, server) = tokio::io::duplex(1 << 16);
    let info = ServerInfo {
        password: password.map(|p| Password::new(p.to_vec()).unwrap()),
        ..ServerInfo::default()
    };
    let mut conn = Conn::new(Arc::new(store.clone()), Limits::default(), Arc::new(info));
    tokio::spawn(async move {
        let _ = conn.serve(server).await;
    });
    client
}

fn error_starting(r: &R, code: &str) -> bool {
    matches!(r, R::Error(e) if e.starts_with(code))
}

#[tokio::test]
async fn nothing_is_served_before_the_password() {
    let store = MemoryStore::default();
    let mut c = connect(&store, Some(b"s3cret"));
    let r = pipeline(
        &mut c,
        &[
            req(&[b"SET", b"k", b"v"]),
            req(&[b"GET", b"k"]),
            req(&[b"PING"]),
            req(&[b"HELLO", b"2"]),
            req(&[b"AUTH", b"wrong"]),
            req(&[b"AUTH", b"default", b"wrong"]),
            req(&[b"AUTH", b"someone", b"s3cret"]),
            req(&[b"GET", b"k"]),
        ],
    )
    .await;
    for (i, code) in [
        "NOAUTH",
        "NOAUTH",
        "NOAUTH",
        "NOAUTH",
        "WRONGPASS",
        "WRONGPASS",
        "WRONGPASS",
        "NOAUTH",
    ]
    .iter()
    .enumerate()
    {
        assert!(error_starting(&r[i], code), "reply {i}: {:?}", r[i]);
    }
    assert_eq!(
        store.get(b"k").await.unwrap(),
        None,
        "nothing written before the password"
    );
    let r = pipeline(
        &mut c,
        &[
            req(&[b"AUTH", b"s3cret"]),
            req(&[b"SET", b"k", b"v"]),
            req(&[b"GET", b"k"]),
            // A wrong password later does not undo the right one.
            req(&[b"AUTH", b"wrong"]),
            req(&[b"GET", b"k"]),
        ],
    )
    .await;
    assert_eq!(r[0], R::Simple("OK".into()));
    assert_eq!(r[1], R::Simple("OK".into()));
    assert_eq!(r[2], R::Bulk(Some(b"v".to_vec())));
    assert!(error_starting(&r[3], "WRONGPASS"), "{:?}", r[3]);
    assert_eq!(r[4], R::Bulk(Some(b"v".to_vec())));

    // HELLO with AUTH authenticates and switches protocol at once; a wrong password
    // switches nothing (the null below is RESP2's).
    let mut c = connect(&store, Some(b"s3cret"));
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        pipeline(
            &mut c,
            &[
                req(&[b"HELLO", b"3", b"AUTH", b"default", b"wrong"]),
                req(&[b"AUTH", b"s3cret"]),
                req(&[b"GET", b"missing"]),
                req(&[b"HELLO", b"2", b"AUTH", b"default", b"s3cret"]),
                req(&[b"GET", b"k"]),
            ],
        ),
    )
    .await
    .expect("RESP2 replies");
    assert!(error_starting(&r[0], "WRONGPASS"), "{:?}", r[0]);
    assert_eq!(r[1], R::Simple("OK".into()));
    assert_eq!(r[2], R::Bulk(None));
    assert!(matches!(r[3], R::Array(Some(_))), "{:?}", r[3]);
    assert_eq!(r[4], R::Bulk(Some(b"v".to_vec())));

    // QUIT needs no password.
    let mut c = connect(&store, Some(b"s3cret"));
    let r = pipeline(&mut c, &[req(&[b"QUIT"])]).await;
    assert_eq!(r[0], R::Simple("OK".into()));
}

#[tokio::test]
async fn an_unauthenticated_client_cannot_send_big_requests() {
    let store = MemoryStore::default();
    let mut c = connect(&store, Some(b"s3cret"));
    // 11 arguments: over what a client without the password may send.
    let mut big = vec![b"MSET".to_vec()];
    big.extend((0..10).map(|i| vec![b'a' + i]));
    let r = pipeline(&mut c, &[big.clone()]).await;
    assert!(
        error_starting(&r[0], "ERR Protocol error: invalid multibulk length"),
        "{:?}",
        r[0]
    );
    let mut rest = Vec::new();
    assert_eq!(
        c.read_to_end(&mut rest).await.unwrap(),
        0,
        "closed after it"
    );
    assert_eq!(store.get(b"a").await.unwrap(), None);
    // The same request once authenticated is served.
    let mut c = connect(&store, Some(b"s3cret"));
    let r = pipeline(&mut c, &[req(&[b"AUTH", b"s3cret"]), big]).await;
    assert_eq!(r[0], R::Simple("OK".into()));
    assert_eq!(r[1], R::Simple("OK".into()));
    assert_eq!(store.get(b"a").await.unwrap(), Some(b"b".to_vec()));
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_a_password_auth_says_none_is_set() {
    let store = MemoryStore::default();
    let mut c = connect(&store, None);
    // As Redis' default user without a password: a password alone is a mistake said
    // so; the default user with any password is let in (client libraries configured
    // with a user send it so); another user does not exist.
    let r = pipeline(
        &mut c,
        &[
            req(&[b"AUTH", b"x"]),
            req(&[b"AUTH", b"default", b"x"]),
            req(&[b"HELLO", b"2", b"AUTH", b"default", b"x"]),
            req(&[b"AUTH", b"someone", b"x"]),
            req(&[b"AUTH", b"a", b"b", b"c"]),
            req(&[b"SET", b"k", b"v"]),
        ],
    )
    .await;
    assert!(
        error_starting(&r[0], "ERR AUTH <password> called without any password"),
        "{:?}",
        r[0]
    );
    assert_eq!(r[1], R::Simple("OK".into()));
    assert!(matches!(r[2], R::Array(Some(_))), "{:?}", r[2]);
    assert!(error_starting(&r[3], "WRONGPASS"), "{:?}", r[3]);
    assert!(error_starting(&r[4], "ERR syntax error"), "{:?}", r[4]);
    assert_eq!(r[5], R::Simple("OK".into()));
}
