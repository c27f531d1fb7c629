//! What the integration tests share: a checkout of one tiny kernel.

use std::path::Path;

/// `dir/kernels` with one source and a manifest building it for sm_89.
pub fn one_kernel_checkout(dir: &Path) {
    let kernels = dir.join("kernels");
    std::fs::create_dir_all(&kernels).unwrap();
    std::fs::write(kernels.join("one.cu"), "extern \"C\" __global__ void one() {}\n").unwrap();
    std::fs::write(
        kernels.join("manifest.json"),
        r#"{"static_smem_limit": 49152,
            "archs": {"sm_89": {"gencode": "arch=compute_89,code=sm_89", "smem_optin_limit": 101376}},
            "sources": [{"file": "one.cu", "archs": ["sm_89"], "kernels": [{"entry": "one", "max_registers": 255}]}]}"#,
    )
    .unwrap();
}
