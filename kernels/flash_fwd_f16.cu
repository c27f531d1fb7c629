// Stable extern "C" entry points of the sm_80+ forward kernel for f16.
// Names: flash_fwd_<dtype>_d<head dim>[_causal][_m64], flash_combine_<dtype>_d<head dim>.
#include "flash_fwd.cuh"

using namespace fa;

// Non-causal: two 16-row tiles per warp, or one (`_m64`, for problems that would
// not fill the GPU); causal: one.
FA_FWD_ENTRY(__half, 64, false, 2, flash_fwd_f16_d64)
FA_FWD_ENTRY(__half, 64, false, 1, flash_fwd_f16_d64_m64)
FA_FWD_ENTRY(__half, 64, true, 1, flash_fwd_f16_d64_causal)
FA_FWD_ENTRY(__half, 128, false, 2, flash_fwd_f16_d128)
FA_FWD_ENTRY(__half, 128, false, 1, flash_fwd_f16_d128_m64)
FA_FWD_ENTRY(__half, 128, true, 1, flash_fwd_f16_d128_causal)

// Launched with 128 threads: four rows per block.
extern "C" __global__ void __launch_bounds__(128) flash_combine_f16_d64(const CombineParams p) {
  flash_combine<__half, 64>(p);
}
extern "C" __global__ void __launch_bounds__(128) flash_combine_f16_d128(const CombineParams p) {
  flash_combine<__half, 128>(p);
}
