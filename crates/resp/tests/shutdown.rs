//! A front end told to stop: it takes no new connection, and the open ones close once
//! they have answered what they read (idle ones at once), so none outlives the node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{pipeline, req, R};
use phoenix_resp::{MemoryStore, ServerInfo};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_closes_every_connection_after_its_answers() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(phoenix_resp::serve(
        listener,
        Arc::new(MemoryStore::default()),
        ServerInfo::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut conns = Vec::new();
    for i in 0..3u8 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let r = pipeline(&mut c, &[req(&[b"SET", &[b'k', i], b"v"])]).await;
        assert_eq!(r[0], R::Simple("OK".into()));
        conns.push(c);
    }
    stop.send(()).unwrap();
    for (i, c) in conns.iter_mut().enumerate() {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest))
            .await
            .unwrap_or_else(|_| panic!("connection {i} still open 10 s after the stop"));
        assert_eq!(closed.unwrap(), 0, "connection {i}: {rest:?}");
    }
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the front end ends once its connections have")
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no connection is taken after the stop"
    );
}
