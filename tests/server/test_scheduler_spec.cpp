// Speculative decoding under continuous batching on the CPU reference backend and tiny-mtp
// (tests/support/scheduler_spec.h says what is checked).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "cpu/cpu_backend.h"
#include "model/weights.h"
#include "support/scheduler_spec.h"

using namespace lilac;

namespace {

std::shared_ptr<Backend> tiny_mtp_backend() {
  static auto w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny-mtp/mlx4", LoadOptions{.progress = false});
  return std::shared_ptr<Backend>(make_cpu_backend(w, 2));
}

}  // namespace

// spec_max_batch 1 (the default): while two or three streams decode, none drafts; the long stream drafts
// when it decodes alone (its first step, before the others finished their prefill, and after they end), at
// every acceptance length (fixed policy); every stream's tokens and logprobs are its own plain ones.
TEST(SchedulerSpec, DraftingIsSuppressedAboveSpecMaxBatchAndResumes) {
  testutil::schedspec::expect_suppressed_above_spec_max_batch_and_resumed(tiny_mtp_backend());
}

// spec_max_batch 3: every stream's policy decides as when alone; all three draft (each verifies on its own),
// none is suppressed, and the tokens are still each stream's plain ones.
TEST(SchedulerSpec, AtOrBelowSpecMaxBatchEveryStreamDrafts) {
  testutil::schedspec::expect_every_stream_drafts_at_or_below_spec_max_batch(tiny_mtp_backend());
}
