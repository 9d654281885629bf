// Sensitive-data detectors: a table of positive and negative examples for every kind, near misses included.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "router/detectors.h"

using namespace lilac::router;

namespace {

struct Case {
  const char* text;
  const char* kind;    // expected kind of the single finding, or nullptr for "no finding at all"
  const char* match;   // expected matched substring (when kind is set)
};

std::string describe(const std::string& text, const std::vector<Finding>& f) {
  std::string s = "text: [" + text + "] findings:";
  for (const auto& x : f)
    s += std::string(" ") + detector_name(x.kind) + "@" + std::to_string(x.offset) + "+" +
         std::to_string(x.length) + "=[" + text.substr(x.offset, x.length) + "]";
  return s;
}

// Base64 of `bytes` (standard alphabet, padded); a line break every `wrap` characters (0: none).
std::string base64(const std::string& bytes, size_t wrap = 0) {
  static const char* kAlpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string flat;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < n ? uint8_t(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) flat += k <= n ? kAlpha[(v >> (18 - 6 * k)) & 63] : '=';
  }
  if (!wrap) return flat;
  std::string out;
  for (size_t i = 0; i < flat.size(); i += wrap) out += (i ? "\n" : "") + flat.substr(i, wrap);
  return out;
}

// A PNG-like payload: the signature, then `n` pseudo-random bytes.
std::string png_bytes(size_t n, unsigned seed = 1) {
  std::mt19937 rng(seed);
  std::string b = "\x89PNG\r\n\x1a\n";
  for (size_t i = 0; i < n; ++i) b += char(rng() & 0xFF);
  return b;
}

const std::string kPngB64 = base64(png_bytes(900));
const std::string kPngDataUrl = "see data:image/png;base64," + kPngB64 + " here";
std::string random_dna(size_t n) {
  std::mt19937 rng(7);
  std::string d;
  for (size_t i = 0; i < n; ++i) d += "ACGT"[rng() & 3];
  return d;
}
const std::string kDna = "sequence " + random_dna(2000) + " end";

