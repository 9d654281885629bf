# End-to-end test of hybrid routing (`lilac serve --upstream`): a router and a "cloud" `lilac serve`
# (scripted backends) with a recording proxy between them, driven by the openai npm client.
add_test(NAME e2e_hybrid_routing
  COMMAND node --test --test-concurrency=1 "${CMAKE_CURRENT_LIST_DIR}/hybrid_routing.test.mjs")
set_tests_properties(e2e_hybrid_routing PROPERTIES
  ENVIRONMENT "LILAC_BINARY=$<TARGET_FILE:lilac>;LILAC_SHARED_DIR=${LILAC_SHARED_DIR};LILAC_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
  TIMEOUT 300 LABELS e2e)

# Bad hybrid options: exit 1 with a message naming the problem (before anything is served).
set(_hyb_dir "${CMAKE_BINARY_DIR}/e2e/hybrid_cli")
set(_hyb_setup "mkdir -p '${_hyb_dir}' && cp '${LILAC_SHARED_DIR}/fixtures/qwen3-tokenizer/tokenizer.json' '${LILAC_SHARED_DIR}/fixtures/qwen3-tokenizer/tokenizer_config.json' '${LILAC_SHARED_DIR}/fixtures/qwen3.6-template/chat_template.jinja' '${_hyb_dir}/' && echo '{\"default\":{\"reply\":\"hi\"}}' > '${_hyb_dir}/s.json' && echo '{\"defualt_route\":\"local\"}' > '${_hyb_dir}/bad.json'")
set(_hyb_serve "\"$0\" serve --model '${_hyb_dir}' --backend 'scripted:${_hyb_dir}/s.json' --port 0")
foreach(case
    "policy_typo|--upstream http://127.0.0.1:9 --route-policy '${_hyb_dir}/bad.json'|unknown key 'defualt_route'"
    "policy_without_upstream|--route-policy '${_hyb_dir}/bad.json'|need --upstream URL"
    "bad_scheme|--upstream ftp://example.org|unsupported scheme 'ftp'"
    "missing_policy|--upstream http://127.0.0.1:9 --route-policy '${_hyb_dir}/nope.json'|cannot read the route policy file")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 name)
  list(GET parts 1 args)
  list(GET parts 2 expect)
  add_test(NAME cli_hybrid_${name}
    COMMAND bash -c "${_hyb_setup} && out=$(${_hyb_serve} ${args} 2>&1); rc=$?; echo \"$out\"; [ $rc -eq 1 ] && grep -qF \"${expect}\" <<<\"$out\""
            $<TARGET_FILE:lilac>)
  set_tests_properties(cli_hybrid_${name} PROPERTIES TIMEOUT 60 LABELS cli)
endforeach()
