// Sensitive-data detectors for the hybrid router: find e-mail addresses, phone numbers, payment cards,
// IBANs, US SSNs, IP addresses, private keys and API-key-like secrets in a piece of text.
//
// One hand-written pass over the bytes (no regex): candidate starts are word starts, '@' and '-----',
// and each detector validates its candidate (Luhn, IBAN mod-97, SSN ranges, octet ranges, entropy). The opaque
// detector is a pass of its own over base64 runs.
// A finding carries the kind, a byte offset and a length, never a copy of the value, so callers can
// log findings without leaking what was found.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lilac::router {

enum class DetectorKind : uint8_t {
  email = 0,
  phone,
  card,         // payment card number, 13-19 digits, Luhn-checked, first digit 2-6
  iban,         // country code + check digits, country length table, mod-97 checksum
  ssn,          // US social security number AAA-GG-SSSS (invalid ranges excluded)
  ipv4,
  ipv6,
  private_key,  // -----BEGIN ... PRIVATE KEY----- blocks (PEM, OpenSSH, PGP)
  api_key,      // tokens with a known secret prefix (sk-, ghp_, AKIA, AIza, xoxb-, glpat-, hf_, JWTs, ...)
  high_entropy, // >= 24 chars of [A-Za-z0-9_-], upper + lower + digit, high Shannon entropy
  opaque,       // a base64 payload (>= kOpaqueMinChars) that does not decode to text: an image, a PDF, an archive
                // the scan cannot read, so it is not shown clean
  count_
};

constexpr int kDetectorKindCount = static_cast<int>(DetectorKind::count_);
// The shortest base64 run (characters of either alphabet, line breaks inside not counted) the opaque detector
// looks at: 768 bytes decoded. Shorter runs are keys and ids (high_entropy's and api_key's) or decode to text.
constexpr size_t kOpaqueMinChars = 1024;

// "email", "phone", "card", "iban", "ssn", "ipv4", "ipv6", "private_key", "api_key", "high_entropy", "opaque".
const char* detector_name(DetectorKind k);
// Inverse of detector_name; returns false for an unknown name.
bool detector_from_name(std::string_view name, DetectorKind* out);

// A set of enabled detectors (bit i = DetectorKind i).
struct DetectorSet {
  uint32_t bits = (1u << kDetectorKindCount) - 1;  // all enabled
  static DetectorSet all() { return {}; }
  static DetectorSet none() { return DetectorSet{0}; }
  bool has(DetectorKind k) const { return bits & (1u << static_cast<int>(k)); }
  void set(DetectorKind k, bool on) {
    if (on) bits |= 1u << static_cast<int>(k);
    else bits &= ~(1u << static_cast<int>(k));
  }
  bool empty() const { return bits == 0; }
};

struct Finding {
  DetectorKind kind;
  size_t offset;  // byte offset in the scanned text
  size_t length;  // bytes
  bool operator==(const Finding&) const = default;
};

// Scans `text` and appends the findings (in order of offset, non-overlapping) to `out`.
// Stops after `max_findings` findings in total in `out` (0 = no limit); the router only needs one.
void scan_sensitive(std::string_view text, DetectorSet enabled, std::vector<Finding>& out,
                    size_t max_findings = 0);
std::vector<Finding> scan_sensitive(std::string_view text, DetectorSet enabled = DetectorSet::all());

// Building blocks, exposed for tests.
bool luhn_valid(std::string_view digits);            // digits only
bool iban_checksum_valid(std::string_view compact);  // no spaces, upper case
int iban_country_length(char a, char b);             // 0 if the country is unknown
double shannon_entropy_bits(std::string_view s);     // bits per byte
// The opaque detector's own pass (router/opaque.cpp): appends its findings, in order of offset.
void find_opaque(std::string_view text, std::vector<Finding>& found);

namespace detail {
// scan_sensitive's loop without its fast paths (the word ends found a byte at a time, every word's shape tested): the
// definition the fast paths are tested against (tests/router/test_router_fast_paths.cpp).
void scan_sensitive_plain(std::string_view text, DetectorSet enabled, std::vector<Finding>& out, size_t max_findings = 0);
}  // namespace detail

}  // namespace lilac::router