const Case kCases[] = {
    // ---- e-mail
    {"write to john.doe@example.com please", "email", "john.doe@example.com"},
    {"<a.b+tag@mail.sub.example.co.uk>", "email", "a.b+tag@mail.sub.example.co.uk"},
    {"x_y-z99@corp-mail.io.", "email", "x_y-z99@corp-mail.io"},
    {"user@localhost is not an address", nullptr, nullptr},
    {"the handle @someone on social", nullptr, nullptr},
    {"git@github", nullptr, nullptr},
    {"a@b.c", nullptr, nullptr},  // one-letter TLD
    {"price 5@3.50 each", nullptr, nullptr},
    // ---- phone
    {"call +1 (415) 555-2671 now", "phone", "+1 (415) 555-2671"},
    {"+44 20 7946 0958", "phone", "+44 20 7946 0958"},
    {"tel:+4915112345678", "phone", "+4915112345678"},
    {"+33 6 12 34 56 78", "phone", "+33 6 12 34 56 78"},
    {"Phone: (415) 555-2671.", "phone", "(415) 555-2671"},
    {"415-555-2671", "phone", "415-555-2671"},
    {"415.555.2671", "phone", "415.555.2671"},
    {"1 415 555 2671", "phone", "1 415 555 2671"},
    {"020 7946 0958", "phone", "020 7946 0958"},
    {"06 12 34 56 78", "phone", "06 12 34 56 78"},
    {"030 1234567", "phone", "030 1234567"},
    {"order 4155552671 shipped", nullptr, nullptr},  // plain number
    {"on 2024-01-15 at noon", nullptr, nullptr},      // date
    {"on 15.01.2024", nullptr, nullptr},              // date
    {"version 10.0.19041.1", nullptr, nullptr},       // version
    {"v1.2.3", nullptr, nullptr},
    {"123-456-7890", nullptr, nullptr},  // NANP area codes never start with 1
    {"3+4 = 7", nullptr, nullptr},
    {"+12 points", nullptr, nullptr},
    {"1 234 567 890 dollars", nullptr, nullptr},  // thousands separated by spaces
    // ---- payment cards
    {"card 4111 1111 1111 1111 exp 12/27", "card", "4111 1111 1111 1111"},
    {"4111-1111-1111-1111", "card", "4111-1111-1111-1111"},
    {"5555555555554444", "card", "5555555555554444"},
    {"amex 3782 822463 10005", "card", "3782 822463 10005"},
    {"6011111111111117.", "card", "6011111111111117"},
    // A card inside a longer run of digit groups (found by the detectors fuzz target: the run was read as one
    // number, failed, and hid the card): its expiry after it, a group or a stray digit before or after it.
    {"card 4111 1111 1111 1111 12/27", "card", "4111 1111 1111 1111"},
    {"5555555555554444 12/27", "card", "5555555555554444"},
    {"ref 4111 4111 1111 1111 1111", "card", "4111 1111 1111 1111"},
    {"11 4111 1111 1111 1111 111", "card", "4111 1111 1111 1111"},
    {"411 5555555555554444 1 and", "card", "5555555555554444"},
    {"4111-1111-1111-1111-77", "card", "4111-1111-1111-1111"},
    {"4111 1111 1111 1112 12/27", nullptr, nullptr},
    {"DE33 5555555555554444 44", "card", "5555555555554444"},  // a card inside an IBAN-shaped near miss
    {"8 5555555555554444 88888888888888888888888888", "card", "5555555555554444"},  // then a longer number
    // A phone number followed by more digit groups or by a '(' that opens no group (the detectors fuzz target).
    {"+44 20 7946 0958 390973623", "phone", "+44 20 7946 0958"},
    {"call +44 20 7946 0958 (office)", "phone", "+44 20 7946 0958"},
    {"call 415 555 2671 12 times", "phone", "415 555 2671"},
    {"4111 1111 1111 1112", nullptr, nullptr},  // Luhn fails
    {"5555555555554445", nullptr, nullptr},     // Luhn fails
    {"1111111111111111111111", nullptr, nullptr},  // too long
    {"id 7992739871300001", nullptr, nullptr},     // valid Luhn but no card network starts with 7
    {"411111111111", nullptr, nullptr},            // 12 digits
    // ---- IBAN
    {"IBAN: DE89 3704 0044 0532 0130 00 thanks", "iban", "DE89 3704 0044 0532 0130 00"},
    {"GB82WEST12345698765432", "iban", "GB82WEST12345698765432"},
    {"pay FR1420041010050500013M02606.", "iban", "FR1420041010050500013M02606"},
    {"NL91ABNA0417164300", "iban", "NL91ABNA0417164300"},
    {"DE89 3704 0044 0532 0130 01", nullptr, nullptr},  // checksum fails
    {"GB82WEST12345698765433", nullptr, nullptr},       // checksum fails
    {"DE89370400440532013", nullptr, nullptr},          // too short for DE
    {"ZZ12 3456 7890 1234 56", nullptr, nullptr},       // unknown country
    // ---- US SSN
    {"SSN 123-45-6789", "ssn", "123-45-6789"},
    {"ssn: 078 05 1120", "ssn", "078 05 1120"},
    {"000-12-3456", nullptr, nullptr},
    {"666-12-3456", nullptr, nullptr},
    {"912-34-5678", nullptr, nullptr},
    {"123-00-4567", nullptr, nullptr},
    {"123-45-0000", nullptr, nullptr},
    {"123-45-67890", nullptr, nullptr},
    {"ref 1234-56-7890", nullptr, nullptr},
    // ---- IPv4
    {"server at 192.168.1.20:8080", "ipv4", "192.168.1.20"},
    {"ping 8.8.8.8", "ipv4", "8.8.8.8"},
    {"255.255.255.0/24", "ipv4", "255.255.255.0"},
    {"999.1.1.1", nullptr, nullptr},
    {"256.1.1.1", nullptr, nullptr},
    {"1.2.3", nullptr, nullptr},
    {"1.2.3.4.5", nullptr, nullptr},
    {"v1.2.3.4", nullptr, nullptr},
    {"01.2.3.4", nullptr, nullptr},
    // ---- IPv6
    {"host 2001:db8:85a3::8a2e:370:7334 up", "ipv6", "2001:db8:85a3::8a2e:370:7334"},
    {"2001:0db8:0000:0000:0000:ff00:0042:8329", "ipv6", "2001:0db8:0000:0000:0000:ff00:0042:8329"},
    {"link fe80::1ff:fe23:4567:890a%eth0", "ipv6", "fe80::1ff:fe23:4567:890a"},
    {"::ffff:192.0.2.128", "ipv6", "::ffff:192.0.2.128"},
    {"at 12:30:45 today", nullptr, nullptr},
    {"std::string and a::b", nullptr, nullptr},
    {"MAC 00:1a:2b:3c:4d:5e", nullptr, nullptr},
    {"1:2:3:4:5:6:7:8:9", nullptr, nullptr},
    {"2001:db8::1::2", nullptr, nullptr},
    // ---- private keys
    {"key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n", "private_key",
     "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"},
    {"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----", "private_key",
     "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----"},
    {"truncated -----BEGIN PRIVATE KEY----- ...", "private_key", "-----BEGIN PRIVATE KEY-----"},
    {"-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----", nullptr, nullptr},
    {"-----BEGIN CERTIFICATE-----", nullptr, nullptr},
    // ---- API keys
    {"OPENAI_API_KEY=sk-proj-4fJ9aQ2LmZx8TtR1vB6nW3yK", "api_key", "sk-proj-4fJ9aQ2LmZx8TtR1vB6nW3yK"},
    {"token ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "api_key", "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"},
    {"gho_16C7e42F292c6912E7710c838347Ae178B4a", "api_key", "gho_16C7e42F292c6912E7710c838347Ae178B4a"},
    {"github_pat_11ABCDEFG0123456789_abcdefghij", "api_key", "github_pat_11ABCDEFG0123456789_abcdefghij"},
    {"slack xoxb-2400-1234-abcdefabcdef ok", "api_key", "xoxb-2400-1234-abcdefabcdef"},
    {"aws AKIAIOSFODNN7EXAMPLE key", "api_key", "AKIAIOSFODNN7EXAMPLE"},
    {"AIzaSyA-1234567890abcdefghijklmnopqrstu", "api_key", "AIzaSyA-1234567890abcdefghijklmnopqrstu"},
    {"glpat-xxxxxxxxxxxxxxxxxxxx", "api_key", "glpat-xxxxxxxxxxxxxxxxxxxx"},
    {"hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "api_key", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"},
    {"sk_live_51HxxxxxxxxxxxxxxxxxxxxX", "api_key", "sk_live_51HxxxxxxxxxxxxxxxxxxxxX"},
    {"Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
     "api_key",
     "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"},
    {"pip install scikit-learn; sk-learn is short", nullptr, nullptr},
    {"task-sk-1234567890123456789012345", nullptr, nullptr},  // prefix glued to a word
    {"AKIA1234", nullptr, nullptr},
    {"the ghp_ prefix alone", nullptr, nullptr},
    // ---- high-entropy tokens
    {"secret: Xk9fLm2QpR7sT1vW3yZ5bC8dE0gH end", "high_entropy", "Xk9fLm2QpR7sT1vW3yZ5bC8dE0gH"},
    {"aB3dE5gH7jK9mN1pQ3sT5vW7", "high_entropy", "aB3dE5gH7jK9mN1pQ3sT5vW7"},
    {"commit 3f786850e387550fdab836ed7e6dc881de23001b", nullptr, nullptr},  // git SHA: hex, one case
    {"id 123e4567-e89b-12d3-a456-426614174000", nullptr, nullptr},          // UUID
    {"getUserAccountBalance2024ByRegion", nullptr, nullptr},                 // identifier
    {"HTTPServerConfiguration2ForUsers", nullptr, nullptr},
    {"test_UserAccountManager_2024_v2", nullptr, nullptr},
    {"aB3dE5gH7jK9mN1pQ3sT5v", nullptr, nullptr},  // 22 chars: too short
    {"ABCDEFGHIJKLMNOPQRSTUVWXYZ012345", nullptr, nullptr},  // no lower case
    // ---- plain prose
    {"The quick brown fox jumps over the lazy dog. Meeting at 10:30, room 4.2, budget $1,250.00.", nullptr,
     nullptr},
    {"", nullptr, nullptr},
    // ---- opaque (base64 that is not text; the findings of other detectors inside it are part of it)
    {kPngDataUrl.c_str(), "opaque", kPngB64.c_str()},
    {kDna.c_str(), nullptr, nullptr},
};

}  // namespace

