# serve --parse-mb N (MiB of request bodies parsed and prepared at once, server/parse_budget.h): listed by --help with
# its default, and in (0, 4096] (checked before the model folder).
lilac_cli_test(cli_serve_help_parse_mb "serve;--help" 0 "--parse-mb FLOAT=16 ")
lilac_cli_test(cli_serve_parse_mb_range "serve;--model;/nonexistent;--parse-mb;0" 1 "--parse-mb must be in \\(0, 4096\\]")

# serve --receive-mb N (MiB of request bodies being received at once, all connections together; 0: 256, or 4 x
# --max-body-mb when larger): listed by --help with its default, and in [0, 65536] (checked before the model folder).
lilac_cli_test(cli_serve_help_receive_mb "serve;--help" 0 "--receive-mb FLOAT=0 ")
lilac_cli_test(cli_serve_receive_mb_range "serve;--model;/nonexistent;--receive-mb;-1" 1
               "--receive-mb must be in \\[0, 65536\\]")
