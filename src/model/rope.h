// RoPE's inverse frequencies, the one place both backends take them from (the CPU reference's rope and
// the CUDA backend's uploaded table).
#pragma once
#include <vector>

namespace lilac {

// inv_freq[i] = theta^(−2i/rotary_dim) for i < rotary_dim/2, as Hugging Face computes it (the exponent
// 2i/d in fp32, the power in double, the result rounded to float).
std::vector<float> rope_inv_freq(int rotary_dim, double theta);

}  // namespace lilac
