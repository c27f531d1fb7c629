// Stable extern "C" entry points of the sm_80+ forward kernel for f16.
// Names: flash_fwd_<dtype>_d<head dim>[_causal|_local][_softcap][_m64|_kg2],
// flash_fwd_varlen_<dtype>_d<head dim>[_causal], flash_combine[_varlen]_<dtype>_d<head dim>.
#include "combine.cuh"
#include "flash_fwd.cuh"

using namespace fa;

FA_FWD_ENTRIES(__half, f16)
FA_VARLEN_ENTRIES(__half, f16)

// Launched with 128 threads: four rows per block.
extern "C" __global__ void __launch_bounds__(128) flash_combine_f16_d64(const CombineParams p) {
  flash_combine<__half, 64>(p);
}
extern "C" __global__ void __launch_bounds__(128) flash_combine_f16_d128(const CombineParams p) {
  flash_combine<__half, 128>(p);
}
extern "C" __global__ void __launch_bounds__(128) flash_combine_f16_d256(const CombineParams p) {
  flash_combine<__half, 256>(p);
}
extern "C" __global__ void __launch_bounds__(128) flash_combine_varlen_f16_d64(const CombineParams p) {
  flash_combine<__half, 64, true>(p);
}
extern "C" __global__ void __launch_bounds__(128) flash_combine_varlen_f16_d128(const CombineParams p) {
  flash_combine<__half, 128, true>(p);
}
