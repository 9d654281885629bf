# `lilac check-golden --backend cpu` on the tiny fixtures must PASS (exit 0, last line starting with
# PASS, every sequence and generation reported); `lilac generate` reproduces a golden greedy
# continuation and rejects bad input with a message.
# Included by tests/CMakeLists.txt (adds the tests) and run as a `cmake -P` script by each test.
if(CMAKE_SCRIPT_MODE_FILE)
  # -DLILAC=... -DARGS="a;b;c" -DRC=expected exit code -DEXPECT="regex;regex" (all must match the output)
  execute_process(COMMAND "${LILAC}" ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("exit ${rc}\n${out}${err}")
  if(NOT rc EQUAL RC)
    message(FATAL_ERROR "expected exit code ${RC}, got ${rc}")
  endif()
  foreach(re IN LISTS EXPECT)
    if(NOT "${out}${err}" MATCHES "${re}")
      message(FATAL_ERROR "expected the output to match: ${re}")
    endif()
  endforeach()
  return()
endif()

set(_me "${CMAKE_CURRENT_LIST_FILE}")
set(_fx "${LILAC_SHARED_DIR}/fixtures")
foreach(fx tiny tiny2)
  add_test(NAME cli_golden_cpu_${fx}
    COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
            "-DARGS=check-golden;--model;${_fx}/${fx}/mlx4;--golden;${_fx}/${fx}/golden.safetensors;--backend;cpu;--threads;2;--activations"
            -DRC=0 "-DEXPECT=\nPASS [^\n]*\n?$;seq0 ;gen1 [^\n]*tokens identical;activation seq2.layer.3 "
            -P "${_me}")
endforeach()
# gen0 of tiny (golden.safetensors gen0.prompt / gen0.output[:8]): the oracle's greedy continuation.
add_test(NAME cli_generate_cpu_tiny_gen0
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=generate;--model;${_fx}/tiny/mlx4;--prompt-ids;621;--max-tokens;8;--backend;cpu;--temperature;0"
          -DRC=0 "-DEXPECT=generated ids: 1243,2021,215,540,1962,924,75,1676\n;prefill: 1 tokens in ;decode: 7 tokens in "
          -P "${_me}")
add_test(NAME cli_generate_cpu_bad_id
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=generate;--model;${_fx}/tiny/mlx4;--prompt-ids;1,2,99999;--max-tokens;4;--backend;cpu"
          -DRC=1 "-DEXPECT=token id 99999 is outside the vocabulary" -P "${_me}")
add_test(NAME cli_generate_cpu_bad_ids_syntax
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=generate;--model;${_fx}/tiny/mlx4;--prompt-ids;1,x;--backend;cpu"
          -DRC=1 "-DEXPECT='x' is not an integer token id" -P "${_me}")
add_test(NAME cli_check_golden_vocab_mismatch
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=check-golden;--model;${_fx}/tiny2/mlx4;--golden;${_fx}/tiny/golden.safetensors;--backend;cpu"
          -DRC=1 "-DEXPECT=seq0.logits has shape \\[1, 2048\\], expected \\[1, 777\\]" -P "${_me}")
set_tests_properties(cli_golden_cpu_tiny cli_golden_cpu_tiny2 cli_generate_cpu_tiny_gen0 cli_generate_cpu_bad_id cli_generate_cpu_bad_ids_syntax
  cli_check_golden_vocab_mismatch PROPERTIES LABELS cli)
