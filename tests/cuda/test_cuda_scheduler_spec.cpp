// Speculative decoding under continuous batching on the CUDA backend and tiny-mtp (the server's scheduler
// with --spec-tokens and --spec-max-batch; tests/support/scheduler_spec.h says what is checked). On tiny-mtp
// the batch steps session by session (its rows step is not bitwise the single step there); the rows step
// feeding the heads is checked by CudaMtp.RowsBatchedStepsFeedTheMtpHeadAtRealWidth. Skips without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "cuda/cuda_backend.h"
#include "gpu_test.h"
#include "model/weights.h"
#include "support/scheduler_spec.h"

using namespace lilac;

namespace {

std::shared_ptr<Backend> tiny_mtp_cuda() {
  static auto w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny-mtp/mlx4", LoadOptions{.progress = false});
  return std::shared_ptr<Backend>(cuda::make_cuda_backend(w));
}

}  // namespace

TEST(CudaSchedulerSpec, DraftingIsSuppressedAboveSpecMaxBatchAndResumes) {
  NEED_GPU();
  testutil::schedspec::expect_suppressed_above_spec_max_batch_and_resumed(tiny_mtp_cuda());
}

TEST(CudaSchedulerSpec, AtOrBelowSpecMaxBatchEveryStreamDrafts) {
  NEED_GPU();
  testutil::schedspec::expect_every_stream_drafts_at_or_below_spec_max_batch(tiny_mtp_cuda());
}
