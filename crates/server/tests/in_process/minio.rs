//! A node whose engine keeps its tables on an S3 server (`--sst-store`), MinIO here:
//! its flushed tables are objects in the bucket and none lands in its directory, and
//! after a restart with its flash cache emptied it reads them back from the bucket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use futures_util::TryStreamExt;
use phoenix_server::MetaMember;

use crate::common::*;

#[path = "../../../engine/tests/support/minio.rs"]
pub(crate) mod minio_server;

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

/// A follower back after its group's log was cut past it is rebuilt by copy: the
/// leader's tables below L0 are copied on the store into the follower's prefix, and only
/// the rest of the group passes through the nodes (`phoenix_snapshot_bytes_total`). The
/// follower then serves every write once the old leader is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs minio"]
async fn a_follower_behind_is_rebuilt_by_copy_on_minio() {
    let minio = tokio::task::spawn_blocking(minio_server::Minio::start)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (addrs, meta) = loopback_members(3);
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let cfg = |i: usize| {
        let mut c = config(i as u64 + 1, &addrs[i], dir.path(), &meta, 3);
        c.sst_store = Some(minio.url(&format!("cluster/node-{}", i + 1)));
        c.metrics_listen = Some(metrics[i].clone());
        // Small memtables flush often: the group's data moves below L0, and the
        // persisted applied index advances so the logs are cut past a stopped follower.
        c.memtable_bytes = 64 << 10;
        c.log_keep_entries = 10;
        c.log_truncate_interval = Duration::from_millis(100);
        c
    };
    let mut nodes: Vec<Option<Node>> = (0..3).map(|i| Some(start(cfg(i)))).collect();
    let route = wait_route(&addrs).await;
    let leader = route.leader_node_id as usize - 1;
    let follower = (leader + 1) % 3;
    nodes[follower].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|&i| i != follower)
        .map(|i| addrs[i].clone())
        .collect();
    // Values that do not compress: the tables' sizes are the data's.
    let value = |i: u32| {
        let mut x = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    };
    const KEYS: u32 = 2000;
    for i in 0..KEYS {
        put(&live, &route, format!("c{i:05}").as_bytes(), &value(i)).await;
    }
    // A range deletion over keys in the copied tables, and a key written back inside it:
    // the rest carries the range (or the tables lost the keys to a compaction since).
    let client = phoenix_client::Client::connect(live.clone(), Default::default())
        .await
        .unwrap();
    client.delete_range(b"c00100", b"c01500").await.unwrap();
    put(&live, &route, b"c00500", &value(500)).await;
    let gone = |i: u32| (100..1500).contains(&i) && i != 500;
    tokio::time::sleep(Duration::from_millis(500)).await;
    nodes[follower] = Some(start(cfg(follower)));
    super::wait_caught_up(
        &addrs,
        &route,
        leader,
        follower,
        u64::from(KEYS) + 2,
        Duration::from_secs(60),
    )
    .await;
    let (_, text) = http_get(&metrics[leader], "/metrics").await;
    let bytes = |how: &str| {
        sample(
            &text,
            "phoenix_snapshot_bytes_total",
            &format!("how=\"{how}\""),
        )
        .unwrap_or(0.0)
    };
    let (copied, streamed) = (bytes("copied"), bytes("streamed"));
    // About 2 MiB of data: most of it below L0, copied; the rest streamed.
    assert!(
        copied >= f64::from(KEYS) * 512.0,
        "copied {copied} bytes, streamed {streamed}"
    );
    assert!(
        streamed < copied / 2.0,
        "copied {copied} bytes, streamed {streamed}"
    );

    // The old leader goes: the rebuilt follower and the third node serve every write.
    nodes[leader].take().unwrap().stop().await;
    let live: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| addrs[i].clone())
        .collect();
    for i in (0..KEYS).step_by(37).chain([99, 100, 500, 1499, 1500]) {
        assert_eq!(
            get(&live, &route, format!("c{i:05}").as_bytes()).await,
            (!gone(i)).then(|| value(i)),
            "key {i}"
        );
    }
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}
