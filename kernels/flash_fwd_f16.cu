// Stable extern "C" entry points of the sm_80+ forward kernel for f16.
// Names: flash_fwd_<dtype>_d<head dim>[_causal|_local][_softcap][_m64|_kg2],
// flash_fwd_varlen_<dtype>_d<head dim>[_causal|_local][_softcap], flash_combine[_varlen]_<dtype>_d<head dim>.
#include "combine.cuh"
#include "flash_fwd.cuh"

using namespace fa;

FA_FWD_ENTRIES(__half, f16)
FA_VARLEN_ENTRIES(__half, f16)

FA_COMBINE_ENTRIES(__half, f16)
