#include "grammar/charset.h"

#include <algorithm>
#include <array>
#include <map>
#include <string>

namespace lilac::grammar {

CharSet CharSet::range(uint32_t lo, uint32_t hi) {
  CharSet s;
  s.add(lo, hi);
  return s;
}

CharSet CharSet::any() {
  CharSet s;
  s.add(0, 0xD7FF);
  s.add(0xE000, kMaxCodePoint);
  return s;
}

CharSet CharSet::of(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  CharSet s;
  for (auto& [lo, hi] : ranges)
    if (lo <= hi) s.ranges_.push_back({lo, std::min(hi, kMaxCodePoint)});
  s.normalize();
  return s;
}

void CharSet::add(uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  hi = std::min(hi, kMaxCodePoint);
  if (ranges_.empty() || lo > ranges_.back().second + 1) {  // past the last range: stays sorted
    ranges_.push_back({lo, hi});
    return;
  }
  ranges_.push_back({lo, hi});
  normalize();
}

void CharSet::add(const CharSet& o) {
  ranges_.insert(ranges_.end(), o.ranges_.begin(), o.ranges_.end());
  normalize();
}

void CharSet::normalize() {
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const auto& r : ranges_) {
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  ranges_ = std::move(out);
}

CharSet CharSet::negated() const {
  CharSet out;
  uint32_t next = 0;
  for (const auto& r : ranges_) {
    if (r.first > next) out.ranges_.push_back({next, r.first - 1});
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.ranges_.push_back({next, kMaxCodePoint});
  // Surrogates are not characters: never part of a set.
  CharSet res;
  for (const auto& r : out.ranges_) {
    if (r.second < 0xD800 || r.first > 0xDFFF) {
      res.ranges_.push_back(r);
      continue;
    }
    if (r.first < 0xD800) res.ranges_.push_back({r.first, 0xD7FF});
    if (r.second > 0xDFFF) res.ranges_.push_back({0xE000, r.second});
  }
  res.normalize();
  return res;
}

bool CharSet::contains(uint32_t c) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(c, UINT32_MAX));
  if (it == ranges_.begin()) return false;
  --it;
  return c >= it->first && c <= it->second;
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

std::string json_escape_code_point(uint32_t c, bool xml_safe) {
  if (xml_safe && c == '<') return "\\u003c";
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  std::string out;
  if (c < 0x20) {
    static const char* hex = "0123456789abcdef";
    out = "\\u00";
    out += hex[c >> 4];
    out += hex[c & 15];
    return out;
  }
  append_utf8(out, c);
  return out;
}

namespace {

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] (scalar values of one UTF-8 length class handled below) into pieces whose
// encodings are a product of byte ranges, and calls emit(seq) for each.
template <class F>
void utf8_ranges(uint32_t lo, uint32_t hi, F&& emit) {
  if (lo > hi) return;
  // No surrogates.
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) utf8_ranges(lo, 0xD7FF, emit);
    if (hi > 0xDFFF) utf8_ranges(0xE000, hi, emit);
    return;
  }
  static const uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t m : kMax)
    if (lo <= m && hi > m) {
      utf8_ranges(lo, m, emit);
      utf8_ranges(m + 1, hi, emit);
      return;
    }
  if (hi < 0x80) {
    emit(ByteSeq{{uint8_t(lo), uint8_t(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_ranges(lo, lo | m, emit);
        utf8_ranges((lo | m) + 1, hi, emit);
        return;
      }
      if ((hi & m) != m) {
        utf8_ranges(lo, (hi & ~m) - 1, emit);
        utf8_ranges(hi & ~m, hi, emit);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  ByteSeq seq;
  for (size_t i = 0; i < a.size(); ++i) seq.push_back({uint8_t(a[i]), uint8_t(b[i])});
  emit(seq);
}

bool needs_json_escape(uint32_t c, bool xml_safe) { return c < 0x20 || c == '"' || c == '\\' || (xml_safe && c == '<'); }

}  // namespace

void add_charset(Nfa& nfa, int32_t from, const CharSet& set, Encoding enc, int32_t to) {
  // Intermediate states are shared between sequences with the same prefix of byte ranges, which
  // keeps the NFA small for large sets (e.g. "any character").
  std::map<ByteSeq, int32_t> prefixes;  // prefix -> state after it (a set of thousands of ranges has thousands)
  auto state_after = [&](const ByteSeq& seq, size_t len) -> int32_t {
    int32_t cur = from;
    for (size_t l = 1; l <= len; ++l) {
      auto [it, fresh] = prefixes.try_emplace(ByteSeq(seq.begin(), seq.begin() + ptrdiff_t(l)), -1);
      if (fresh) {
        it->second = nfa.add_state();
        nfa.add_range(cur, seq[l - 1].first, seq[l - 1].second, it->second);
      }
      cur = it->second;
    }
    return cur;
  };
  auto emit = [&](const ByteSeq& seq) {
    const int32_t prev = state_after(seq, seq.size() - 1);
    nfa.add_range(prev, seq.back().first, seq.back().second, to);
  };
  for (const auto& [lo, hi] : set.ranges()) {
    if (enc == Encoding::Utf8) {
      utf8_ranges(lo, hi, emit);
      continue;
    }
    // JSON string: split out the code points that must be escaped.
    const bool xml_safe = enc == Encoding::JsonStringXmlSafe;
    uint32_t start = lo;
    for (uint32_t c = lo; c <= std::min(hi, uint32_t(0x5C)); ++c) {
      if (!needs_json_escape(c, xml_safe)) continue;
      if (c > start) utf8_ranges(start, c - 1, emit);
      nfa.add_literal_to(from, json_escape_code_point(c, xml_safe), to);
      start = c + 1;
    }
    if (start <= hi) utf8_ranges(start, hi, emit);
  }
}

}  // namespace lilac::grammar
