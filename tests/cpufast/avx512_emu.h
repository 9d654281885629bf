// The avx512-vnni kernel set's float arithmetic emulated in portable C++ (tests only): every product
// and sum in the order and with the roundings kernels_avx512.cpp performs them (fused multiply-adds as
// std::fma, the 16-lane accumulators and _mm512_reduce_add_ps's tree), on the scalar set's packed
// layout (8 rows per tile; a row's result does not depend on the tile height). Its results equal the
// real set's bit for bit (checked on machines that run avx512-vnni), so the AVX-512 path's accuracy is
// testable on any x86-64 or ARM64 machine.
#pragma once
#include "cpufast/kernels.h"

namespace lilac::cpufast::emu {

const KernelSet& avx512_emulated();

}  // namespace lilac::cpufast::emu
