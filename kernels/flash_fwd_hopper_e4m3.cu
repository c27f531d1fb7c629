// Stable extern "C" entry points of the Hopper (sm_90a) forward kernel over e4m3
// inputs: flash_fwd_hopper_e4m3_<out dtype>_d<128|256>[_causal], O in f16 or
// bf16. V comes transposed by transpose_v_e4m3 (flash_fwd_e4m3.cu); split
// partials are merged by the 16-bit sources' combine entries.
#include "flash_fwd_hopper.cuh"

FA_HOPPER_E4M3_ENTRIES(__nv_bfloat16, bf16)
FA_HOPPER_E4M3_ENTRIES(__half, f16)
