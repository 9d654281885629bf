// JSON Schema `pattern` (and the `format` patterns): a subset of ECMAScript regular expressions
// (as with the `u` flag) compiled into NFA paths.
//
// Supported: literal characters; `.` (any character but \n \r \u2028 \u2029); classes `[...]`,
// `[^...]` with ranges; the escapes \d \D \w \W \s \S, \t \n \r \f \v \0, \xHH, \uHHHH, \u{H...},
// and backslash before any of  ^ $ \ . * + ? ( ) [ ] { } | / -  ; groups `(...)`, `(?:...)`,
// `(?<name>...)`; alternation `|`; quantifiers * + ? {n} {n,} {n,m} (a trailing `?`, lazy, matches
// the same strings); `^` at the start and `$` at the end of a top-level alternative.
// Not supported (a PatternError naming the position): back-references, lookaround, \b \B, \p{...},
// \cX, anchors elsewhere, flags. As in JSON Schema, a pattern matches when it matches anywhere in
// the string: an alternative without `^` may be preceded, one without `$` followed, by any text.
#pragma once
#include <string>
#include <string_view>

#include "core/error.h"
#include "grammar/automaton.h"
#include "grammar/charset.h"

namespace lilac::grammar {

class PatternError : public Error {
 public:
  explicit PatternError(const std::string& msg) : Error(msg) {}
};

// Adds paths from `from` to `to` spelling (in `enc`) every string the pattern matches.
// `search`: JSON Schema semantics (unanchored sides match any text); false: the whole string must
// match (as if every alternative were anchored).
void add_pattern(Nfa& nfa, int32_t from, std::string_view pattern, Encoding enc, int32_t to,
                 bool search = true);

}  // namespace lilac::grammar
