# `--spec-tokens` on the CLI (speculative decoding with the MTP head, CPU backend): generate gives the
# same ids with and without it on tiny-mtp, with either draft policy (--spec-policy), and says how many
# drafts were accepted; a checkpoint without a head runs without speculation and the log says why; bench
# measures both policies at forced acceptances; a bad policy name is an error naming the option; serve's
# --spec-max-batch.
# Uses golden_cpu.cmake's script mode (-DARGS, -DRC, -DEXPECT, -DSAME_AS).
set(_fx "${LILAC_SHARED_DIR}/fixtures")
lilac_cli_test(cli_generate_cpu_spec_same_ids "generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;20;--backend;cpu-ref;--threads;1;--spec-tokens;3;--spec-policy;fixed"
  0 "speculative decoding: up to 3 MTP drafts per step;speculative \\(fixed\\): [0-9]+ of [0-9]+ steps with drafts, [0-9]+ of [0-9]+ drafts accepted, [0-9.]+ drafts per step"
  "generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;20;--backend;cpu-ref;--threads;1;--spec-tokens;0")
lilac_cli_test(cli_generate_cpu_spec_adaptive_same_ids "generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;40;--backend;cpu-ref;--threads;1;--spec-tokens;3"
  0 "speculative \\(adaptive\\): [0-9]+ of 39 steps with drafts, [0-9]+ of [0-9]+ drafts accepted, [0-9.]+ drafts per step"
  "generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;40;--backend;cpu-ref;--threads;1;--spec-tokens;0")
lilac_cli_test(cli_generate_spec_policy_bad_name "generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5;--spec-tokens;3;--spec-policy;greedy"
  1 "--spec-policy: 'greedy' is not a policy \\(adaptive or fixed\\)")
lilac_cli_test(cli_bench_spec_policy_bad_name "bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--spec-tokens;2;--spec-policy;adapt"
  1 "--spec-policy: 'adapt' is not adaptive, fixed or both")
lilac_cli_test(cli_generate_cpu_spec_without_head "generate;--model;${_fx}/tiny/mlx4;--prompt-ids;621;--max-tokens;8;--backend;cpu-ref;--threads;1;--spec-tokens;3"
  0 "speculative decoding off: the checkpoint has no MTP head;generated ids: 1243,2021,215,540,1962,924,75,1676\n")
lilac_cli_test(cli_bench_cpu_spec_forced_acceptance "bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--threads;1;--prompt-lens;16;--decode-tokens;24;--spec-tokens;2;--draft-accept;1"
  0 "speculative decoding: at most K = 2 drafts per step, drafts forced right with probability P;\n +16 +1.00 +fixed +[0-9.]+ +[0-9.]+ +[0-9.]+x +2.00 +3.00 +2.00 +[0-9.]+ +[0-9.]+\n +16 +1.00 +adaptive +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+\n")
lilac_cli_test(cli_bench_cpu_spec_policies_and_acceptances "bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--threads;1;--prompt-lens;16;--decode-tokens;24;--spec-tokens;2;--draft-accept;0,1;--spec-policy;fixed"
  0 "\n +16 +0.00 +fixed +[0-9.]+ +[0-9.]+ +[0-9.]+x +0.00 +1.00 +2.00 +[0-9.]+ +[0-9.]+\n +16 +1.00 +fixed +[0-9.]+ +[0-9.]+ +[0-9.]+x +2.00 +3.00 +2.00 +[0-9.]+ +[0-9.]+\n")
lilac_cli_test(cli_bench_draft_accept_range "bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--spec-tokens;2;--draft-accept;0.5,1.5"
  1 "--draft-accept must be in \\[0, 1\\] \\(got 1.5\\)")
lilac_cli_test(cli_bench_draft_accept_needs_spec_tokens "bench;--model;${_fx}/tiny-mtp/mlx4;--backend;cpu-ref;--draft-accept;0.5"
  1 "--draft-accept needs --spec-tokens K > 0")
# --draft-vocab N (drafts only among ids below N): the same ids as without speculation; a negative N is CLI11's
# validation error (exit 105, as for --spec-tokens out of range).
lilac_cli_test(cli_generate_cpu_spec_draft_vocab_same_ids "generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;20;--backend;cpu-ref;--threads;1;--spec-tokens;3;--spec-policy;fixed;--draft-vocab;100"
  0 "speculative \\(fixed\\): [0-9]+ of [0-9]+ steps with drafts"
  "generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5,6,7,8;--max-tokens;20;--backend;cpu-ref;--threads;1;--spec-tokens;0")
lilac_cli_test(cli_generate_draft_vocab_negative "generate;--model;${_fx}/tiny-mtp/mlx4;--prompt-ids;5;--draft-vocab;-1"
  105 "--draft-vocab: Value -1 not in range 0 to 16777216")
# serve --spec-max-batch N (speculation only while at most N streams decode): listed by --help, at least 1.
lilac_cli_test(cli_serve_help_spec_max_batch "serve;--help"
  0 "--spec-max-batch INT=1 ")
lilac_cli_test(cli_serve_spec_max_batch_zero "serve;--model;${_fx}/tiny-mtp/mlx4;--port;0;--spec-tokens;2;--spec-max-batch;0"
  1 "--spec-max-batch must be at least 1")