TEST(Detectors, TableOfPositiveAndNegativeExamples) {
  int checked = 0;
  for (const auto& c : kCases) {
    std::string text = c.text;
    auto f = scan_sensitive(text);
    if (!c.kind) {
      EXPECT_TRUE(f.empty()) << describe(text, f);
      continue;
    }
    EXPECT_EQ(f.size(), 1u) << describe(text, f);
    if (f.size() != 1) continue;
    EXPECT_STREQ(detector_name(f[0].kind), c.kind) << describe(text, f);
    EXPECT_EQ(text.substr(f[0].offset, f[0].length), c.match) << describe(text, f);
    ++checked;
  }
  // Every kind has at least one positive example.
  for (int k = 0; k < kDetectorKindCount; ++k) {
    bool seen = false;
    for (const auto& c : kCases)
      if (c.kind && std::string(c.kind) == detector_name(static_cast<DetectorKind>(k))) seen = true;
    EXPECT_TRUE(seen) << detector_name(static_cast<DetectorKind>(k));
  }
  EXPECT_GT(checked, 45);
}

TEST(Detectors, DisabledDetectorsFindNothing) {
  std::string text = "mail john@example.com card 4111111111111111 ip 10.0.0.1";
  DetectorSet only_ip = DetectorSet::none();
  only_ip.set(DetectorKind::ipv4, true);
  auto f = scan_sensitive(text, only_ip);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, DetectorKind::ipv4);
  EXPECT_EQ(text.substr(f[0].offset, f[0].length), "10.0.0.1");
  EXPECT_TRUE(scan_sensitive(text, DetectorSet::none()).empty());
}

