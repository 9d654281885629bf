# `lilac check-golden --backend cpu-ref` (the exact fp32 reference) on the tiny fixtures must PASS (exit 0,
# last line starting with PASS, every sequence and generation reported); `lilac generate` reproduces a
# golden greedy continuation and rejects bad input with a message. The fast CPU path (--backend cpu)
# must PASS the reduced-precision thresholds, with its best kernels and with the portable ones.
# Included by tests/CMakeLists.txt (adds the tests) and run as a `cmake -P` script by each test.
if(CMAKE_SCRIPT_MODE_FILE)
  # -DLILAC=... -DARGS="a;b;c" -DRC=expected exit code -DEXPECT="regex;regex" (all must match the output)
  # [-DTOKDIR=dir -DMODEL=mlx4 dir -DTOK=tokenizer dir]: first make a model folder with a tokenizer (links).
  # [-DSAME_AS="a;b;c"]: the "generated ids" line must equal that of this other command.
  # [-DEOSDIR=dir -DMODEL=mlx4 dir -DEOS=id]: first make a model folder whose end-of-turn id is EOS.
  if(DEFINED TOKDIR)
    file(REMOVE_RECURSE "${TOKDIR}")
    file(MAKE_DIRECTORY "${TOKDIR}")
    foreach(f config.json model.safetensors)
      file(CREATE_LINK "${MODEL}/${f}" "${TOKDIR}/${f}" SYMBOLIC)
    endforeach()
    foreach(f tokenizer.json tokenizer_config.json)
      file(CREATE_LINK "${TOK}/${f}" "${TOKDIR}/${f}" SYMBOLIC)
    endforeach()
  endif()
  if(DEFINED EOSDIR)
    file(REMOVE_RECURSE "${EOSDIR}")
    file(MAKE_DIRECTORY "${EOSDIR}")
    foreach(f config.json model.safetensors)
      file(CREATE_LINK "${MODEL}/${f}" "${EOSDIR}/${f}" SYMBOLIC)
    endforeach()
    file(WRITE "${EOSDIR}/generation_config.json" "{\"eos_token_id\": [${EOS}]}\n")
  endif()
  if(DEFINED SAME_AS)
    execute_process(COMMAND "${LILAC}" ${SAME_AS} RESULT_VARIABLE rc2 OUTPUT_VARIABLE out2 ERROR_VARIABLE err2)
    string(REGEX MATCH "generated ids:[^\n]*" want "${out2}")
    if(NOT rc2 EQUAL 0 OR want STREQUAL "")
      message(FATAL_ERROR "reference command failed (${rc2}):\n${out2}${err2}")
    endif()
    list(APPEND EXPECT "${want}\n")
  endif()
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
  lilac_cli_test(cli_golden_cpu_${fx} "check-golden;--model;${_fx}/${fx}/mlx4;--golden;${_fx}/${fx}/golden.safetensors;--backend;cpu-ref;--threads;2;--activations"
    0 "\nPASS [^\n]*\n?$;seq0 ;gen1 [^\n]*tokens identical;activation seq2.layer.3 ")
endforeach()
foreach(fx tiny tiny2)
  foreach(isa auto scalar)
    add_test(NAME cli_golden_cpufast_${fx}_${isa}
      COMMAND ${CMAKE_COMMAND} -E env LILAC_CPU_ISA=${isa} ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
              "-DARGS=check-golden;--model;${_fx}/${fx}/mlx4;--golden;${_fx}/${fx}/golden.safetensors;--backend;cpu;--threads;2;--activations"
              -DRC=0 "-DEXPECT=\nPASS [^\n]*backend cpu\\)\n;thresholds \\(reduced precision\\);activation seq2.layer.3 ;cpu backend: [a-z0-9-]+ kernels \\(CPU features: "
              -P "${_me}")
    set_tests_properties(cli_golden_cpufast_${fx}_${isa} PROPERTIES LABELS cli)
  endforeach()
endforeach()
# tiny-mtp: the MTP head's rows and the speculative generations are reported and checked.
lilac_cli_test(cli_golden_cpu_tiny-mtp "check-golden;--model;${_fx}/tiny-mtp/mlx4;--golden;${_fx}/tiny-mtp/golden.safetensors;--backend;cpu-ref;--threads;2"
  0 "\nPASS [^\n]*MTP head checked[^\n]*\n?$;seq3 +MTP rows 150/150: max.dlogit. [0-9.e-]+;gen1 +speculative \\(k=3\\): identical to plain greedy; 23 rounds")
