// Stable extern "C" entry points of the portable kernel over e4m3 inputs
// (sm_89, sm_90): flash_fwd_e4m3_<out dtype>_d<64|128|256>[_causal], O in f16 or bf16.
// A split launch's partials are merged by the 16-bit sources' combine entries.
// dequantise_e4m3_<out dtype>: e4m3 inputs where no e4m3 entry runs a call, and
// transpose_v_e4m3: V for the Hopper kernel's e4m3 entries (kernel-ffi launches both).
#include "portable_fp8.cuh"

using namespace fa;

FA_E4M3_ENTRIES(__nv_bfloat16, bf16)
FA_E4M3_ENTRIES(__half, f16)
FA_DEQUANTISE_ENTRY(__nv_bfloat16, bf16)
FA_DEQUANTISE_ENTRY(__half, f16)
FA_TRANSPOSE_ENTRY