TEST(Detectors, SeveralFindingsInOrderWithOffsets) {
  std::string text = "a@b.io, 4111111111111111, 123-45-6789 and 10.1.2.3";
  auto f = scan_sensitive(text);
  ASSERT_EQ(f.size(), 4u) << describe(text, f);
  EXPECT_EQ(f[0], (Finding{DetectorKind::email, 0, 6}));
  EXPECT_EQ(f[1], (Finding{DetectorKind::card, 8, 16}));
  EXPECT_EQ(f[2], (Finding{DetectorKind::ssn, 26, 11}));
  EXPECT_EQ(f[3], (Finding{DetectorKind::ipv4, 42, 8}));
  std::vector<Finding> one;
  scan_sensitive(text, DetectorSet::all(), one, 1);
  EXPECT_EQ(one.size(), 1u);
}

TEST(Detectors, ChecksumHelpers) {
  EXPECT_TRUE(luhn_valid("79927398713"));
  EXPECT_FALSE(luhn_valid("79927398710"));
  EXPECT_FALSE(luhn_valid(""));
  EXPECT_TRUE(iban_checksum_valid("GB82WEST12345698765432"));
  EXPECT_FALSE(iban_checksum_valid("GB82WEST12345698765423"));
  EXPECT_EQ(iban_country_length('D', 'E'), 22);
  EXPECT_EQ(iban_country_length('N', 'O'), 15);
  EXPECT_EQ(iban_country_length('Z', 'Z'), 0);
  EXPECT_DOUBLE_EQ(shannon_entropy_bits("aaaa"), 0.0);
  EXPECT_DOUBLE_EQ(shannon_entropy_bits("abcd"), 2.0);
  DetectorKind k;
  EXPECT_TRUE(detector_from_name("iban", &k));
  EXPECT_EQ(k, DetectorKind::iban);
  EXPECT_FALSE(detector_from_name("passport", &k));
}

