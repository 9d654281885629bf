# End-to-end test of hybrid routing (`lilac serve --upstream`): a router and a "cloud" `lilac serve`
# (scripted backends) with a recording proxy between them, driven by the openai npm client.
add_test(NAME e2e_hybrid_routing
  COMMAND node --test --test-concurrency=1 "${CMAKE_CURRENT_LIST_DIR}/hybrid_routing.test.mjs")
set_tests_properties(e2e_hybrid_routing PROPERTIES
  ENVIRONMENT "LILAC_BINARY=$<TARGET_FILE:lilac>;LILAC_SHARED_DIR=${LILAC_SHARED_DIR};LILAC_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
  TIMEOUT 300 LABELS e2e)
