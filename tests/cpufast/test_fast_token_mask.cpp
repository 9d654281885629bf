// The fast CPU backend's Session::set_token_mask: the same check as the reference's (tests/cpu/token_mask_check.h).
#include <gtest/gtest.h>

#include <string>

#include "../cpu/token_mask_check.h"
#include "cpufast/fast_backend.h"
#include "model/weights.h"

using namespace lilac;

TEST(FastTokenMask, RestrictsTheNextChoiceOnly) {
  auto w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4", LoadOptions{.progress = false});
  auto be = cpufast::make_fast_cpu_backend(w);
  test::expect_mask_restricts_next_choice_only(*be);
}
