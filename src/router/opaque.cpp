// The opaque detector (detectors.h): base64 payloads the scan cannot read.
#include <string_view>
#include <vector>

#include "router/detectors.h"
#include "router/normalize.h"

namespace lilac::router {

namespace {

bool is_b64(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/' ||
         c == '-' || c == '_';
}

}  // namespace

// The opaque detector (a pass of its own): base64 runs of at least kOpaqueMinChars characters -- line breaks inside a
// run (MIME's, PEM's) and '=' padding at its end belong to it -- with upper and lower case letters and digits (not a
// DNA sequence, hex, or a long word) whose decoded head is not text. Text payloads are not findings: the scan decodes
// them and looks inside (normalize.h).
void find_opaque(std::string_view text, std::vector<Finding>& found) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    if (!is_b64(p[i])) {
      ++i;
      continue;
    }
    size_t j = i, chars = 0;
    unsigned classes = 0;  // 1 upper, 2 lower, 4 digit
    while (j < n) {
      if (is_b64(p[j])) {
        classes |= (p[j] >= 'A' && p[j] <= 'Z') ? 1u : (p[j] >= 'a' && p[j] <= 'z') ? 2u : (p[j] >= '0' && p[j] <= '9') ? 4u : 0u;
        ++chars;
        ++j;
      } else if ((p[j] == '\n' || p[j] == '\r') && j + 1 < n && (is_b64(p[j + 1]) || p[j + 1] == '\n')) {
        ++j;
      } else {
        break;
      }
    }
    for (int pad = 0; pad < 2 && j < n && p[j] == '='; ++pad) ++j;
    if (chars >= kOpaqueMinChars && classes == 7u && !base64_decodes_to_text(text.substr(i, j - i))) found.push_back({DetectorKind::opaque, i, j - i});
    i = j + (j == i);
  }
}

}  // namespace lilac::router
