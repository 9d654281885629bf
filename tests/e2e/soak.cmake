# The short soak (issue 13): bench/soak.mjs drives `lilac serve` (demo model, CPU) with 16 concurrent
# clients of mixed valid, hostile and abandoned requests, then the same with the hybrid router in front
# of a fake upstream; RSS must not grow (the halves' medians) nor pass 1 GiB, no request may get an
# answer it must not get, and the server must stop cleanly on SIGTERM. The 30-minute run is recorded in
# bench/BENCHMARKS.md.
add_test(NAME soak_short
  COMMAND bash -c "node \"$0/bench/soak.mjs\" --model \"$1\" --lilac \"$2\" --duration-s 45 && node \"$0/bench/soak.mjs\" --model \"$1\" --lilac \"$2\" --duration-s 30 --hybrid"
          "${CMAKE_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/e2e/demo" $<TARGET_FILE:lilac>)
set_tests_properties(soak_short PROPERTIES FIXTURES_REQUIRED e2e_demo TIMEOUT 400 LABELS e2e)
