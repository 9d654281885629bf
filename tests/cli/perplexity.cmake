# `lilac perplexity` on the demo model (made by the e2e_demo fixture: it has a tokenizer): the windows and counts
# as documented (ctx 16, scored from position 8: 8 tokens a full window), a bad option refused. Its numbers are
# checked against the oracle in tests/engine (PromptScoring.PerplexityIsTheOraclesOnTheFixtures).
set(_demo "${CMAKE_BINARY_DIR}/e2e/demo")
add_test(NAME cli_perplexity_demo
  COMMAND $<TARGET_FILE:lilac> perplexity --model "${_demo}" --backend cpu-ref --threads 2 --ctx 16
          --text "The quick brown fox jumps over the lazy dog. A second sentence follows the first one, and a third one follows it. The fox then sleeps, the dog wakes up, and the two of them walk to the river together.")
set_tests_properties(cli_perplexity_demo PROPERTIES FIXTURES_REQUIRED e2e_demo TIMEOUT 120 LABELS cli
  PASS_REGULAR_EXPRESSION "window at token 16: 8 tokens scored.*perplexity: [0-9.]+ \\+/- [0-9.]+ over [0-9]+ tokens in [0-9]+ windows")
add_test(NAME cli_perplexity_bad_first
  COMMAND $<TARGET_FILE:lilac> perplexity --model "${_demo}" --backend cpu-ref --ctx 16 --first 16 --text "a b c")
set_tests_properties(cli_perplexity_bad_first PROPERTIES FIXTURES_REQUIRED e2e_demo TIMEOUT 60 LABELS cli
  PASS_REGULAR_EXPRESSION "the first scored position must be in \\[1, 15\\]")