TEST(Detectors, RandomSecretsAreFoundInsideProse) {
  // Random base62 tokens of 32 chars are found (rarely one lacks a class; the test draws until it has all).
  std::mt19937 rng(12345);
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  int found = 0, tried = 0;
  for (int t = 0; t < 200; ++t) {
    std::string tok;
    for (int i = 0; i < 32; ++i) tok += alphabet[rng() % alphabet.size()];
    bool up = false, lo = false, dg = false;
    for (char c : tok) up |= isupper(c), lo |= islower(c), dg |= isdigit(c);
    if (!(up && lo && dg)) continue;
    ++tried;
    std::string text = "please use the token " + tok + " for the staging deploy";
    auto f = scan_sensitive(text);
    if (f.size() == 1 && f[0].kind == DetectorKind::high_entropy && f[0].offset == 21 && f[0].length == 32)
      ++found;
  }
  EXPECT_GE(found, tried * 97 / 100) << found << "/" << tried;
}

TEST(Detectors, AdversarialInputStaysLinear) {
  // Many "-----BEGIN " without an END, and a long hyphenated run, must not blow up.
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "-----BEGIN X PRIVATE KEY----- ";
  auto f = scan_sensitive(text);
  EXPECT_EQ(f.size(), 2000u);
  std::string hy;
  for (int i = 0; i < 50000; ++i) hy += "a-";
  EXPECT_TRUE(scan_sensitive(hy).empty());
  std::string digits(100000, '7');
  EXPECT_TRUE(scan_sensitive(digits).empty());
}

// The opaque detector: a binary payload of >= 1,024 base64 characters is found whole (MIME line breaks inside, padding
// at its end), with high_entropy off; base64 of text, shorter payloads, DNA and hex are not.
TEST(Detectors, OpaquePayloads) {
  DetectorSet en = DetectorSet::all();
  en.set(DetectorKind::high_entropy, false);
  const std::string wrapped = base64(png_bytes(1000, 2), 76);
  ASSERT_NE(wrapped.find('\n'), std::string::npos);
  std::string text = "a@b.io first " + kPngB64 + " then " + wrapped + " bye";
  auto f = scan_sensitive(text, en);
  ASSERT_EQ(f.size(), 3u) << describe(text, f);
  EXPECT_EQ(f[0].kind, DetectorKind::email);
  EXPECT_EQ(f[1], (Finding{DetectorKind::opaque, text.find(kPngB64), kPngB64.size()}));
  EXPECT_EQ(f[2], (Finding{DetectorKind::opaque, text.find(wrapped), wrapped.size()}));
  std::vector<Finding> one;
  scan_sensitive(text, en, one, 1);
  EXPECT_EQ(one, std::vector<Finding>{f[0]});

  std::string prose;
  while (prose.size() < 3000) prose += "The quarterly report is attached; nothing in it is secret at all. ";
  EXPECT_TRUE(scan_sensitive(base64(prose), en).empty());
  EXPECT_TRUE(scan_sensitive(base64(png_bytes(600)), en).empty());  // 812 characters: below the threshold
  std::string hex;
  for (unsigned char c : png_bytes(1200)) hex += "0123456789abcdef"[c >> 4], hex += "0123456789abcdef"[c & 15];
  EXPECT_TRUE(scan_sensitive(hex, en).empty());
  DetectorSet off = en;
  off.set(DetectorKind::opaque, false);
  EXPECT_TRUE(scan_sensitive("first " + kPngB64, off).empty());

  // A PEM private key's body is a payload too: of two findings that overlap the longer stays, so the key is still a
  // private_key (opaque took its place, and it named the route's reason).
  const std::string pem = "key: -----BEGIN RSA PRIVATE KEY-----\n" + base64(png_bytes(1200, 3), 64) +
                          "\n-----END RSA PRIVATE KEY----- done";
  for (DetectorSet set : {DetectorSet::all(), en}) {
    auto k = scan_sensitive(pem, set);
    ASSERT_EQ(k.size(), 1u) << describe(pem, k);
    EXPECT_EQ(k[0].kind, DetectorKind::private_key) << describe(pem, k);
    std::vector<Finding> first;
    scan_sensitive(pem, set, first, 1);
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first[0].kind, DetectorKind::private_key);
  }
}
