#include "text/bounded_json.h"

#include <cstddef>
#include <functional>
#include <vector>

namespace lilac {

namespace {

using ojson = nlohmann::ordered_json;
using Entries = ojson::object_t::Container;  // std::vector<std::pair<const std::string, ojson>>

// Objects up to this many keys find a repeated key by a linear search; larger ones by a hash index.
constexpr size_t kLinearKeys = 16;

// An open-addressing index of an object's keys: slot -> position + 1 (0 = empty), with each key's hash.
struct KeyIndex {
  std::vector<uint32_t> slots;
  std::vector<size_t> hashes;  // hashes[position]

  bool empty() const { return slots.empty(); }
  void grow() {
    std::vector<uint32_t> old(slots.empty() ? 64 : slots.size() * 2, 0);
    old.swap(slots);
    for (size_t pos = 0; pos < hashes.size(); ++pos) put(hashes[pos], pos);
  }
  void put(size_t h, size_t pos) {
    const size_t mask = slots.size() - 1;
    size_t s = h & mask;
    while (slots[s]) s = (s + 1) & mask;
    slots[s] = static_cast<uint32_t>(pos + 1);
  }
  void add(size_t h, size_t pos) {
    hashes.push_back(h);
    if (2 * hashes.size() > slots.size()) grow();
    else put(h, pos);
  }
};

struct Frame {
  ojson* node = nullptr;  // the array or object being filled
  std::string key;        // object: the key of the next value
  KeyIndex index;         // object past kLinearKeys
  bool handed = false;    // the array whose elements are handed out (parse_bounded_json_handing)
};

class Builder {
 public:
  Builder(const JsonLimits& limits, JsonParseResult& result, std::string_view handed_key = {},
          const JsonElementTaker* take = nullptr)
      : limits_(limits), r_(result), handed_key_(handed_key), take_(take) {}

