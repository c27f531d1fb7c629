// Stable extern "C" entry points of the Hopper (sm_90a) forward kernel for bf16.
// Names: flash_fwd_hopper_<dtype>_d<head dim>[_causal]. Split partials are merged
// by flash_combine_<dtype>_d<head dim> from flash_fwd_<dtype>.cu.
#include "flash_fwd_hopper.cuh"

using namespace fa;

#define HOPPER_ENTRY(D, CAUSAL, NAME)                                                                 \
  extern "C" __global__ void __launch_bounds__(HopperConfig<D, CAUSAL>::kThreads, HopperConfig<D, CAUSAL>::kCtasPerSm)                         \
      NAME(const __grid_constant__ HopperParams p) {                                                  \
    flash_fwd_hopper<__nv_bfloat16, D, CAUSAL>(p);                                                          \
  }

HOPPER_ENTRY(64, false, flash_fwd_hopper_bf16_d64)
HOPPER_ENTRY(64, true, flash_fwd_hopper_bf16_d64_causal)
HOPPER_ENTRY(128, false, flash_fwd_hopper_bf16_d128)
HOPPER_ENTRY(128, true, flash_fwd_hopper_bf16_d128_causal)
