//! Compiles proto/k8s.proto (the built-in kinds' wire schema, written by scripts/gen-k8s-proto.py) with protox into
//! a FileDescriptorSet that the protobuf codec loads at run time: no generated Rust, no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let file = root.join("k8s.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::Compiler::new([&root])?
        .include_imports(true)
        .open_file(&file)?
        .encode_file_descriptor_set();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("k8s.bin");
    std::fs::write(out, descriptors)?;
    Ok(())
}
