// Finding the long runs of a byte class in a text without reading every byte (internal to router/).
//
// Several passes of the sensitivity scan only act on long runs of one kind of byte: the opaque detector on base64
// runs of >= 1024 characters, the base64 variant on runs of >= 16, the digits-joined variant's test on runs of digits
// and separators holding >= 13 digits. Prose is made of short runs, so reading every byte to find the few long ones
// was most of those passes' cost (bench/BENCHMARKS.md "Hybrid router").
//
// for_each_long_run() visits, left to right, every maximal run of member bytes at least `min_len` long, and nothing
// else. It looks at the last byte of the next `min_len` bytes first: when that byte is not a member, no run of
// `min_len` can start at any of them, so they are all skipped; when it is, the bytes before it are read backwards to
// where its run begins. A run that begins at the window's start is read to its end and visited. Each byte is read at
// most twice, and in text of short runs only about one byte in (min_len - run length) is read at all.
#pragma once
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lilac::router::detail {

// A set of bytes, as a table.
using ByteSet = std::array<bool, 256>;

// Calls f(begin, end) for each maximal run [begin, end) of bytes in `member` with end - begin >= min_len (min_len >= 1),
// in order of position, from `p` on (p == 0, or s[p - 1] is not a member).
template <class F>
void for_each_long_run_from(std::string_view text, const ByteSet& member, size_t min_len, size_t p, F&& f) {
  const unsigned char* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // Invariant: p == 0 or s[p - 1] is not a member, so a run that covers s[p] begins at p.
  while (p <= n && n - p >= min_len) {
    size_t k = p + min_len - 1;  // the window's last byte
    if (!member[s[k]]) {
      p = k + 1;
      continue;
    }
    while (k > p && member[s[k - 1]]) --k;
    if (k > p) {  // s[k - 1] is not a member: no long run begins before k
      p = k;
      continue;
    }
    size_t e = p + min_len;
    while (e < n && member[s[e]]) ++e;
    f(p, e);
    if (e == n) return;
    p = e + 1;  // s[e] is not a member
  }
}

// The same with the members of 16 bytes at a time: mask16(q) has bit k set when q[k] is a member (1 <= min_len <= 16).
// Each window of min_len bytes is looked at whole: when a byte of it is not a member, the next window begins after
// the last such byte.
template <class F, class Mask16>
void for_each_long_run(std::string_view text, const ByteSet& member, size_t min_len, F&& f, Mask16&& mask16) {
  const unsigned char* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const unsigned want = min_len >= 16 ? 0xFFFFu : (1u << min_len) - 1;
  size_t p = 0;  // (the same invariant)
  while (n - p >= 16) {
    const unsigned m = mask16(s + p) & want;
    if (m != want) {
      p += size_t(std::bit_width(~m & want));  // past the window's last non-member
      continue;
    }
    size_t e = p + min_len;
    for (; n - e >= 16; e += 16)
      if (const unsigned b = mask16(s + e) & 0xFFFFu; b != 0xFFFFu) break;
    while (e < n && member[s[e]]) ++e;
    f(p, e);
    if (e == n) return;
    p = e + 1;
  }
  for_each_long_run_from(text, member, min_len, p, f);
}

template <class F>
void for_each_long_run(std::string_view text, const ByteSet& member, size_t min_len, F&& f) {
  for_each_long_run_from(text, member, min_len, 0, f);
}

}  // namespace lilac::router::detail
