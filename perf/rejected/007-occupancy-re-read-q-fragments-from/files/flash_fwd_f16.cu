// Stable extern "C" entry points of the sm_80+ forward kernel for f16.
// Names: flash_fwd_<dtype>_d<head dim>[_causal], flash_combine_<dtype>_d<head dim>.
#include "flash_fwd.cuh"

using namespace fa;

#define FWD_ENTRY(D, CAUSAL, NAME)                                                         \
  extern "C" __global__ void __launch_bounds__(FwdConfig<D>::kThreads, FwdConfig<D>::kMinBlocks) NAME(const FlashParams p) { \
    flash_fwd<__half, D, CAUSAL>(p);                                                           \
  }

FWD_ENTRY(64, false, flash_fwd_f16_d64)
FWD_ENTRY(64, true, flash_fwd_f16_d64_causal)
FWD_ENTRY(128, false, flash_fwd_f16_d128)
FWD_ENTRY(128, true, flash_fwd_f16_d128_causal)

// Launched with 128 threads: four rows per block.
extern "C" __global__ void __launch_bounds__(128) flash_combine_f16_d64(const CombineParams p) {
  flash_combine<__half, 64>(p);
}
extern "C" __global__ void __launch_bounds__(128) flash_combine_f16_d128(const CombineParams p) {
  flash_combine<__half, 128>(p);
}
