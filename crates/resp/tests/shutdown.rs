//! A front end told to stop: it takes no new connection, and the open ones close once
//! they have answered what they read (idle ones at once), well within the grace after
//! which they would be dropped. A request is run if and only if its reply is sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{decode, encode, pipeline, req, R};
use phoenix_resp::{MemoryStore, ServerInfo, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Well under `CLOSE_GRACE`: a connection closed by then was closed by the stop, not
/// dropped at the end of the grace.
const PROMPTLY: Duration = Duration::from_secs(3);
const _: () = assert!(PROMPTLY.as_millis() < phoenix_resp::CLOSE_GRACE.as_millis());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_closes_every_connection_after_its_answers() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let store = MemoryStore::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(phoenix_resp::serve(
        listener,
        Arc::new(store.clone()),
        ServerInfo::default(),
        None,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut idle = Vec::new();
    for i in 0..3u8 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let r = pipeline(&mut c, &[req(&[b"SET", &[b'k', i], b"v"])]).await;
        assert_eq!(r[0], R::Simple("OK".into()));
        idle.push(c);
    }
    // One more sends a long pipeline: the stop comes in the middle of it.
    let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
    let n = 100_000;
    let mut wire = Vec::new();
    for i in 0..n {
        wire.extend(encode(&req(&[b"SET", format!("p{i}").as_bytes(), b"v"])));
    }
    let sender = tokio::spawn(async move {
        // The server may stop reading before it all went: that is the point.
        let _ = wr.write_all(&wire).await;
        wr
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    stop.send(()).unwrap();
    let mut replies = Vec::new();
    tokio::time::timeout(PROMPTLY, rd.read_to_end(&mut replies))
        .await
        .expect("the pipelining connection closed promptly after the stop")
        .unwrap();
    drop(sender.await.unwrap());
    let mut pos = 0;
    let mut answered = 0;
    while let Some(r) = decode(&replies, &mut pos) {
        assert_eq!(r, R::Simple("OK".into()), "reply {answered}");
        answered += 1;
    }
    assert_eq!(pos, replies.len(), "only whole replies");
    eprintln!("{answered} of {n} pipelined requests answered before the stop");
    // Run if and only if answered: the first `answered` keys are set, no other.
    for i in 0..n {
        let set = store
            .get(format!("p{i}").as_bytes())
            .await
            .unwrap()
            .is_some();
        assert_eq!(set, i < answered, "key p{i}, {answered} replies");
    }
    for (i, c) in idle.iter_mut().enumerate() {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(PROMPTLY, c.read_to_end(&mut rest))
            .await
            .unwrap_or_else(|_| panic!("idle connection {i} still open after the stop"));
        assert_eq!(closed.unwrap(), 0, "connection {i}: {rest:?}");
    }
    tokio::time::timeout(PROMPTLY, server)
        .await
        .expect("the front end ends once its connections have")
        .unwrap();
}
