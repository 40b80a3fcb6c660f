//! Compiles `proto/leasefence/v1/*.proto` with a vendored `protoc`, so the
//! default build needs nothing beyond cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let file = root.join("leasefence/v1/leases.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    tonic_prost_build::configure().compile_protos(&[file], &[root])?;
    Ok(())
}
