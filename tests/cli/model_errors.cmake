# `lilac convert` on bad input: non-zero exit and a message naming the file / field.
# This file is both included by tests/CMakeLists.txt (adds the tests) and run as a `cmake -P` script
# by each test (runs lilac, checks the exit code and the message).
if(CMAKE_SCRIPT_MODE_FILE)
  # -DLILAC=... -DARGS="a;b;c" -DEXPECT=substring [-DBAD_TYPE_DIR=dir -DSRC=fixture_dir]
  if(DEFINED BAD_TYPE_DIR)
    # A model folder whose config.json names another model type.
    file(REMOVE_RECURSE "${BAD_TYPE_DIR}")
    file(MAKE_DIRECTORY "${BAD_TYPE_DIR}")
    file(READ "${SRC}/config.json" cfg)
    string(REPLACE "\"qwen3_5_moe_text\"" "\"llama\"" cfg "${cfg}")
    file(WRITE "${BAD_TYPE_DIR}/config.json" "${cfg}")
    file(COPY "${SRC}/model.safetensors" DESTINATION "${BAD_TYPE_DIR}")
  endif()
  execute_process(COMMAND "${LILAC}" ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("exit ${rc}\n${out}${err}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit")
  endif()
  string(FIND "${out}${err}" "${EXPECT}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "expected the message to contain: ${EXPECT}")
  endif()
  if(DEFINED BAD_TYPE_DIR)
    file(REMOVE_RECURSE "${BAD_TYPE_DIR}")
  endif()
  return()
endif()

set(_me "${CMAKE_CURRENT_LIST_FILE}")
set(_tiny "${LILAC_SHARED_DIR}/fixtures/tiny/mlx4")
add_test(NAME cli_model_convert_missing_dir
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac> "-DARGS=convert;--model;/nonexistent/model;--out;/tmp/lilac_never"
          "-DEXPECT=missing /nonexistent/model/config.json" -P "${_me}")
add_test(NAME cli_model_convert_into_itself
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac> "-DARGS=convert;--model;${_tiny};--out;${_tiny}"
          "-DEXPECT=is the model folder itself" -P "${_me}")
add_test(NAME cli_model_convert_bad_model_type
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=convert;--model;${CMAKE_CURRENT_BINARY_DIR}/cli_model_bad_type;--out;${CMAKE_CURRENT_BINARY_DIR}/cli_model_bad_type_out"
          "-DEXPECT=config.json: field 'text_config.model_type' = 'llama' is not supported"
          -DBAD_TYPE_DIR=${CMAKE_CURRENT_BINARY_DIR}/cli_model_bad_type -DSRC=${_tiny} -P "${_me}")
add_test(NAME cli_model_convert_needs_out
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac> "-DARGS=convert;--model;${_tiny}" "-DEXPECT=--out is required" -P "${_me}")
set_tests_properties(cli_model_convert_missing_dir cli_model_convert_into_itself cli_model_convert_bad_model_type
  cli_model_convert_needs_out PROPERTIES LABELS cli)
