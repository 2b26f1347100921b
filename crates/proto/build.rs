//! Generates the protobuf messages and tonic services from `proto/*.proto`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/common.proto",
        "proto/kv.proto",
        "proto/meta.proto",
        "proto/raft.proto",
        "proto/internal.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
