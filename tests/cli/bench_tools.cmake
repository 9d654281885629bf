# The GPU measurement scripts in bench/ that read recorded data (no GPU needed), on hand-made inputs.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
# prefill_trace.py prints the busiest prefill segment: the CSV's first segment (a kernel of the marker, then 200 ms of
# host gaps before the sample, as `lilac bench --synthetic`'s weight generation and warm-up) outspans the second, a
# prefill busy for its whole 91 µs; the longest span was printed before 50241c9.
add_test(NAME bench_prefill_trace_busiest_segment
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/bench/prefill_trace.py
                 ${CMAKE_CURRENT_LIST_DIR}/data/prefill_trace_idle_first.csv)
set_tests_properties(bench_prefill_trace_busiest_segment PROPERTIES LABELS cli
                     PASS_REGULAR_EXPRESSION "prefill: 3 kernels, span 91.0 us, busy 91.0 us")
