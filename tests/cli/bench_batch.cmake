# `lilac bench --batch` (batched decoding through Backend::decode_batch) on the CPU backend with the tiny
# fixture: one table row per batch size with its step time, aggregate and per-stream tok/s, memory and the
# step's floor (bytes at --peak-tbs: 1 MB/s here, so that the tiny model's ~2.4 MB show as whole
# milliseconds, more for more streams); bad lists are rejected before the model loads. (Run by
# golden_cpu.cmake's script mode.)
set(_fx "${LILAC_SHARED_DIR}/fixtures")
lilac_cli_test(cli_bench_batch_cpu_tiny "bench;--model;${_fx}/tiny/mlx4;--backend;cpu;--threads;2;--batch;1,2,3;--prompt-lens;9;--decode-tokens;3;--peak-tbs;0.000001"
  0 "context +batch +step ms +agg tok/s +stream tok/s +x first +mem GB +floor ms +floor %;\n +9 +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +1.00 +[0-9.]+ +24[0-9][0-9]\\.[0-9][0-9][0-9] +[0-9.]+\n;\n +9 +2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +3[0-9][0-9][0-9]\\.[0-9][0-9][0-9] ;\n +9 +3 +[0-9.]+ ")
lilac_cli_test(cli_bench_batch_bad_list "bench;--model;${_fx}/tiny/mlx4;--backend;cpu;--batch;1,0"
  1 "--batch: values must be >= 1")
# --token-mask: the masked decode speed next to the plain one (constrained decoding's cost on the
# backend), on the fast CPU backend (which honours masks)
lilac_cli_test(cli_bench_token_mask_cpu_tiny "bench;--model;${_fx}/tiny/mlx4;--backend;cpu;--threads;2;--prompt-lens;9;--decode-tokens;4;--token-mask;0.5"
  0 "with a token mask before every step \\(50% of the vocabulary allowed\\): [0-9.]+ t/s = [0-9.]+x")
# --synthetic with --backend cpu-ref: the reference backend on the synthetic weights (it used to take the
# CUDA branch: "needs a CUDA build" on a CPU-only build, the CUDA model on a GPU one). One real-width layer.
lilac_cli_test(cli_bench_synthetic_cpu_ref "bench;--synthetic;--backend;cpu-ref;--layers;1;--threads;2;--prompt-lens;8;--decode-tokens;1"
  0 "backend: cpu-ref \\(cpu-ref \\(fp32 reference\\)")
