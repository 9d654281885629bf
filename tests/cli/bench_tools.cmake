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
# scripts/ptx_compare.py (behind scripts/ptx-same.sh): the same code with other .loc lines, comments and anonymous
# namespace hashes is identical; renamed virtual registers are reported as such; a changed instruction is a difference.
set(_ptx ${CMAKE_CURRENT_LIST_DIR}/data/ptx)
foreach(_case moved renamed changed)
  add_test(NAME ptx_compare_${_case}
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/scripts/ptx_compare.py ${_ptx}/base.ptx ${_ptx}/${_case}.ptx)
endforeach()
set_tests_properties(ptx_compare_moved PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "^identical PTX\n$")
set_tests_properties(ptx_compare_renamed PROPERTIES LABELS cli
                     PASS_REGULAR_EXPRESSION "identical PTX up to virtual register numbers")
set_tests_properties(ptx_compare_changed PROPERTIES LABELS cli
                     PASS_REGULAR_EXPRESSION "different PTX: 2 lines differ.*-add.f32.*\\+sub.f32")
