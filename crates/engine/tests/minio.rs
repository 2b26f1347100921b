//! What the object table store relies on an S3 server for, checked against MinIO:
//! conditional uploads (If-None-Match, If-Match), server-side copy, multipart upload,
//! ranged reads, listing under a prefix; and how the store reads a server's refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutPayload, UpdateVersion};
use phoenix_engine::{ObjectTableStore, TableStore};

mod support;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
#[ignore = "needs minio"]
fn minio_does_what_the_table_store_relies_on() {
    let minio = support::minio::Minio::start();
    let s = minio.bucket();
    runtime().block_on(async {
        let get = |p: ObjectPath| {
            let s = Arc::clone(&s);
            async move { s.get(&p).await.unwrap().bytes().await.unwrap() }
        };
        // Create if absent (If-None-Match: *).
        let a = ObjectPath::from("conformance/a");
        let first = s
            .put_opts(&a, PutPayload::from_static(b"1"), PutMode::Create.into())
            .await
            .unwrap();
        let taken = s
            .put_opts(&a, PutPayload::from_static(b"2"), PutMode::Create.into())
            .await
            .unwrap_err();
        assert!(
            matches!(taken, object_store::Error::AlreadyExists { .. }),
            "{taken}"
        );
        assert_eq!(get(a.clone()).await, "1");

        // Replace if unchanged (If-Match: <ETag>).
        let update = |e_tag: Option<String>| {
            PutMode::Update(UpdateVersion {
                e_tag,
                version: None,
            })
        };
        let second = s
            .put_opts(
                &a,
                PutPayload::from_static(b"2"),
                update(first.e_tag.clone()).into(),
            )
            .await
            .unwrap();
        assert_ne!(first.e_tag, second.e_tag);
        let stale = s
            .put_opts(
                &a,
                PutPayload::from_static(b"3"),
                update(first.e_tag).into(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(stale, object_store::Error::Precondition { .. }),
            "{stale}"
        );
        assert_eq!(get(a.clone()).await, "2");
        // Replacing an object that is gone fails the same way.
        let gone = ObjectPath::from("conformance/gone");
        let missing = s
            .put_opts(
                &gone,
                PutPayload::from_static(b"x"),
                update(second.e_tag).into(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                missing,
                object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }
            ),
            "{missing}"
        );

        // Server-side copy (CopyObject).
        let b = ObjectPath::from("conformance/b");
        s.copy(&a, &b).await.unwrap();
        assert_eq!(get(b.clone()).await, "2");

        // Multipart upload: two 5 MiB parts and a tail.
        let data: Vec<u8> = (0..(11u32 << 20)).map(|i| (i % 251) as u8).collect();
        let big = ObjectPath::from("conformance/big");
        let mut upload = s.put_multipart(&big).await.unwrap();
        for part in data.chunks(5 << 20) {
            upload
                .put_part(PutPayload::from(part.to_vec()))
                .await
                .unwrap();
        }
        upload.complete().await.unwrap();
        assert_eq!(s.head(&big).await.unwrap().size, data.len() as u64);

        // Ranged reads, across a part boundary too.
        for (from, to) in [
            (0u64, 100u64),
            (5_242_800, 5_243_000),
            (11_534_000, 11_534_336),
        ] {
            let got = s.get_range(&big, from..to).await.unwrap();
            assert_eq!(&got[..], &data[from as usize..to as usize], "{from}..{to}");
        }

        // Listing under a prefix.
        use futures_util::TryStreamExt;
        let mut listed: Vec<String> = s
            .list(Some(&ObjectPath::from("conformance")))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        listed.sort();
        assert_eq!(
            listed,
            ["conformance/a", "conformance/b", "conformance/big"]
        );
    });
}

/// A store whose bucket does not exist fails with the server's answer — not as fenced,
/// which would tell the node that another writer holds its data.
#[test]
#[ignore = "needs minio"]
fn a_missing_bucket_on_minio_is_an_error_not_a_fence() {
    let minio = support::minio::Minio::start();
    let url = minio
        .url("p")
        .replacen(support::minio::BUCKET, "no-such-bucket", 1);
    let store = ObjectTableStore::from_url(&url).unwrap();
    let err = store.set_current_manifest(1).unwrap_err();
    assert!(!err.is_fenced(), "{err}");
    assert!(err.to_string().contains("no-such-bucket"), "{err}");
}

