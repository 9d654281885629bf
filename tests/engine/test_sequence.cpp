// Sequence, the steppable generation loop: prefill in bounded steps (same result as Generator::run),
// several choices per step (MTP verify) consumed one by one, the constraint hook before every choice,
// cancellation between steps.
#include <gtest/gtest.h>

#include <atomic>

#include "engine/generator.h"
#include "engine/sequence.h"
#include "fake_session.h"
#include "text/tokenizer.h"

namespace {

const lilac::Tokenizer& tokenizer() {
  static std::unique_ptr<lilac::Tokenizer> t =
      lilac::Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer");
  return *t;
}
int32_t im_end() { return *tokenizer().token_id("<|im_end|>"); }

lilac::GenerationRequest request(const std::string& prompt, int64_t max_tokens) {
  lilac::GenerationRequest r;
  r.prompt = tokenizer().encode(prompt, true);
  r.max_tokens = max_tokens;
  r.stop_ids = {im_end()};
  r.boundary_token = im_end();
  return r;
}

const std::string kChat =
    "<|im_start|>system\nYou are a careful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nTell me about rivers, lakes and seas.<|im_end|>\n"
    "<|im_start|>assistant\n";

struct Outcome {
  std::vector<int32_t> ids;
  std::string text;
  lilac::GenerationStats st;
};

lilac::TokenCallback collect(Outcome& r) {
  return [&r](const lilac::GeneratedToken& t) {
    if (t.id >= 0) r.ids.push_back(t.id);
    r.text += t.text;
    return true;
  };
}

Outcome run_alone(lilac::GenerationRequest req, bool drafting = false) {
  Counters c;
  HashSession s(4096, im_end(), &c);
  s.drafting = drafting;
  lilac::Generator g(s, tokenizer(), nullptr);
  Outcome r;
  r.st = g.run(req, collect(r));
  return r;
}

// A run of eos-free tokens: the first prompt (by index) whose continuation has no eos in `n` tokens.
lilac::GenerationRequest long_request(int64_t n) {
  for (int i = 0;; ++i) {
    auto r = request("<|im_start|>user\nitem " + std::to_string(i) + "<|im_end|>\n<|im_start|>assistant\n", n);
    if (run_alone(r).ids.size() == size_t(n)) return r;
  }
}

}  // namespace

TEST(Sequence, SteppedPrefillIsBoundedAndGivesRunsTokens) {
  Counters c;
  HashSession s(4096, im_end(), &c);
  lilac::PrefixCache cache(1 << 20);
  lilac::Generator g(s, tokenizer(), &cache);
  auto req = request(kChat, 20);
  req.prefill_chunk = 5;
  Outcome r;
  auto seq = g.start(req, collect(r));
  int steps = 0;
  int64_t total = 0;
  while (seq->phase() == lilac::Sequence::Phase::Prefill) {
    const size_t calls0 = c.prefill_calls.size();
    const int64_t n = seq->prefill_step();
    int64_t in_calls = 0;
    for (size_t i = calls0; i < c.prefill_calls.size(); ++i) {
      EXPECT_LE(c.prefill_calls[i], 5);
      in_calls += c.prefill_calls[i];
    }
    EXPECT_EQ(n, in_calls);
    EXPECT_GE(n, 1);
    EXPECT_LE(n, 5);
    total += n;
    ++steps;
    if (seq->phase() == lilac::Sequence::Phase::Prefill) EXPECT_TRUE(r.ids.empty());
  }
  EXPECT_EQ(total, int64_t(req.prompt.size()));
  EXPECT_GE(steps, int(req.prompt.size() / 5));
  // The step that completed the prompt also made the first choice.
  EXPECT_EQ(seq->stats().completion_tokens, 1);
  while (!seq->done()) seq->decode_alone();
  EXPECT_EQ(seq->stats().snapshots_taken, 4);  // four <|im_end|> boundaries (the end is inside a short segment)
  EXPECT_EQ(c.decode_steps, seq->stats().completion_tokens - 1);

  auto alone = run_alone(request(kChat, 20));
  EXPECT_EQ(r.ids, alone.ids);
  EXPECT_EQ(r.text, alone.text);
  EXPECT_EQ(seq->stats().finish, alone.st.finish);
  EXPECT_EQ(seq->stats().completion_tokens, alone.st.completion_tokens);
}

