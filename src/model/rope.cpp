#include "model/rope.h"

#include <cmath>

namespace lilac {

std::vector<float> rope_inv_freq(int rotary_dim, double theta) {
  std::vector<float> f(static_cast<size_t>(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const float e = float(2 * i) / float(rotary_dim);
    f[size_t(i)] = float(1.0 / std::pow(theta, double(e)));
  }
  return f;
}

}  // namespace lilac
