// The checksums and measures the detectors validate candidates with (detectors.h): Luhn, IBAN mod 97 and each
// country's IBAN length, Shannon entropy.
#include <cmath>
#include <cstddef>

#include "router/detectors.h"

namespace lilac::router {

bool luhn_valid(std::string_view digits) {
  if (digits.empty()) return false;
  int sum = 0;
  bool dbl = false;
  for (size_t k = digits.size(); k-- > 0;) {
    int d = digits[k] - '0';
    if (d < 0 || d > 9) return false;
    if (dbl) {
      d *= 2;
      if (d > 9) d -= 9;
    }
    sum += d;
    dbl = !dbl;
  }
  return sum % 10 == 0;
}

bool iban_checksum_valid(std::string_view s) {
  if (s.size() < 5) return false;
  int rem = 0;
  auto feed = [&](char c) -> bool {
    if (c >= '0' && c <= '9') {
      rem = (rem * 10 + (c - '0')) % 97;
    } else if (c >= 'A' && c <= 'Z') {
      int v = c - 'A' + 10;
      rem = (rem * 100 + v) % 97;
    } else {
      return false;
    }
    return true;
  };
  for (size_t k = 4; k < s.size(); ++k)
    if (!feed(s[k])) return false;
  for (size_t k = 0; k < 4; ++k)
    if (!feed(s[k])) return false;
  return rem == 1;
}

int iban_country_length(char a, char b) {
  struct C {
    char a, b;
    int len;
  };
  static constexpr C kTable[] = {
      {'A', 'D', 24}, {'A', 'E', 23}, {'A', 'L', 28}, {'A', 'T', 20}, {'A', 'Z', 28}, {'B', 'A', 20},
      {'B', 'E', 16}, {'B', 'G', 22}, {'B', 'H', 22}, {'B', 'R', 29}, {'B', 'Y', 28}, {'C', 'H', 21},
      {'C', 'R', 22}, {'C', 'Y', 28}, {'C', 'Z', 24}, {'D', 'E', 22}, {'D', 'K', 18}, {'D', 'O', 28},
      {'E', 'E', 20}, {'E', 'G', 29}, {'E', 'S', 24}, {'F', 'I', 18}, {'F', 'O', 18}, {'F', 'R', 27},
      {'G', 'B', 22}, {'G', 'E', 22}, {'G', 'I', 23}, {'G', 'L', 18}, {'G', 'R', 27}, {'G', 'T', 28},
      {'H', 'R', 21}, {'H', 'U', 28}, {'I', 'E', 22}, {'I', 'L', 23}, {'I', 'Q', 23}, {'I', 'S', 26},
      {'I', 'T', 27}, {'J', 'O', 30}, {'K', 'W', 30}, {'K', 'Z', 20}, {'L', 'B', 28}, {'L', 'C', 32},
      {'L', 'I', 21}, {'L', 'T', 20}, {'L', 'U', 20}, {'L', 'V', 21}, {'M', 'C', 27}, {'M', 'D', 24},
      {'M', 'E', 22}, {'M', 'K', 19}, {'M', 'R', 27}, {'M', 'T', 31}, {'M', 'U', 30}, {'N', 'L', 18},
      {'N', 'O', 15}, {'P', 'K', 24}, {'P', 'L', 28}, {'P', 'S', 29}, {'P', 'T', 25}, {'Q', 'A', 29},
      {'R', 'O', 24}, {'R', 'S', 22}, {'S', 'A', 24}, {'S', 'C', 31}, {'S', 'E', 24}, {'S', 'I', 19},
      {'S', 'K', 24}, {'S', 'M', 27}, {'S', 'T', 25}, {'S', 'V', 28}, {'T', 'L', 23}, {'T', 'N', 24},
      {'T', 'R', 26}, {'U', 'A', 29}, {'V', 'A', 22}, {'V', 'G', 24}, {'X', 'K', 20},
  };
  for (const auto& c : kTable)
    if (c.a == a && c.b == b) return c.len;
  return 0;
}

double shannon_entropy_bits(std::string_view s) {
  if (s.empty()) return 0;
  size_t counts[256] = {0};
  for (unsigned char c : s) counts[c]++;
  double h = 0, len = static_cast<double>(s.size());
  for (size_t c : counts)
    if (c) {
      double p = static_cast<double>(c) / len;
      h -= p * std::log2(p);
    }
  return h;
}

}  // namespace lilac::router
