# `--spec-tokens` on the CLI (speculative decoding with the MTP head, CPU backend): generate gives the
# same ids with and without it on tiny-mtp, with either draft policy (--spec-policy), and says how many
# drafts were accepted; a checkpoint without a head runs without speculation and the log says why; bench
# measures both policies at forced acceptances; a bad policy name is an error naming the option; serve's
# --spec-max-batch.
# Uses golden_cpu.cmake's script mode (-DARGS, -DRC, -DEXPECT, -DSAME_AS).
set(_run "${CMAKE_CURRENT_LIST_DIR}/golden_cpu.cmake")
set(_fx "${LILAC_SHARED_DIR}/fixtures")
add_test(NAME cli_generate_cpu_spec_same_ids
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;20;--backend;cpu-ref;--threads;1;--spec-tokens;3;--spec-policy;fixed"
          "-DSAME_AS=generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;20;--backend;cpu-ref;--threads;1;--spec-tokens;0"
          -DRC=0 "-DEXPECT=speculative decoding: up to 3 MTP drafts per step;speculative \\(fixed\\): [0-9]+ of [0-9]+ steps with drafts, [0-9]+ of [0-9]+ drafts accepted, [0-9.]+ drafts per step"
          -P "${_run}")
add_test(NAME cli_generate_cpu_spec_adaptive_same_ids
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;40;--backend;cpu-ref;--threads;1;--spec-tokens;3"
          "-DSAME_AS=generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;40;--backend;cpu-ref;--threads;1;--spec-tokens;0"
          -DRC=0 "-DEXPECT=speculative \\(adaptive\\): [0-9]+ of 39 steps with drafts, [0-9]+ of [0-9]+ drafts accepted, [0-9.]+ drafts per step"
          -P "${_run}")
add_test(NAME cli_generate_spec_policy_bad_name
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5;--spec-tokens;3;--spec-policy;greedy"
          -DRC=1 "-DEXPECT=--spec-policy: 'greedy' is not a policy \\(adaptive or fixed\\)" -P "${_run}")
add_test(NAME cli_bench_spec_policy_bad_name
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--spec-tokens;2;--spec-policy;adapt"
          -DRC=1 "-DEXPECT=--spec-policy: 'adapt' is not adaptive, fixed or both" -P "${_run}")
add_test(NAME cli_generate_cpu_spec_without_head
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=generate;--model;${_fx}/tiny/mlx4;--prompt-ids;621;--max-tokens;8;--backend;cpu-ref;--threads;1;--spec-tokens;3"
          -DRC=0 "-DEXPECT=speculative decoding off: the checkpoint has no MTP head;generated ids: 1243,2021,215,540,1962,924,75,1676\n"
          -P "${_run}")
add_test(NAME cli_bench_cpu_spec_forced_acceptance
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--threads;1;--prompt-lens;16;--decode-tokens;24;--spec-tokens;2;--draft-accept;1"
          -DRC=0 "-DEXPECT=speculative decoding: at most K = 2 drafts per step, drafts forced right with probability P;\n +16 +1.00 +fixed +[0-9.]+ +[0-9.]+ +[0-9.]+x +2.00 +3.00 +2.00 +[0-9.]+ +[0-9.]+\n +16 +1.00 +adaptive +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+\n"
          -P "${_run}")
add_test(NAME cli_bench_cpu_spec_policies_and_acceptances
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--threads;1;--prompt-lens;16;--decode-tokens;24;--spec-tokens;2;--draft-accept;0,1;--spec-policy;fixed"
          -DRC=0 "-DEXPECT=\n +16 +0.00 +fixed +[0-9.]+ +[0-9.]+ +[0-9.]+x +0.00 +1.00 +2.00 +[0-9.]+ +[0-9.]+\n +16 +1.00 +fixed +[0-9.]+ +[0-9.]+ +[0-9.]+x +2.00 +3.00 +2.00 +[0-9.]+ +[0-9.]+\n"
          -P "${_run}")
add_test(NAME cli_bench_draft_accept_range
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--spec-tokens;2;--draft-accept;0.5,1.5"
          -DRC=1 "-DEXPECT=--draft-accept must be in \\[0, 1\\] \\(got 1.5\\)" -P "${_run}")
add_test(NAME cli_bench_draft_accept_needs_spec_tokens
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--draft-accept;0.5"
          -DRC=1 "-DEXPECT=--draft-accept needs --spec-tokens K > 0" -P "${_run}")
# serve --spec-max-batch N (speculation only while at most N streams decode): listed by --help, at least 1.
add_test(NAME cli_serve_help_spec_max_batch
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac> "-DARGS=serve;--help"
          -DRC=0 "-DEXPECT=--spec-max-batch INT=1 " -P "${_run}")
add_test(NAME cli_serve_spec_max_batch_zero
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=serve;--model;${_fx}/tiny-mtp/mlx4;--port;0;--spec-tokens;2;--spec-max-batch;0"
          -DRC=1 "-DEXPECT=--spec-max-batch must be at least 1" -P "${_run}")
set_tests_properties(cli_serve_help_spec_max_batch cli_serve_spec_max_batch_zero PROPERTIES LABELS cli)
set_tests_properties(cli_generate_cpu_spec_same_ids cli_generate_cpu_spec_adaptive_same_ids cli_generate_spec_policy_bad_name
  cli_generate_cpu_spec_without_head cli_bench_cpu_spec_forced_acceptance cli_bench_cpu_spec_policies_and_acceptances
  cli_bench_draft_accept_range cli_bench_draft_accept_needs_spec_tokens cli_bench_spec_policy_bad_name PROPERTIES LABELS cli)