  bool null() { return add(ojson(nullptr)) != nullptr; }
  bool boolean(bool b) { return add(ojson(b)) != nullptr; }
  bool number_integer(ojson::number_integer_t v) { return add(ojson(v)) != nullptr; }
  bool number_unsigned(ojson::number_unsigned_t v) { return add(ojson(v)) != nullptr; }
  bool number_float(ojson::number_float_t v, const std::string&) { return add(ojson(v)) != nullptr; }
  bool string(std::string& s) { return add(ojson(std::move(s))) != nullptr; }
  bool binary(ojson::binary_t&) { return add(ojson(nullptr)) != nullptr; }  // not produced by JSON text
  bool start_object(size_t) { return open(ojson::object()); }
  bool start_array(size_t) { return open(ojson::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    if (!count()) return false;
    Frame& f = stack_.back();
    // A repeated key replaces its value (insert()); only a new one past the limit fails.
    if (f.node->size() >= limits_.max_object_keys && !has_key(f, k)) {
      r_.status = JsonParseResult::TooManyValues;
      r_.message = "an object with more than " + std::to_string(limits_.max_object_keys) + " keys";
      return false;
    }
    f.key = std::move(k);
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& ex) {
    r_.status = JsonParseResult::Invalid;
    std::string what = ex.what();
    if (size_t p = what.find("] "); p != std::string::npos && what.front() == '[') what.erase(0, p + 2);
    // Not the text around the error ("last read: ..."): messages are logged, bodies may hold secrets.
    if (size_t p = what.find("; last read"); p != std::string::npos) what.erase(p);
    r_.message = what;
    return false;
  }

 private:
  bool count() {
    if (++values_ <= limits_.max_values) return true;
    r_.status = JsonParseResult::TooManyValues;
    r_.message = "more than " + std::to_string(limits_.max_values) + " JSON values";
    return false;
  }

  bool open(ojson container) {
    if (stack_.size() + 1 > limits_.max_depth) {
      r_.status = JsonParseResult::TooDeep;
      r_.message = "JSON nested more than " + std::to_string(limits_.max_depth) + " levels deep";
      return false;
    }
    // The array under the root object's handed key (its key is moved into the object by add()).
    const bool handed = take_ && container.is_array() && stack_.size() == 1 && stack_[0].node->is_object() &&
                        stack_[0].key == handed_key_;
    ojson* node = add(std::move(container));
    if (!node) return false;
    // The parent gets no other value while this child is open, so `node` stays valid until close().
    stack_.emplace_back();
    stack_.back().node = node;
    stack_.back().handed = handed;
    return true;
  }

  bool close() {
    stack_.pop_back();
    if (!stack_.empty() && stack_.back().handed) hand(stack_.back());  // an element of the handed array, complete
    return true;
  }

  // Stores `v` where the document puts it; returns where it lives (nullptr past a limit).
  ojson* add(ojson v) {
    if (!count()) return nullptr;
    if (stack_.empty()) {
      r_.value = std::move(v);
      return &r_.value;
    }
    Frame& f = stack_.back();
    if (f.node->is_array()) {
      const bool complete = !v.is_structured();  // (an array or object is handed once closed)
      ojson::array_t& a = f.node->get_ref<ojson::array_t&>();
      a.push_back(std::move(v));
      if (f.handed && complete) hand(f);  // (a scalar: complete at once)
      return &a.back();
    }
    return insert(f, std::move(v));
  }

  // Hands the handed array's last element out, a null left in its place.
  void hand(Frame& f) {
    ojson::array_t& a = f.node->get_ref<ojson::array_t&>();
    ojson v = std::move(a.back());
    a.back() = nullptr;
    (*take_)(a.size() - 1, v);
  }

  // Where `key` already is in the frame's object (its position), or -1.
  ptrdiff_t find_key(Frame& f, const std::string& key, size_t h) {
    Entries& e = f.node->get_ref<ojson::object_t&>();
    if (e.size() < kLinearKeys) {
      for (size_t i = 0; i < e.size(); ++i) {
        ++r_.key_compares;
        if (e[i].first == key) return ptrdiff_t(i);
      }
      return -1;
    }
    if (f.index.empty())
      for (size_t i = 0; i < e.size(); ++i) f.index.add(std::hash<std::string_view>{}(e[i].first), i);
    const size_t mask = f.index.slots.size() - 1;
    for (size_t s = h & mask; f.index.slots[s]; s = (s + 1) & mask) {
      const size_t pos = f.index.slots[s] - 1;
      if (f.index.hashes[pos] != h) continue;
      ++r_.key_compares;
      if (e[pos].first == key) return ptrdiff_t(pos);
    }
    return -1;
  }
  bool has_key(Frame& f, const std::string& key) {
    return f.node->is_object() && find_key(f, key, std::hash<std::string_view>{}(key)) >= 0;
  }

  ojson* insert(Frame& f, ojson v) {
    Entries& e = f.node->get_ref<ojson::object_t&>();
    const size_t h = std::hash<std::string_view>{}(f.key);
    if (const ptrdiff_t pos = find_key(f, f.key, h); pos >= 0) {
      e[size_t(pos)].second = std::move(v);
      return &e[size_t(pos)].second;
    }
    e.emplace_back(std::move(f.key), std::move(v));
    if (!f.index.empty()) f.index.add(h, e.size() - 1);
    return &e.back().second;
  }

  const JsonLimits& limits_;
  JsonParseResult& r_;
  const std::string_view handed_key_;
  const JsonElementTaker* const take_;
  std::vector<Frame> stack_;
  size_t values_ = 0;
};

JsonParseResult parse_with(std::string_view text, const JsonLimits& limits, std::string_view handed_key,
                           const JsonElementTaker* take) {
  JsonParseResult r;
  Builder b(limits, r, handed_key, take);
  const bool ok = ojson::sax_parse(text.begin(), text.end(), &b, nlohmann::json::input_format_t::json, true, false);
  if (!ok) {
    if (r.status == JsonParseResult::Ok) {
      r.status = JsonParseResult::Invalid;
      r.message = "invalid JSON";
    }
    r.value = nullptr;  // the partial document is not used (destroyed without recursion)
  }
  return r;
}

}  // namespace

JsonParseResult parse_bounded_json(std::string_view text, const JsonLimits& limits) {
  return parse_with(text, limits, {}, nullptr);
}

JsonParseResult parse_bounded_json_handing(std::string_view text, const JsonLimits& limits, std::string_view key,
                                           const JsonElementTaker& take) {
  return parse_with(text, limits, key, &take);
}

}  // namespace lilac
