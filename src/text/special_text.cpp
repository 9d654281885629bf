#include "text/special_text.h"

#include <algorithm>
#include <array>

#include "text/tokenizer.h"

namespace lilac {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kMark = "\xEE\x80\x80";  // U+E000: breaks a special token's text
constexpr std::string_view kEsc0 = "\xEE\x80\x81";  // U+E001 after a mark: a literal U+E000
constexpr std::string_view kEsc1 = "\xEE\x80\x82";  // U+E002 after a mark: a literal U+E001
constexpr std::string_view kLit1 = kEsc0;           // a literal U+E001 in the request

bool at(std::string_view s, size_t i, std::string_view w) { return s.size() >= i + w.size() && s.compare(i, w.size(), w) == 0; }

}  // namespace

SpecialTokenGuard::SpecialTokenGuard(const Tokenizer& tok) : tok_(tok) {
  for (int64_t id = 0; id < tok.vocab_size(); ++id) {
    if (!tok.is_special(int32_t(id))) continue;
    const std::string& t = tok.token_bytes(int32_t(id));
    if (!t.empty()) specials_.emplace_back(t, int32_t(id));
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [t, id] : specials_) first_[static_cast<unsigned char>(t[0])] = true;
}

std::string SpecialTokenGuard::escape(std::string_view s) const {
  std::string out;
  out.reserve(s.size() + 8);
  // A string that starts with the end of a special token's text (e.g. "end|>"): a mark first.
  for (const auto& [t, id] : specials_) {
    bool hit = false;
    for (size_t k = 1; k < t.size() && !hit; ++k) hit = at(s, 0, std::string_view(t).substr(t.size() - k));
    if (hit) {
      out += kMark;
      break;
    }
  }
  for (size_t i = 0; i < s.size();) {
    if (at(s, i, kMark)) {
      out += kMark;
      out += kEsc0;
      i += kMark.size();
      continue;
    }
    if (at(s, i, kLit1)) {
      out += kMark;
      out += kEsc1;
      i += kLit1.size();
      continue;
    }
    if (first_[static_cast<unsigned char>(s[i])]) {
      const std::string* hit = nullptr;
      for (const auto& [t, id] : specials_)
        if (at(s, i, t)) {
          hit = &t;
          break;
        }
      if (hit) {
        out.push_back((*hit)[0]);
        out += kMark;
        out.append(*hit, 1);
        i += hit->size();
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  // A string that ends with the beginning of a special token's text (e.g. "<|im_"): a mark last.
  for (const auto& [t, id] : specials_) {
    bool hit = false;
    for (size_t k = 1; k < t.size() && !hit; ++k) hit = s.size() >= k && s.compare(s.size() - k, k, t, 0, k) == 0;
    if (hit) {
      out += kMark;
      break;
    }
  }
  return out;
}

void SpecialTokenGuard::escape_request(ojson& request) const {
  std::vector<ojson*> stack{&request};
  while (!stack.empty()) {
    ojson* v = stack.back();
    stack.pop_back();
    if (v->is_string()) {
      std::string& s = v->get_ref<std::string&>();
      std::string e = escape(s);
      if (e != s) s = std::move(e);
    } else if (v->is_array()) {
      for (auto& x : *v) stack.push_back(&x);
    } else if (v->is_object()) {
      bool keys_clean = true;
      for (auto it = v->begin(); it != v->end() && keys_clean; ++it) keys_clean = escape(it.key()) == it.key();
      if (!keys_clean) {  // rebuilt in order with escaped keys (template may render keys: tool arguments)
        ojson rebuilt = ojson::object();
        for (auto it = v->begin(); it != v->end(); ++it) rebuilt[escape(it.key())] = std::move(it.value());
        *v = std::move(rebuilt);
      }
      for (auto it = v->begin(); it != v->end(); ++it)
        if (!((it.key() == "role" || it.key() == "type") && it.value().is_string())) stack.push_back(&it.value());
    }
  }
}

std::string SpecialTokenGuard::unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (at(s, i, kMark)) {
      if (at(s, i + kMark.size(), kEsc0)) out += kMark;
      else if (at(s, i + kMark.size(), kEsc1)) out += kLit1;
      i += kMark.size() + ((at(s, i + kMark.size(), kEsc0) || at(s, i + kMark.size(), kEsc1)) ? kEsc0.size() : 0);
      continue;
    }
    out.push_back(s[i++]);
  }
  return out;
}

std::vector<int32_t> SpecialTokenGuard::encode(std::string_view rendered) const {
  std::vector<int32_t> ids;
  auto plain = [&](size_t b, size_t e) {
    if (e <= b) return;
    std::string text = unescape(rendered.substr(b, e - b));
    if (text.empty()) return;
    std::vector<int32_t> part = tok_.encode(text, /*parse_special=*/false);
    ids.insert(ids.end(), part.begin(), part.end());
  };
  size_t start = 0;
  for (size_t i = 0; i < rendered.size();) {
    if (first_[static_cast<unsigned char>(rendered[i])]) {
      const std::pair<std::string, int32_t>* hit = nullptr;
      for (const auto& sp : specials_)
        if (at(rendered, i, sp.first)) {
          hit = &sp;
          break;
        }
      if (hit) {
        plain(start, i);
        ids.push_back(hit->second);
        i += hit->first.size();
        start = i;
        continue;
      }
    }
    ++i;
  }
  plain(start, rendered.size());
  return ids;
}

}  // namespace lilac
