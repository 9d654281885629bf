# `lilac bench --batch` (batched decoding through Backend::decode_batch) on the CPU backend with the tiny
# fixture: one table row per batch size with its step time, aggregate and per-stream tok/s; bad lists
# are rejected before the model loads. (Run by golden_cpu.cmake's script mode.)
set(_fx "${LILAC_SHARED_DIR}/fixtures")
set(_runner "${CMAKE_CURRENT_LIST_DIR}/golden_cpu.cmake")
add_test(NAME cli_bench_batch_cpu_tiny
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--model;${_fx}/tiny/mlx4;--backend;cpu;--threads;2;--batch;1,2,3;--prompt-lens;9;--decode-tokens;3"
          -DRC=0
          "-DEXPECT=context +batch +step ms +agg tok/s +stream tok/s;\n +9 +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +1.00 ;\n +9 +2 +[0-9.]+ ;\n +9 +3 +[0-9.]+ "
          -P "${_runner}")
add_test(NAME cli_bench_batch_bad_list
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--model;${_fx}/tiny/mlx4;--backend;cpu;--batch;1,0"
          -DRC=1 "-DEXPECT=--batch: values must be >= 1" -P "${_runner}")
# --token-mask: the masked decode speed next to the plain one (constrained decoding's cost on the
# backend), on the fast CPU backend (which honours masks)
add_test(NAME cli_bench_token_mask_cpu_tiny
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--model;${_fx}/tiny/mlx4;--backend;cpu;--threads;2;--prompt-lens;9;--decode-tokens;4;--token-mask;0.5"
          -DRC=0
          "-DEXPECT=with a token mask before every step \\(50% of the vocabulary allowed\\): [0-9.]+ t/s = [0-9.]+x"
          -P "${_runner}")
# --synthetic with --backend cpu-ref: the reference backend on the synthetic weights (it used to take the
# CUDA branch: "needs a CUDA build" on a CPU-only build, the CUDA model on a GPU one). One real-width layer.
add_test(NAME cli_bench_synthetic_cpu_ref
  COMMAND ${CMAKE_COMMAND} -DLILAC=$<TARGET_FILE:lilac>
          "-DARGS=bench;--synthetic;--backend;cpu-ref;--layers;1;--threads;2;--prompt-lens;8;--decode-tokens;1"
          -DRC=0 "-DEXPECT=backend: cpu-ref \\(cpu-ref \\(fp32 reference\\)" -P "${_runner}")