TEST(Sequence, SpeculativeStepsConsumeEachChoiceLikeSingleSteps) {
  // Free running, max_tokens in the middle of a verify, and eos: the same tokens, text and counts.
  std::vector<lilac::GenerationRequest> reqs = {long_request(40), long_request(9)};
  for (int i = 0; i < 50; ++i) {  // one that ends at eos
    auto r = request("<|im_start|>user\nq" + std::to_string(i) + "<|im_end|>\n<|im_start|>assistant\n", 200);
    if (run_alone(r).st.stopped_by_eos) {
      reqs.push_back(r);
      break;
    }
  }
  ASSERT_EQ(reqs.size(), 3u);
  for (auto req : reqs) {
    const auto plain = run_alone(req);
    req.draft_tokens = 3;
    Counters c;
    HashSession s(4096, im_end(), &c);
    s.drafting = true;
    lilac::Generator g(s, tokenizer(), nullptr);
    Outcome r;
    r.st = g.run(req, collect(r));
    EXPECT_EQ(r.ids, plain.ids);
    EXPECT_EQ(r.text, plain.text);
    EXPECT_EQ(r.st.finish, plain.st.finish);
    EXPECT_EQ(r.st.completion_tokens, plain.st.completion_tokens);
    EXPECT_GT(c.verifies, 0);
    EXPECT_LT(c.verifies, plain.st.completion_tokens - 1);  // some drafts were accepted
    EXPECT_LE(s.length(), int64_t(req.prompt.size()) + req.max_tokens);
    // The generator's context is exactly what the session holds (the same hash state as a session that prefilled
    // it); a next request does not resume from it, since decode steps and verifies fed most of it.
    ASSERT_EQ(int64_t(g.context().size()), s.length());
    Counters cp;
    HashSession probe(4096, im_end(), &cp);
    probe.prefill(g.context(), nullptr);
    const auto held = std::dynamic_pointer_cast<const HashSnap>(s.snapshot());
    const auto want = std::dynamic_pointer_cast<const HashSnap>(probe.snapshot());
    ASSERT_TRUE(held && want);
    EXPECT_EQ(held->s.h, want->s.h);
    EXPECT_EQ(held->s.len, want->s.len);
    auto next = req;
    next.prompt = g.context();
    next.prompt.push_back(77);
    next.draft_tokens = 0;
    Outcome cont;
    cont.st = g.run(next, collect(cont));
    EXPECT_EQ(cont.st.cached_tokens, 0);
    EXPECT_EQ(cont.ids, run_alone(next).ids);
  }
}

namespace {
// Dictates the tokens 40, 41, 42, ... one per choice.
class Dictate : public lilac::TokenConstraint {
 public:
  const uint32_t* allowed() override {
    bits.assign(2048 / 32, 0u);
    const int32_t t = 40 + int32_t(accepted.size());
    bits[size_t(t) / 32] |= 1u << (t % 32);
    ++asked;
    return bits.data();
  }
  void accept(int32_t token) override { accepted.push_back(token); }
  std::vector<uint32_t> bits;
  std::vector<int32_t> accepted;
  int asked = 0;
};
}  // namespace

TEST(Sequence, ConstraintMasksEveryChoiceAndDisablesSpeculation) {
  Counters c;
  HashSession s(4096, im_end(), &c);
  s.mask_vocab = 2048;
  s.drafting = true;
  lilac::Generator g(s, tokenizer(), nullptr);
  auto req = request(kChat, 6);
  auto con = std::make_shared<Dictate>();
  req.constraint = con;
  req.draft_tokens = 4;
  Outcome r;
  r.st = g.run(req, collect(r));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{40, 41, 42, 43, 44, 45}));
  EXPECT_EQ(con->accepted, r.ids);
  EXPECT_EQ(con->asked, 6);
  EXPECT_EQ(c.masks, 6);
  EXPECT_EQ(c.drafts, 0);
  EXPECT_EQ(c.verifies, 0);
}

TEST(Sequence, CancellationBetweenStepsEndsTheSequence) {
  Counters c;
  HashSession s(4096, im_end(), &c);
  lilac::Generator g(s, tokenizer(), nullptr);
  std::atomic<bool> cancel{false};
  auto req = request(kChat, 20);
  req.prefill_chunk = 4;
  Outcome r;
  auto seq = g.start(req, collect(r), &cancel);
  EXPECT_EQ(seq->prefill_step(), 4);
  cancel = true;
  const int64_t before = c.prefilled;
  EXPECT_EQ(seq->prefill_step(), 0);  // stops paying at the next step
  EXPECT_TRUE(seq->done());
  EXPECT_EQ(c.prefilled, before);
  EXPECT_EQ(seq->stats().finish, lilac::FinishReason::Cancelled);
  EXPECT_TRUE(r.ids.empty());
  // A cancelled prefill leaves no reusable context.
  EXPECT_EQ(g.reusable_prefix(req), 0);

  // During decode: prepare_step() refuses the next step.
  cancel = false;
  Outcome r2;
  auto seq2 = g.start(request(kChat, 20), collect(r2), &cancel);
  while (seq2->phase() == lilac::Sequence::Phase::Prefill) seq2->prefill_step();
  ASSERT_EQ(seq2->phase(), lilac::Sequence::Phase::Decode);
  const int64_t steps = c.decode_steps;
  cancel = true;
  EXPECT_FALSE(seq2->prepare_step());
  EXPECT_TRUE(seq2->done());
  EXPECT_EQ(c.decode_steps, steps);
  EXPECT_EQ(seq2->stats().finish, lilac::FinishReason::Cancelled);
  EXPECT_EQ(r2.ids.size(), 1u);
  // The context is intact (the first choice was never fed): the next request resumes from it where that is an exact
  // resume point — with one-token pieces every position is one; with the default pieces the prompt's end (inside
  // the segment after the last <|im_end|>) is not.
  auto next = request(kChat, 3);
  next.prompt.push_back(r2.ids[0]);
  next.prompt.push_back(99);
  EXPECT_EQ(g.reusable_prefix(next), 0);
  next.prefill_chunk = 1;
  EXPECT_EQ(g.reusable_prefix(next), int64_t(request(kChat, 3).prompt.size()));
}
