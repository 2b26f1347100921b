//! PhoenixKV's Redis-protocol front end: redis-cli, redis-benchmark and Redis client
//! libraries talk to the cluster through any node.
//!
//! - [`codec`]: RESP2 and RESP3 framing (requests in, [`Reply`] out), with limits;
//! - [`command`]: the commands served, checked for arity and options;
//! - [`conn`]: a connection running its commands in order against a [`Store`];
//! - [`store`]: what the commands need from the cluster, over `phoenix-client`
//!   ([`ClusterStore`]: routing, leader cache, retries and client sessions; inside a
//!   node, its calls to that node are served in the process: [`InNode`]), or in
//!   memory ([`MemoryStore`]).
//!
//! [`serve`] accepts connections on a listener until told to stop, then closes them
//! once they have answered what they read; with [`Tls`], over TLS.

pub mod codec;
pub mod command;
pub mod conn;
pub mod store;
mod tls;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use codec::{Limits, ProtocolError, Reply};
pub use conn::{Conn, Password, ServerInfo};
pub use store::{ClusterStore, InNode, MemoryStore, Store, StoreError};
pub use tls::Tls;

/// Connections served at once; past it a new one is told so and closed.
pub const CONNECTIONS_MAX: usize = 10_000;

/// Serves Redis clients on `listener` against `store` until `shutdown` completes; over
/// TLS only if `tls` is given.
pub async fn serve<S: Store>(
    listener: TcpListener,
    store: Arc<S>,
    info: ServerInfo,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()>,
) {
    // With TLS and no password, only a certificate can let a client in: ask for one.
    let certificate_required = info.password.is_none();
    let info = Arc::new(info);
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    // The connections' tasks, told to close when the listener stops.
    let mut conns = tokio::task::JoinSet::new();
    let (stop_conns, stop_seen) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            // (Reaps the tasks of connections that ended.)
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            a = listener.accept() => a,
        };
        let (mut sock, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // (Out of file descriptors, say: wait a moment rather than spin.)
                tracing::warn!("resp: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt as _;
                let _ = sock
                    .write_all(b"-ERR max number of clients reached\r\n")
                    .await;
            });
            continue;
        };
        let mut conn = Conn::new(Arc::clone(&store), Limits::default(), Arc::clone(&info));
        let stop = stop_seen.clone();
        let tls = tls.clone();
        conns.spawn(async move {
            let ended = match tls {
                None => conn.serve_until(sock, Some(stop)).await,
                Some(tls) => match tls.accept(sock, certificate_required).await {
                    Ok((stream, by_certificate)) => {
                        if by_certificate {
                            conn.authenticated_by_certificate();
                        }
                        conn.serve_until(stream, Some(stop)).await
                    }
                    Err(e) => {
                        tracing::debug!(%peer, "resp: TLS handshake failed: {e}");
                        Ok(())
                    }
                },
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, "resp: connection ended: {e}");
            }
            drop(permit);
        });
    }
    // Stopping: no more connections; those open finish what they have read and close.
    // One stuck on a write to a client that does not read is dropped past the grace.
    drop(listener);
    let _ = stop_conns.send(true);
    let drained = tokio::time::timeout(CLOSE_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(left = conns.len(), "resp: connections dropped at stop");
    }
}

/// How long a stopping front end waits for its connections to finish their requests.
pub const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
