//! What the engine's tests share: a MinIO server to run against (`minio`).
#![allow(dead_code)]

pub mod minio;
