# serve --parse-mb N (MiB of request bodies parsed and prepared at once, server/parse_budget.h): listed by --help with
# its default, and in (0, 4096] (checked before the model folder).
lilac_cli_test(cli_serve_help_parse_mb "serve;--help" 0 "--parse-mb FLOAT=16 ")
lilac_cli_test(cli_serve_parse_mb_range "serve;--model;/nonexistent;--parse-mb;0" 1 "--parse-mb must be in \\(0, 4096\\]")
