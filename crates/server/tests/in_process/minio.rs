//! A node whose engine keeps its tables on an S3 server (`--sst-store`), MinIO here:
//! its flushed tables are objects in the bucket and none lands in its directory, and
//! after a restart with its flash cache emptied it reads them back from the bucket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use futures_util::TryStreamExt;
use phoenix_server::MetaMember;

use crate::common::*;

#[path = "../../../engine/tests/support/minio.rs"]
mod minio_server;

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs minio"]
async fn a_node_keeps_its_tables_on_minio() {
    let minio = tokio::task::spawn_blocking(minio_server::Minio::start)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let addrs = vec![addr.clone()];
    let cfg = || {
        let mut c = config(1, &addr, dir.path(), &meta, 1);
        c.sst_store = Some(minio.url("cluster/node-1"));
        // Small memtables: the writes below are flushed several times.
        c.memtable_bytes = 128 << 10;
        c
    };
    let node = start(cfg());
    let route = wait_route(&addrs).await;
    let value = |i: u32| format!("{i:08}-{}", "v".repeat(200)).into_bytes();
    for i in 0..3000u32 {
        put(&addrs, &route, format!("k{i:05}").as_bytes(), &value(i)).await;
    }
    node.stop().await;

    let tables: Vec<String> = minio
        .bucket()
        .list(Some(&"cluster/node-1".into()))
        .map_ok(|m| m.location.to_string())
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .into_iter()
        .filter(|name| name.ends_with(".sst"))
        .collect();
    assert!(!tables.is_empty(), "no table in the bucket");
    let node_dir = dir.path().join("node-1");
    let local: Vec<String> = files(&node_dir.join("db"))
        .into_iter()
        .filter(|f| f.ends_with(".sst") || f.contains("MANIFEST"))
        .collect();
    assert!(
        local.is_empty(),
        "tables in the node's directory: {local:?}"
    );
    assert!(
        files(&node_dir.join("sst-cache"))
            .iter()
            .any(|f| f.ends_with(".fcache")),
        "the tables written are on flash too"
    );

    // Without its flash cache the node reads the tables back from the bucket.
    std::fs::remove_dir_all(node_dir.join("sst-cache")).unwrap();
    let node = start(cfg());
    let route = wait_route(&addrs).await;
    for i in (0..3000u32).step_by(37) {
        assert_eq!(
            get(&addrs, &route, format!("k{i:05}").as_bytes()).await,
            Some(value(i)),
            "k{i:05}"
        );
    }
    node.stop().await;
}