/// A table past one part goes up in parts (an S3 multipart upload: its ETag says so) as
/// it is written, and reads back whole; its completion never replaces an object of its
/// name, as a whole upload never does (a fenced writer's table would otherwise replace a
/// newer writer's), unless that object holds exactly its bytes (its own completion, sent
/// again after the answer was lost). Small tables still go up whole; an imported table
/// goes up in parts too; an engine's flushes and compactions read back after a reopen.
#[test]
#[ignore = "needs minio"]
fn large_tables_go_up_in_parts_and_never_replace_an_object_minio() {
    use phoenix_engine::table::table_file_name;
    use phoenix_engine::{Db, Options, ReadOptions, WalMode, WriteOptions};
    use phoenix_storage::{FileSystem, MemFs};

    let minio = support::minio::Minio::start();
    let bucket = minio.bucket();
    let url = format!("{}&multipart_part_mib=5", minio.url("parts"));
    let store = ObjectTableStore::from_url(&url).unwrap();
    // 12 MiB and a bit: three parts of 5 MiB, the last one short.
    let data = |seed: u32| -> Vec<u8> {
        (0..(12u32 << 20) + 12_345)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 24) as u8)
            .collect()
    };
    let object = |n: u64| ObjectPath::from(format!("parts/{}", table_file_name(n)));
    let rt = runtime();
    let e_tag = |n: u64| rt.block_on(bucket.head(&object(n))).unwrap().e_tag.unwrap();
    let stored = |n: u64| {
        rt.block_on(async { bucket.get(&object(n)).await.unwrap().bytes().await.unwrap() })
    };
    let write = |store: &ObjectTableStore, n: u64, bytes: &[u8]| {
        let mut t = store.create_table(n).unwrap();
        for chunk in bytes.chunks(100_000) {
            t.append(chunk).unwrap();
        }
        assert_eq!(t.position(), bytes.len() as u64);
        t.sync_all()
    };

    let one = data(1);
    write(&store, 1, &one).unwrap();
    assert!(e_tag(1).trim_matches('"').ends_with("-3"), "{}", e_tag(1));
    let read = store.open_table(1).unwrap();
    let mut back = vec![0; one.len()];
    read.read_exact_at(0, &mut back).unwrap();
    assert!(back == one, "table 1 reads back as written");

    // A name another writer holds: refused as fenced, that object left as it was.
    rt.block_on(bucket.put(&object(2), PutPayload::from_static(b"another writer's")))
        .unwrap();
    let err = write(&store, 2, &data(2)).unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert_eq!(stored(2), "another writer's");

    // Table 1 again: the same bytes count as this upload done; other bytes are refused.
    let again = ObjectTableStore::from_url(&url).unwrap();
    write(&again, 1, &one).unwrap();
    let err = write(&again, 1, &data(3)).unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert!(stored(1) == one, "table 1 unchanged");

    // Small tables go up whole.
    write(&store, 5, &one[..1 << 20]).unwrap();
    assert!(!e_tag(5).contains('-'), "{}", e_tag(5));

    // An ingested table is imported in parts.
    let fs = MemFs::new();
    let four = data(4);
    let mut f = fs
        .create(std::path::Path::new("/in.sst"), Default::default())
        .unwrap();
    f.append(&four).unwrap();
    f.sync_all().unwrap();
    drop(f);
    store
        .import_table(&fs, std::path::Path::new("/in.sst"), 4)
        .unwrap();
    assert!(e_tag(4).trim_matches('"').ends_with("-3"), "{}", e_tag(4));
    assert!(stored(4) == four, "the imported table is the file");

    // An engine whose memtables flush into tables of several parts.
    let local: phoenix_storage::SharedFs = Arc::new(MemFs::new());
    let opts = Options {
        write_buffer_size: 16 << 20,
        target_file_size_base: 32 << 20,
        wal: WalMode::None,
        ..Options::default()
    };
    let open = || {
        let store =
            ObjectTableStore::from_url(&format!("{}&multipart_part_mib=5", minio.url("parts-db")))
                .unwrap();
        Db::open_with_store(
            Arc::clone(&local),
            std::path::Path::new("/db"),
            Arc::new(store),
            opts.clone(),
        )
        .unwrap()
    };
    // (Keys of one group: the engine cuts tables where the group, the first 8 bytes,
    // changes.)
    let key = |k: u32| [&1u64.to_be_bytes()[..], &k.to_be_bytes()].concat();
    let db = open();
    let keys = 12_000u32;
    // (Values that do not compress: tables as big as what was written.)
    let value = |k: u32| -> Vec<u8> {
        (0..1000u32)
            .map(|i| ((i ^ k.rotate_left(11)).wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect()
    };
    for k in 0..keys {
        db.put(&WriteOptions::default(), &key(k), &value(k))
            .unwrap();
        if k == keys / 2 {
            db.flush().unwrap();
        }
    }
    db.flush().unwrap();
    db.compact_range(None, None).unwrap();
    db.close().unwrap();
    drop(db);
    let tags: Vec<String> = rt.block_on(async {
        use futures_util::TryStreamExt;
        bucket
            .list(Some(&ObjectPath::from("parts-db")))
            .try_filter(|m| std::future::ready(m.location.as_ref().ends_with(".sst")))
            .map_ok(|m| m.e_tag.unwrap_or_default())
            .try_collect()
            .await
            .unwrap()
    });
    assert!(
        tags.iter().any(|t| t.trim_matches('"').contains('-')),
        "some table went up in parts: {tags:?}"
    );
    let db = open();
    for k in 0..keys {
        let got = db.get(&ReadOptions::default(), &key(k)).unwrap();
        assert!(got == Some(value(k)), "key {k} after a reopen");
    }
    db.close().unwrap();
}
