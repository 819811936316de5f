//! Generates the device plugin API's bindings (`deviceplugin::pb`) from
//! `proto/deviceplugin/v1beta1/api.proto` with protoc, as k8s-cri generates the CRI's.

fn main() {
    println!("cargo:rerun-if-changed=proto/deviceplugin/v1beta1/api.proto");
    tonic_prost_build::configure()
        .compile_protos(
            &["proto/deviceplugin/v1beta1/api.proto"],
            &["proto/deviceplugin/v1beta1"],
        )
        .expect("compiling the device plugin API (protoc from Debian's protobuf-compiler)");
}
