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
