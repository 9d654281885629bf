# `lilac render-chat` on golden cases: the output must equal the golden rendering byte for byte.
# Included by tests/CMakeLists.txt to register the tests; run with `cmake -P` to do one check.
#
# CMake's string(JSON) re-serialises objects with sorted keys, which would change what the template's
# tojson prints, so the requests are kept here verbatim (in the golden's key order) and checked to be
# equal to the golden's request before use.
set(_rc_request_qwen36_6 [=[{"messages": [{"role": "user", "content": "Weather in Paris for 3 days, metric"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "metric": true}}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}}, "required": ["city"]}}}]}]=])
set(_rc_request_qwen3_9 [=[{"messages": [{"role": "user", "content": "Two cities"}, {"role": "assistant", "content": "Checking.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}, {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]}, {"role": "tool", "content": "cold"}, {"role": "tool", "content": "warm"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}], "add_generation_prompt": true}]=])

if(CMAKE_SCRIPT_MODE_FILE)
  # -DLILAC=<binary> -DMODEL_DIR=<dir with the template> -DGOLDEN=<chat_golden.json> -DCASE=<index>
  # -DREQUEST=<name of the request variable above> -DWORK=<dir>
  file(READ "${GOLDEN}" golden)
  string(JSON golden_request GET "${golden}" cases ${CASE} request)
  string(JSON expected GET "${golden}" cases ${CASE} rendered)
  set(request "${${REQUEST}}")
  string(JSON same EQUAL "${request}" "${golden_request}")
  if(NOT same)
    message(FATAL_ERROR "the request kept in text_render_chat.cmake differs from golden case ${CASE}")
  endif()
  file(MAKE_DIRECTORY "${WORK}")
  set(req_file "${WORK}/request_${CASE}.json")
  file(WRITE "${req_file}" "${request}")
  execute_process(COMMAND "${LILAC}" render-chat --tokenizer "${MODEL_DIR}"
                  INPUT_FILE "${req_file}" OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "lilac render-chat exited with ${rc}: ${err}")
  endif()
  if(NOT out STREQUAL expected)
    file(WRITE "${WORK}/got_${CASE}.txt" "${out}")
    file(WRITE "${WORK}/expected_${CASE}.txt" "${expected}")
    message(FATAL_ERROR "render-chat output differs from golden case ${CASE}; see ${WORK}/got_${CASE}.txt and ${WORK}/expected_${CASE}.txt")
  endif()
  message(STATUS "render-chat case ${CASE}: ${out}")
  return()
endif()

set(_rc_work "${CMAKE_CURRENT_BINARY_DIR}/render_chat")
# Qwen3.6 official template, tool-call round trip (case 6).
add_test(NAME cli_render_chat_qwen36_tools
         COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
                 -DMODEL_DIR=${LILAC_SHARED_DIR}/fixtures/qwen3.6-template
                 -DGOLDEN=${LILAC_SHARED_DIR}/fixtures/qwen3.6-template/chat_golden.json
                 -DCASE=6 -DREQUEST=_rc_request_qwen36_6 -DWORK=${_rc_work} -P ${CMAKE_CURRENT_LIST_DIR}/text_render_chat.cmake)
# Qwen3's template from tokenizer_config.json, two tool calls (one with JSON-string arguments) (case 9).
add_test(NAME cli_render_chat_qwen3_tools
         COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
                 -DMODEL_DIR=${LILAC_SHARED_DIR}/fixtures/qwen3-tokenizer
                 -DGOLDEN=${LILAC_SHARED_DIR}/fixtures/qwen3-tokenizer/chat_golden.json
                 -DCASE=9 -DREQUEST=_rc_request_qwen3_9 -DWORK=${_rc_work} -P ${CMAKE_CURRENT_LIST_DIR}/text_render_chat.cmake)
# A bad request is an input error: exit 1 with a message naming the field.
add_test(NAME cli_render_chat_bad_request
         COMMAND sh -c "echo '{\"messages\": 5}' | \"$1\" render-chat --tokenizer \"$2\" 2>&1; echo rc=$?" _
                 $<TARGET_FILE:lilac> ${LILAC_SHARED_DIR}/fixtures/qwen3.6-template)
set_tests_properties(cli_render_chat_bad_request PROPERTIES
                     PASS_REGULAR_EXPRESSION "lilac: error: \"messages\" must be an array\nrc=1")
set_tests_properties(cli_render_chat_qwen36_tools cli_render_chat_qwen3_tools cli_render_chat_bad_request
                     PROPERTIES LABELS cli)
