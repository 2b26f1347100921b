//! What the engine's tests share: a MinIO server to run against (`minio`), an object
//! store that fails on request (`flaky`), a compaction worker in the process (`worker`) and loopback
//! ports for servers (`port`, also used by the server's, the CLI's and the Redis
//! gateway's tests).
#![allow(dead_code)]

pub mod flaky;
pub mod minio;
mod port;
pub mod worker;
pub use port::free_port;

/// The numbers of the tables `store` holds, ascending.
pub fn table_numbers(store: &dyn phoenix_engine::TableStore) -> Vec<u64> {
    let mut t: Vec<u64> = store
        .list()
        .expect("listing the store")
        .into_iter()
        .filter_map(|f| match f {
            phoenix_engine::StoredFile::Table(n) => Some(n),
            _ => None,
        })
        .collect();
    t.sort_unstable();
    t
}
