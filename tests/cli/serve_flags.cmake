# serve --parse-mb N (MiB of request bodies parsed and prepared at once, server/parse_budget.h): listed by --help with
# its default, and in (0, 4096] (checked before the model folder).
lilac_cli_test(cli_serve_help_parse_mb "serve;--help" 0 "--parse-mb FLOAT=16 ")
lilac_cli_test(cli_serve_parse_mb_range "serve;--model;/nonexistent;--parse-mb;0" 1 "--parse-mb must be in \\(0, 4096\\]")

# serve --receive-mb N (MiB of request bodies being received at once, all connections together; 0: 256, or 4 x
# --max-body-mb when larger): listed by --help with its default, and in [0, 65536] (checked before the model folder).
lilac_cli_test(cli_serve_help_receive_mb "serve;--help" 0 "--receive-mb FLOAT=0 ")
lilac_cli_test(cli_serve_receive_mb_range "serve;--model;/nonexistent;--receive-mb;-1" 1
               "--receive-mb must be in \\[0, 65536\\]")

# serve --max-client-connections N and --client-receive-mb N (the per-client bounds: one peer address's open
# connections, -1: a quarter of --max-connections; its bodies being received, -1: half of --receive-mb; 0: none):
# listed by --help with their defaults, and checked before the model folder.
lilac_cli_test(cli_serve_help_max_client_connections "serve;--help" 0 "--max-client-connections INT=-1 ")
lilac_cli_test(cli_serve_help_client_receive_mb "serve;--help" 0 "--client-receive-mb FLOAT=-1 ")
lilac_cli_test(cli_serve_max_client_connections_range "serve;--model;/nonexistent;--max-client-connections;-2" 1
               "--max-client-connections must be at least 0 \\(-1: a quarter of --max-connections\\)")
lilac_cli_test(cli_serve_client_receive_mb_range "serve;--model;/nonexistent;--client-receive-mb;-0.5" 1
               "--client-receive-mb must be in \\[0, 65536\\] \\(-1: half of --receive-mb\\)")
lilac_cli_test(cli_serve_client_receive_mb_too_large "serve;--model;/nonexistent;--client-receive-mb;70000" 1
               "--client-receive-mb must be in \\[0, 65536\\]")
