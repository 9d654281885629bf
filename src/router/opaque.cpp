// The opaque detector (detectors.h): base64 payloads the scan cannot read.
#include <string_view>
#include <vector>

#include "router/detectors.h"
#include "router/long_runs.h"
#include "router/normalize.h"

namespace lilac::router {

// The opaque detector (a pass of its own): base64 runs of at least kOpaqueMinChars characters -- line breaks inside a
// run (MIME's, PEM's) and '=' padding at its end belong to it -- with upper and lower case letters and digits (not a
// DNA sequence, hex, or a long word) whose decoded head is not text. Text payloads are not findings: the scan decodes
// them and looks inside (normalize.h).
void find_opaque(std::string_view text, std::vector<Finding>& found) {
  // A run of kOpaqueMinChars base64 characters lies inside a stretch of as many bytes that are base64 characters, line
  // breaks or '=': only those stretches are read (long_runs.h; in prose there are none). Each is read as the whole text
  // would be: the byte before it is none of these, so no run reaches into it and the reading starts afresh there, and
  // the byte after it ends any run.
  static constexpr detail::ByteSet kRunBytes = [] {
    detail::ByteSet t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = detail::kBase64Digits.v[c] >= 0 || c == '\n' || c == '\r' || c == '=';
    return t;
  }();
  const size_t n = text.size();
  detail::for_each_long_run(text, kRunBytes, kOpaqueMinChars, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      if (base64_digit(text[i]) < 0) {
        ++i;
        continue;
      }
      size_t j = i, chars = 0;
      unsigned classes = 0;  // 1 upper, 2 lower, 4 digit
      while (j < n) {
        if (const int d = base64_digit(text[j]); d >= 0) {
          classes |= d < 26 ? 1u : d < 52 ? 2u : d < 62 ? 4u : 0u;
          ++chars;
          ++j;
        } else if ((text[j] == '\n' || text[j] == '\r') && j + 1 < n &&
                   (base64_digit(text[j + 1]) >= 0 || text[j + 1] == '\n')) {
          ++j;
        } else {
          break;
        }
      }
      for (int pad = 0; pad < 2 && j < n && text[j] == '='; ++pad) ++j;
      if (chars >= kOpaqueMinChars && classes == 7u && !base64_decodes_to_text(text.substr(i, j - i)))
        found.push_back({DetectorKind::opaque, i, j - i});
      i = j;
    }
  });
}

}  // namespace lilac::router
