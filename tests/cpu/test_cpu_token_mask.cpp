// CpuSession::set_token_mask (the reference backend): token_mask_check.h.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "model/weights.h"
#include "token_mask_check.h"

using namespace lilac;

namespace {

std::shared_ptr<const ModelWeights> tiny() {
  static auto w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4", LoadOptions{.progress = false});
  return w;
}

}  // namespace

TEST(CpuTokenMask, RestrictsTheNextChoiceOnly) {
  auto be = make_cpu_backend(tiny(), 2);
  test::expect_mask_restricts_next_choice_only(*be);
}
