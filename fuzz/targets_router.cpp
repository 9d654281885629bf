// Fuzz targets of the hybrid router's sensitivity scan: what decides whether a request may leave the
// machine. A miss is a leak, so the property is the security one: a secret planted anywhere is found.
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "fuzz/json_mutator.h"
#include "router/detectors.h"
#include "router/router.h"
#include "router/scan.h"
#include "text/bounded_json.h"
#include "text/unicode.h"

namespace {

using lilac::fuzz::Input;
using lilac::fuzz::violated;
using lilac::router::DetectorSet;
using lilac::router::Finding;

const char* const kSecrets[] = {
    "john.doe@example.com",       "+44 20 7946 0958",        "4111 1111 1111 1111", "5555555555554444",
    "DE89 3704 0044 0532 0130 00", "GB82WEST12345698765432", "SSN 123-45-6789",     "AKIAIOSFODNN7EXAMPLE",
    "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "sk-proj-4fJ9aQ2LmZx8TtR1vB6nW3yK",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----"};
constexpr int kNumSecrets = int(sizeof kSecrets / sizeof *kSecrets);

// A code-point boundary of s at or before i.
size_t boundary(const std::string& s, size_t i) {
  i = std::min(i, s.size());
  while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

bool overlaps(const std::vector<Finding>& fs, size_t a, size_t b) {
  for (const auto& f : fs)
    if (f.offset < b && f.offset + f.length > a) return true;
  return false;
}

}  // namespace

// Any text with a known secret planted between spaces: findings are ordered, disjoint and inside the
// text, and one of them covers the secret, whatever comes before and after it.
LILAC_FUZZ_TARGET(detectors, "a planted secret is found whatever text surrounds it") {
  Input in(data, size);
  const int k = int(in.below(kNumSecrets));
  const size_t cut = in.below(65536);
  std::string text = lilac::unicode::sanitize_utf8(in.rest());
  const size_t at = boundary(text, text.empty() ? 0 : cut % (text.size() + 1));
  const std::string secret = kSecrets[k];
  text = text.substr(0, at) + " " + secret + " " + text.substr(at);
  const std::vector<Finding> fs = lilac::router::scan_sensitive(text);
  for (size_t i = 0; i < fs.size(); ++i) {
    if (fs[i].length == 0 || fs[i].offset + fs[i].length > text.size()) violated("detectors", "a finding outside the text");
    if (i && fs[i].offset < fs[i - 1].offset + fs[i - 1].length) violated("detectors", "findings overlap or are out of order");
  }
  if (!overlaps(fs, at + 1, at + 1 + secret.size()))
    violated("detectors", "missed \"" + secret + "\" planted at byte " + std::to_string(at + 1) + " of " + std::to_string(text.size()));
}

namespace {

// Visits every string value and key of `v`; the n-th (mod the count) gets the secret inserted.
void plant(nlohmann::ordered_json& v, size_t& n, size_t target, size_t cut, const std::string& secret, bool& done) {
  auto put = [&](std::string s) {
    const size_t at = boundary(s, cut % (s.size() + 1));
    return s.substr(0, at) + " " + secret + " " + s.substr(at);
  };
  if (done) return;
  if (v.is_string()) {
    if (n++ == target) {
      v = put(v.get<std::string>());
      done = true;
    }
  } else if (v.is_array()) {
    for (auto& x : v) plant(x, n, target, cut, secret, done);
  } else if (v.is_object()) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    for (auto& [key, x] : v.items()) {
      std::string kk = key;
      if (!done && n++ == target) {
        kk = put(kk);
        done = true;
      }
      plant(x, n, target, cut, secret, done);
      o[kk] = x;
    }
    v = std::move(o);
  }
}

// Plants the secret in the (target mod count)-th string or key of `v`; false when it has none.
bool plant_somewhere(nlohmann::ordered_json& v, size_t target, size_t cut, const std::string& secret) {
  size_t n = 0;
  bool done = false;
  plant(v, n, size_t(-1), cut, secret, done);  // counts the strings and keys
  if (n == 0) return false;
  const size_t count = n;
  n = 0;
  plant(v, n, target % count, cut, secret, done);
  return true;
}

// Policies that push toward the cloud in every way a rule can (default, size, busy, model rules).
const std::vector<std::unique_ptr<lilac::router::Router>>& routers() {
  static const std::vector<std::unique_ptr<lilac::router::Router>> r = [] {
    std::vector<std::unique_ptr<lilac::router::Router>> v;
    for (const char* p : {R"({})", R"({"default_route": "cloud", "max_local_prompt_bytes": 16, "sticky": false})",
                          R"({"models": [{"match": "*", "routes": ["cloud"]}]})",
                          R"({"default_route": "auto", "models": [{"match": "lilac*", "routes": ["cloud"]}]})"})
      v.push_back(std::make_unique<lilac::router::Router>(lilac::router::parse_route_policy(nlohmann::json::parse(p)),
                                                           lilac::router::RouterConfig{"lilac", "gpt-up"}));
    return v;
  }();
  return r;
}

}  // namespace

// A request body (any JSON) with a secret planted in one of its strings or keys: the router's scan (scan_body
// with the default policy's check) calls it sensitive (or unscannable), whichever string holds it.
LILAC_FUZZ_TARGET_MUTATED(scan_body, "a secret planted in any string or key of a body makes it sensitive",
                          lilac::fuzz::mutate_json_body) {
  Input in(data, size);
  const int k = int(in.below(kNumSecrets));
  const size_t target = in.below(256), cut = target * 31 + size_t(k);  // two choice bytes (json_mutator.h)
  lilac::JsonParseResult j = lilac::parse_bounded_json(in.rest());
  if (!j.ok()) return;
  if (!plant_somewhere(j.value, target, cut, kSecrets[k])) return;  // no string anywhere
  const lilac::router::ScanOutcome o = routers()[0]->scan(j.value);  // the default policy: every detector
  if (!o.sensitive && !o.unscannable) violated("scan_body", std::string("missed \"") + kSecrets[k] + "\" in " + j.value.dump().substr(0, 400));
}


// The routing decision itself, for every protocol, explicit route, busy state and policy: a request
// body with a secret planted in any string or key never goes to the cloud (it stays local, or is
// refused when a rule forbids local).
LILAC_FUZZ_TARGET_MUTATED(route, "a body holding a secret is never routed to the cloud", lilac::fuzz::mutate_json_body) {
  Input in(data, size);
  const uint32_t c0 = in.below(256), c1 = in.below(256);
  const int k = int(c0 % kNumSecrets);
  const auto api = static_cast<lilac::router::Api>(c1 % 4);
  static const char* const kHeader[] = {"", "cloud", "auto", "local"};
  const char* header = kHeader[(c1 / 4) % 4];
  const bool busy = (c1 / 16) & 1;
  const auto& router = *routers()[(c1 / 32) % 4];
  lilac::JsonParseResult j = lilac::parse_bounded_json(in.rest());
  if (!j.ok() || !j.value.is_object()) return;
  if (!plant_somewhere(j.value, c0, c0 * 7, kSecrets[k])) {
    j.value["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", ""}}});
    plant_somewhere(j.value, 0, c0 * 7, kSecrets[k]);
  }
  const lilac::router::RouteDecision d = router.decide(j.value, api, header, busy);
  if (d.route == lilac::router::Route::cloud && d.error_status == 0)
    violated("route", std::string("sent to the cloud (") + d.reason + ") with \"" + kSecrets[k] + "\" in " +
                          j.value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).substr(0, 400));
}
