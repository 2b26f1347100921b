//! Generates the protobuf messages and tonic services from `proto/*.proto`.
//!
//! The `.proto` files are parsed by `protox`, a protobuf compiler written in Rust, and
//! its file descriptor set is handed to tonic's code generator. The build therefore
//! needs no `protoc` on the machine, and `PROTOC` is never read: the same compiler is
//! used everywhere, so every machine generates the same code. (A vendored `protoc`
//! binary was the other choice; it exists only for some host platforms and would have
//! made the build depend on which `protoc` the environment happened to offer.)

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/common.proto",
        "proto/kv.proto",
        "proto/meta.proto",
        "proto/raft.proto",
        "proto/internal.proto",
        "proto/faults.proto",
        "proto/compactor.proto",
        "proto/backup.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    // Source info is kept so the generated code carries the `.proto` comments as docs.
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().bytes(".").compile_fds(fds)?;
    Ok(())
}
