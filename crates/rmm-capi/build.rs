//! Compiles the C++ shim of the PyTorch hook (`shim/torch_shim.cpp`) into a static library
//! linked into every crate type, and links libstdc++ for its exception machinery.

fn main() {
    println!("cargo:rerun-if-changed=shim/torch_shim.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .file("shim/torch_shim.cpp")
        .compile("rmm_rs_torch_shim");
}
