# `lilac tokenize`: encode a JSON string per line, decode id arrays, and reject bad input.
set(_tok_dir "${LILAC_SHARED_DIR}/fixtures/qwen3-tokenizer")
set(_lilac "$<TARGET_FILE:lilac>")

# Two lines in, two id arrays out (golden ids from encode_golden.json).
add_test(NAME cli_tokenize_encode
  COMMAND sh -c "out=$(printf '%s\\n%s\\n' '\"Hello, world!\"' '\"<|im_start|>user\\nhi<|im_end|>\\n\"' | \"$1\" tokenize --tokenizer \"$2\") || exit 1; \
expected=$(printf '%s\\n%s' '[9707,11,1879,0]' '[151644,872,198,6023,151645,198]'); \
[ \"$out\" = \"$expected\" ] || { echo \"got: $out\"; exit 1; }"
  sh "${_lilac}" "${_tok_dir}")

add_test(NAME cli_tokenize_decode
  COMMAND sh -c "out=$(printf '%s\\n' '[9707, 11, 1879, 0]' '[151644,872,198,6023,151645]' | \"$1\" tokenize --tokenizer \"$2\" --decode) || exit 1; \
expected=$(printf '%s\\n%s' '\"Hello, world!\"' '\"<|im_start|>user\\nhi<|im_end|>\"'); \
[ \"$out\" = \"$expected\" ] || { echo \"got: $out\"; exit 1; }"
  sh "${_lilac}" "${_tok_dir}")

# Round trip of multibyte text through encode then decode.
add_test(NAME cli_tokenize_roundtrip
  COMMAND sh -c "out=$(printf '%s\\n' '\"naïve café 🤖 你好\"' | \"$1\" tokenize --tokenizer \"$2\" | \"$1\" tokenize --tokenizer \"$2\" --decode) || exit 1; \
[ \"$out\" = '\"naïve café 🤖 你好\"' ] || { echo \"got: $out\"; exit 1; }"
  sh "${_lilac}" "${_tok_dir}")

# --no-special keeps "<|im_end|>" as text (so --skip-special keeps it); parsed as special it is skipped.
add_test(NAME cli_tokenize_special_flags
  COMMAND sh -c "a=$(printf '%s\\n' '\"x<|im_end|>\"' | \"$1\" tokenize --tokenizer \"$2\" --no-special | \"$1\" tokenize --tokenizer \"$2\" --decode --skip-special) || exit 1; \
b=$(printf '%s\\n' '\"x<|im_end|>\"' | \"$1\" tokenize --tokenizer \"$2\" | \"$1\" tokenize --tokenizer \"$2\" --decode --skip-special) || exit 1; \
[ \"$a\" = '\"x<|im_end|>\"' ] && [ \"$b\" = '\"x\"' ] || { echo \"got: $a / $b\"; exit 1; }"
  sh "${_lilac}" "${_tok_dir}")

# Bad input: not JSON, an out-of-range id, a missing tokenizer directory -> exit code 1 and a message.
# (Exit code and message are both checked inside sh: PASS_REGULAR_EXPRESSION would ignore the code.)
set(_expect_fail "out=$(printf \"$IN\" | \"$@\" 2>&1); rc=$?; echo \"$out\"; [ $rc -eq 1 ] && printf '%s' \"$out\" | grep -qF -- \"$MSG\"")
add_test(NAME cli_tokenize_bad_json
  COMMAND sh -c "IN='not json\\n'; MSG='stdin:1: not valid JSON'; ${_expect_fail}"
  sh "${_lilac}" tokenize --tokenizer "${_tok_dir}")
add_test(NAME cli_tokenize_bad_id
  COMMAND sh -c "IN='[1, 99999999]\\n'; MSG='token id 99999999 out of range'; ${_expect_fail}"
  sh "${_lilac}" tokenize --tokenizer "${_tok_dir}" --decode)
add_test(NAME cli_tokenize_missing_dir
  COMMAND sh -c "IN='\"x\"\\n'; MSG='/nonexistent/tok/tokenizer.json: cannot open file'; ${_expect_fail}"
  sh "${_lilac}" tokenize --tokenizer /nonexistent/tok)
set_tests_properties(cli_tokenize_encode cli_tokenize_decode cli_tokenize_roundtrip cli_tokenize_special_flags cli_tokenize_bad_json
  cli_tokenize_bad_id cli_tokenize_missing_dir PROPERTIES LABELS cli)
