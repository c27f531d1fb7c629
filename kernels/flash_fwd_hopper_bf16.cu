// Stable extern "C" entry points of the Hopper (sm_90a) forward kernel for bf16.
// Names: flash_fwd_hopper_<dtype>_d<head dim>[_causal|_local][_softcap][_m64] (_m64: 64-row CTAs),
// flash_fwd_hopper_varlen_<dtype>_d<head dim>[_causal|_local][_softcap] (serving calls).
// Split partials are merged by flash_combine_<dtype>_d<head dim> from flash_fwd_<dtype>.cu.
#include "flash_fwd_hopper.cuh"

FA_HOPPER_ENTRIES(__nv_bfloat16, bf16)