# gen0 of tiny (golden.safetensors gen0.prompt / gen0.output[:8]): the oracle's greedy continuation.
lilac_cli_test(cli_generate_cpu_tiny_gen0 "generate;--model;${_fx}/tiny/mlx4;--prompt-ids;621;--max-tokens;8;--backend;cpu-ref;--temperature;0"
  0 "generated ids: 1243,2021,215,540,1962,924,75,1676\n;prefill: 1 tokens in ;decode: 7 tokens in ")
# The same with 215 (the third token) as the end-of-turn id: generation stops there and says so (the
# id is listed); --ignore-eos goes on to --max-tokens.
add_test(NAME cli_generate_cpu_tiny_eos
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac> -DEOSDIR=${CMAKE_CURRENT_BINARY_DIR}/cli_generate_eos
          -DMODEL=${_fx}/tiny/mlx4 -DEOS=215
          "-DARGS=generate;--model;${CMAKE_CURRENT_BINARY_DIR}/cli_generate_eos;--prompt-ids;621;--max-tokens;8;--backend;cpu;--temperature;0"
          -DRC=0 "-DEXPECT=generated ids: 1243,2021,215\n;decode: 2 tokens in ;stopped at end-of-turn token 215\n" -P "${_me}")
add_test(NAME cli_generate_cpu_tiny_ignore_eos
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac> -DEOSDIR=${CMAKE_CURRENT_BINARY_DIR}/cli_generate_eos2
          -DMODEL=${_fx}/tiny/mlx4 -DEOS=215
          "-DARGS=generate;--model;${CMAKE_CURRENT_BINARY_DIR}/cli_generate_eos2;--prompt-ids;621;--max-tokens;8;--backend;cpu;--temperature;0;--ignore-eos"
          -DRC=0 "-DEXPECT=generated ids: 1243,2021,215,540,1962,924,75,1676\n" -P "${_me}")
lilac_cli_test(cli_generate_cpu_bad_id "generate;--model;${_fx}/tiny/mlx4;--prompt-ids;1,2,99999;--max-tokens;4;--backend;cpu-ref"
  1 "token id 99999 is outside the vocabulary")
lilac_cli_test(cli_generate_cpu_bad_ids_syntax "generate;--model;${_fx}/tiny/mlx4;--prompt-ids;1,x;--backend;cpu-ref"
  1 "'x' is not an integer token id")
lilac_cli_test(cli_check_golden_vocab_mismatch "check-golden;--model;${_fx}/tiny2/mlx4;--golden;${_fx}/tiny/golden.safetensors;--backend;cpu-ref"
  1 "seq0.logits has shape \\[1, 2048\\], expected \\[1, 777\\]")
# Text prompts through the model folder's tokenizer (tiny's weights + the Qwen3 tokenizer: digits are
# byte tokens 15..24, inside tiny's vocabulary): --prompt gives what --prompt-ids of the same ids gives;
# --chat renders the template, whose <|im_start|> id is outside tiny's vocabulary: a clear error.
set(_tokdir "${CMAKE_CURRENT_BINARY_DIR}/cli_generate_tokmodel")
add_test(NAME cli_generate_cpu_text_prompt
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac> -DTOKDIR=${_tokdir} -DMODEL=${_fx}/tiny/mlx4
          -DTOK=${_fx}/qwen3-tokenizer
          "-DARGS=generate;--model;${_tokdir};--prompt;12345;--max-tokens;6;--backend;cpu-ref;--temperature;0"
          "-DSAME_AS=generate;--model;${_fx}/tiny/mlx4;--prompt-ids;16,17,18,19,20;--max-tokens;6;--backend;cpu-ref;--temperature;0"
          -DRC=0 "-DEXPECT=prompt 5 tokens" -P "${_me}")
add_test(NAME cli_generate_cpu_chat_out_of_vocab
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac> -DTOKDIR=${_tokdir}_chat -DMODEL=${_fx}/tiny/mlx4
          -DTOK=${_fx}/qwen3-tokenizer
          "-DARGS=generate;--model;${_tokdir}_chat;--chat;hi;--max-tokens;4;--backend;cpu-ref"
          -DRC=1 "-DEXPECT=token id 151644 is outside the vocabulary \\(size 2048\\)" -P "${_me}")
lilac_cli_test(cli_generate_cpu_text_needs_tokenizer "generate;--model;${_fx}/tiny/mlx4;--prompt;hello;--backend;cpu-ref"
  1 "no tokenizer.json")
set_tests_properties(cli_generate_cpu_text_prompt cli_generate_cpu_chat_out_of_vocab PROPERTIES LABELS cli)
set_tests_properties(cli_generate_cpu_tiny_eos cli_generate_cpu_tiny_ignore_eos PROPERTIES LABELS cli)
