//! The calls of etcd's v3 gRPC API that `bench cluster --target etcd` makes: `KV/Range`
//! of one key or of a range with a limit (a listing), and `KV/Put`.
//!
//! The messages are written out here with the field numbers of etcd's
//! `api/etcdserverpb/rpc.proto` and `api/mvccpb/kv.proto` (fields the benchmark never
//! sets or reads are left out; protobuf decoding skips what it does not know). The
//! `etcd-client` crate would bring the whole API, but its build script needs a `protoc`
//! on the machine, and PhoenixKV builds with Rust and a C compiler alone (see README).
//! The transport is what that crate uses: tonic over a channel balanced across the
//! members, with the prost codec.

use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

/// `etcdserverpb.RangeRequest`: key = 1, range_end = 2, limit = 3.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    /// The key to read, or the first key of the range. The read is linearizable because
    /// `serializable` (7) is left false.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The end of the range, excluded (empty: exactly `key`).
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    /// Most pairs returned (0: no limit).
    #[prost(int64, tag = "3")]
    pub limit: i64,
}

/// `mvccpb.KeyValue`: key = 1, value = 5.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    /// The key.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The value.
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
}

/// `etcdserverpb.RangeResponse`: kvs = 2.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    /// The pairs found (at most one here).
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
}

/// `etcdserverpb.PutRequest`: key = 1, value = 2.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    /// The key.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The value.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `etcdserverpb.PutResponse` (its header is not needed).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {}

/// A client of etcd's `etcdserverpb.KV` service; cheap to clone (the channel is shared).
#[derive(Debug, Clone)]
pub struct KvClient {
    grpc: tonic::client::Grpc<Channel>,
}

/// Why a call failed: the channel, or etcd's answer.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// How a call that found no connection to send on fails (so it was never sent).
const NO_CONNECTION: &str = "no connection available";

/// Whether etcd's own client (clientv3 3.4) would retry a failed call: reads on any
/// `Unavailable` (a leader change, a member going away), writes only when the request
/// was never sent (no connection). Others are reported.
pub fn retryable(e: &Error, write: bool) -> bool {
    match e.downcast_ref::<tonic::Status>() {
        Some(s) if s.code() == tonic::Code::Unavailable => {
            !write || s.message().starts_with(NO_CONNECTION)
        }
        _ => false,
    }
}

impl KvClient {
    /// A client balanced across `urls` (`http://host:port`); connections are made on
    /// the first call.
    pub fn new(
        urls: &[String],
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let endpoints = urls
            .iter()
            .map(|u| {
                Endpoint::from_shared(u.clone())
                    .map(|e| e.connect_timeout(connect_timeout).timeout(timeout))
                    .map_err(|e| format!("bad etcd endpoint {u:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KvClient {
            grpc: tonic::client::Grpc::new(Channel::balance_list(endpoints.into_iter())),
        })
    }

    async fn unary<Req, Resp>(&mut self, path: &'static str, req: Req) -> Result<Resp, Error>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc.ready().await.map_err(|e| {
            tonic::Status::unavailable(format!("{NO_CONNECTION}: etcd channel not ready: {e}"))
        })?;
        let resp = self
            .grpc
            .unary(
                tonic::Request::new(req),
                PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await?;
        Ok(resp.into_inner())
    }

    /// The value of `key`, if any (a linearizable read).
    pub async fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let req = RangeRequest {
            key: key.to_vec(),
            ..RangeRequest::default()
        };
        let resp: RangeResponse = self.unary("/etcdserverpb.KV/Range", req).await?;
        Ok(resp.kvs.into_iter().next().map(|kv| kv.value))
    }

    /// At most `limit` pairs of `[start, end)` in key order (a linearizable read).
    pub async fn range(
        &mut self,
        start: &[u8],
        end: &[u8],
        limit: u32,
    ) -> Result<Vec<KeyValue>, Error> {
        let req = RangeRequest {
            key: start.to_vec(),
            range_end: end.to_vec(),
            limit: i64::from(limit),
        };
        let resp: RangeResponse = self.unary("/etcdserverpb.KV/Range", req).await?;
        Ok(resp.kvs)
    }

    /// Sets `key` to `value`.
    pub async fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let req = PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
        };
        let _: PutResponse = self.unary("/etcdserverpb.KV/Put", req).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn wire_bytes_match_etcd_field_numbers() {
        // key = 1 (0x0a), range_end = 2 (0x12), limit = 3 (varint, 0x18).
        let range = RangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            limit: 100,
        };
        assert_eq!(
            range.encode_to_vec(),
            vec![0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 100]
        );
        // key = 1 (tag 0x0a), value = 2 (tag 0x12).
        let put = PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        };
        assert_eq!(put.encode_to_vec(), vec![0x0a, 1, b'k', 0x12, 1, b'v']);
        // A RangeResponse with a header (1), one KeyValue (2) holding key (1),
        // mod_revision (3) and value (5), and count (4): only the value is kept.
        let kv = [0x0a, 1, b'k', 0x18, 7, 0x2a, 2, b'v', b'1'];
        let mut resp = vec![0x0a, 2, 0x18, 9, 0x12, kv.len() as u8];
        resp.extend_from_slice(&kv);
        resp.extend_from_slice(&[0x20, 1]);
        let r = RangeResponse::decode(resp.as_slice()).unwrap();
        assert_eq!(r.kvs.len(), 1);
        assert_eq!(
            (r.kvs[0].key.as_slice(), r.kvs[0].value.as_slice()),
            (&b"k"[..], &b"v1"[..])
        );
    }
}
