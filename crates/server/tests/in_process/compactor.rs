//! Compactions on a worker (`phoenix compactor`, compactor.rs): a node on MinIO hands
//! its compactions to a worker serving the bucket, which runs them there; a worker that
//! refuses a job or cannot be reached leaves it to the engine, and nothing is lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use phoenix_engine::{Db, ObjectTableStore, Options, ReadOptions, WriteOptions};
use phoenix_server::compactor::{self, RemoteCompactor, WorkerConfig};
use phoenix_server::{MetaMember, Security};

use crate::common::*;

use crate::minio::minio_server;

/// Serves a worker for `sst_store` on a free loopback port; its address, and the
/// sender that stops it.
async fn worker(sst_store: String) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cfg = WorkerConfig {
        sst_store,
        jobs: 2,
        security: Security::default(),
    };
    tokio::spawn(async move {
        compactor::serve(cfg, listener, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (addr, stop)
}

/// A node on MinIO with `--compactor`: its compactions run on the worker (the node's
/// metrics count them), none falls back, and the data reads back after a restart
/// without the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs minio"]
async fn a_node_s_compactions_run_on_a_worker_on_minio() {
    let minio = tokio::task::spawn_blocking(minio_server::Minio::start)
        .await
        .unwrap();
    let (worker_addr, stop_worker) = worker(minio.url("cluster")).await;
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let meta = vec![MetaMember {
        id: 1,
        addr: addr.clone(),
    }];
    let addrs = vec![addr.clone()];
    let cfg = |with_worker: bool| {
        let mut c = config(1, &addr, dir.path(), &meta, 1);
        c.sst_store = Some(minio.url("cluster/node-1"));
        c.metrics_listen = Some(metrics.clone());
        c.compactor = with_worker.then(|| worker_addr.clone());
        // Small memtables: many flushes, so L0 fills and is compacted several times.
        c.memtable_bytes = 64 << 10;
        c
    };
    let node = start(cfg(true));
    let route = wait_route(&addrs).await;
    let value = |i: u32| format!("{i:08}-{}", "v".repeat(200)).into_bytes();
    for round in 0..2u32 {
        for i in 0..3000u32 {
            let v = [value(i), round.to_be_bytes().to_vec()].concat();
            put(&addrs, &route, format!("k{i:05}").as_bytes(), &v).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let remote = loop {
        let (_, text) = http_get(&metrics, "/metrics").await;
        let ran = sample(&text, "phoenix_engine_remote_compactions_total", "").unwrap_or(0.0);
        let failed = sample(
            &text,
            "phoenix_engine_remote_compaction_fallbacks_total",
            "",
        )
        .unwrap_or(0.0);
        assert_eq!(failed, 0.0, "a compaction fell back to the node:\n{text}");
        if ran >= 2.0 {
            break ran;
        }
        assert!(
            Instant::now() < deadline,
            "{ran} compactions on the worker after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    node.stop().await;
    let _ = stop_worker.send(());
    let node = start(cfg(false));
    let route = wait_route(&addrs).await;
    for i in (0..3000u32).step_by(29) {
        let want = [value(i), 1u32.to_be_bytes().to_vec()].concat();
        assert_eq!(
            get(&addrs, &route, format!("k{i:05}").as_bytes()).await,
            Some(want),
            "k{i:05} after {remote} compactions on the worker"
        );
    }
    node.stop().await;
}

/// A job of one made-up input (the worker refuses or fails it before reading it).
fn job() -> phoenix_engine::CompactionJob {
    use phoenix_engine::key::{internal_key, ValueKind};
    let input = phoenix_engine::version_edit::FileMeta {
        number: 7,
        size: 1000,
        smallest: internal_key(b"a", 2, ValueKind::Put),
        largest: internal_key(b"z", 1, ValueKind::Put),
        smallest_seq: 1,
        largest_seq: 2,
        min_group: 0,
        max_group: 0,
        num_entries: 2,
        num_range_deletions: 0,
    };
    phoenix_engine::CompactionJob {
        level: 0,
        output_level: 1,
        inputs: vec![Arc::new(input)],
        next_inputs: Vec::new(),
        bottommost: true,
        snapshots: Vec::new(),
        first_file_number: 100,
        file_numbers: 10,
        target_file_size: 1 << 20,
        min_group_file_size: 0,
        readahead_bytes: 0,
        table: Default::default(),
    }
}

/// An engine whose worker refuses its store (not under the worker's prefix) or is not
/// there at all compacts itself: every job falls back, none is installed from a worker,
/// and every key reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_that_refuses_or_is_gone_leaves_the_compaction_to_the_engine() {
    let (refusing, _stop) =
        worker("s3://another-bucket/base?endpoint=http://127.0.0.1:9".into()).await;
    let gone = format!("127.0.0.1:{}", free_port());
    for (addr, why) in [(refusing, "is not under"), (gone, "connecting")] {
        let client = RemoteCompactor::new(
            &addr,
            "s3://bucket/node-1",
            phoenix_proto::security::Credentials::default(),
            Duration::from_secs(10),
        )
        .unwrap();
        let addr2 = addr.clone();
        tokio::task::spawn_blocking(move || {
            // Asked directly, it says why.
            let e = phoenix_engine::CompactionService::compact(&client, &job())
                .expect_err("a compaction done by a worker that cannot");
            assert!(e.contains(why), "{addr2}: {e}");
            let fs: phoenix_storage::SharedFs = Arc::new(phoenix_storage::MemFs::new());
            let store = ObjectTableStore::new(
                Arc::new(object_store::memory::InMemory::new()),
                "bucket/node-1",
            )
            .unwrap();
            let opts = Options {
                write_buffer_size: 8 << 10,
                disable_auto_compactions: true,
                compaction_service: Some(Arc::new(client)),
                ..Options::default()
            };
            let db = Db::open_with_store(fs, Path::new("/db"), Arc::new(store), opts).unwrap();
            for i in 0..2000u32 {
                db.put(
                    &WriteOptions::default(),
                    format!("k{i:05}").as_bytes(),
                    &[b'v'; 64],
                )
                .unwrap();
            }
            db.compact_range(None, None).unwrap();
            let st = db.stats();
            assert_eq!(st.levels[0].files, 0, "{addr2}: {:?}", st.levels);
            assert_eq!(st.remote_compactions, 0, "{addr2}");
            assert!(st.remote_compaction_fallbacks >= 1, "{addr2}: {st:?}");
            for i in 0..2000u32 {
                assert!(db
                    .get(&ReadOptions::default(), format!("k{i:05}").as_bytes())
                    .unwrap()
                    .is_some());
            }
            db.close().unwrap();
        })
        .await
        .unwrap();
    }
}
