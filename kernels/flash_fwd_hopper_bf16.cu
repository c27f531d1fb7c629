// Stable extern "C" entry points of the Hopper (sm_90a) forward kernel for bf16.
// Names: flash_fwd_hopper_<dtype>_d<head dim>[_causal][_m64] (_m64: 64-row CTAs).
// Split partials are merged by flash_combine_<dtype>_d<head dim> from flash_fwd_<dtype>.cu.
#include "flash_fwd_hopper.cuh"

FA_HOPPER_ENTRY(__nv_bfloat16, 64, false, 64, flash_fwd_hopper_bf16_d64_m64)
FA_HOPPER_ENTRY(__nv_bfloat16, 64, true, 64, flash_fwd_hopper_bf16_d64_causal_m64)
FA_HOPPER_ENTRY(__nv_bfloat16, 128, false, 128, flash_fwd_hopper_bf16_d128)
FA_HOPPER_ENTRY(__nv_bfloat16, 128, false, 64, flash_fwd_hopper_bf16_d128_m64)
FA_HOPPER_ENTRY(__nv_bfloat16, 128, true, 128, flash_fwd_hopper_bf16_d128_causal)
