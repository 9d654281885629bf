// Route policy parsing: every field, defaults, and the errors for bad values.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "router/route_policy.h"

using namespace lilac::router;
using json = nlohmann::json;

TEST(RoutePolicy, DefaultsWhenEmpty) {
  RoutePolicy p = parse_route_policy(json::object());
  EXPECT_EQ(p.default_route, Route::cloud);
  EXPECT_EQ(p.detectors.bits, DetectorSet::all().bits);
  EXPECT_TRUE(p.rules.empty());
  EXPECT_EQ(p.max_local_prompt_bytes, 0u);
  EXPECT_TRUE(p.upstream_failure_to_local);
  EXPECT_TRUE(p.local_busy_to_cloud);
  EXPECT_FALSE(p.allow_explicit_cloud_for_sensitive);
  EXPECT_TRUE(p.sticky);
  EXPECT_EQ(p.model_prefix, "cloud/");
}

TEST(RoutePolicy, FullDocument) {
  json doc = json::parse(R"({
    "default_route": "auto",
    "detectors": {"ipv4": false, "high_entropy": false},
    "rules": [
      {"name": "projects", "keywords": ["Project Falcon", "internal only"]},
      {"name": "employee-ids", "regex": ["\\bEMP-\\d{6}\\b"], "case_insensitive": false}
    ],
    "max_local_prompt_bytes": 200000,
    "max_local_prompt_tokens": 30000,
    "models": [{"match": "cloud/*", "routes": ["cloud", "local"]}, {"match": "secret-*", "routes": ["local"]}],
    "allow_explicit_cloud_for_sensitive": true,
    "fallback": {"upstream_failure_to_local": false, "local_busy_to_cloud": false},
    "sticky": {"enabled": true, "max_entries": 10},
    "upstream": {"model_prefix": "up/", "connect_timeout_ms": 500, "read_timeout_ms": 9000,
                 "models_timeout_ms": 700, "models_cache_s": 5, "drop_fields": ["top_k", "min_p"]}
  })");
  RoutePolicy p = parse_route_policy(doc);
  EXPECT_EQ(p.default_route, Route::auto_);
  EXPECT_FALSE(p.detectors.has(DetectorKind::ipv4));
  EXPECT_FALSE(p.detectors.has(DetectorKind::high_entropy));
  EXPECT_TRUE(p.detectors.has(DetectorKind::email));
  ASSERT_EQ(p.rules.size(), 2u);
  EXPECT_EQ(p.rules[0].name(), "projects");
  EXPECT_TRUE(p.rules[0].case_insensitive());
  EXPECT_TRUE(p.rules[0].matches("about PROJECT FALCON today", "about project falcon today"));
  EXPECT_FALSE(p.rules[0].matches("about falcons", "about falcons"));
  EXPECT_FALSE(p.rules[1].case_insensitive());
  EXPECT_TRUE(p.rules[1].matches("id EMP-123456.", "id emp-123456."));
  EXPECT_FALSE(p.rules[1].matches("id emp-123456.", "id emp-123456."));
  EXPECT_FALSE(p.rules[1].matches("id EMP-1234567", "id emp-1234567"));
  EXPECT_EQ(p.max_local_prompt_bytes, 200000u);
  EXPECT_EQ(p.max_local_prompt_tokens, 30000u);
  ASSERT_EQ(p.models.size(), 2u);
  const ModelRule* r = p.model_rule("secret-llm");
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->allow_local);
  EXPECT_FALSE(r->allow_cloud);
  EXPECT_EQ(p.model_rule("cloud/gpt-4o"), &p.models[0]);
  EXPECT_EQ(p.model_rule("lilac"), nullptr);
  EXPECT_TRUE(p.allow_explicit_cloud_for_sensitive);
  EXPECT_FALSE(p.upstream_failure_to_local);
  EXPECT_FALSE(p.local_busy_to_cloud);
  EXPECT_EQ(p.sticky_max_entries, 10u);
  EXPECT_EQ(p.model_prefix, "up/");
  EXPECT_EQ(p.connect_timeout_ms, 500);
  EXPECT_EQ(p.read_timeout_ms, 9000);
  EXPECT_EQ(p.models_timeout_ms, 700);
  EXPECT_EQ(p.models_cache_s, 5);
  EXPECT_EQ(p.drop_fields, (std::vector<std::string>{"top_k", "min_p"}));
}

TEST(RoutePolicy, DetectorListEnablesOnlyThose) {
  RoutePolicy p = parse_route_policy(json::parse(R"({"detectors": ["email", "card"]})"));
  EXPECT_TRUE(p.detectors.has(DetectorKind::email));
  EXPECT_TRUE(p.detectors.has(DetectorKind::card));
  EXPECT_FALSE(p.detectors.has(DetectorKind::phone));
  EXPECT_FALSE(p.detectors.has(DetectorKind::api_key));
  RoutePolicy none = parse_route_policy(json::parse(R"({"detectors": [], "sticky": false})"));
  EXPECT_TRUE(none.detectors.empty());
  EXPECT_FALSE(none.sticky);
}

TEST(RoutePolicy, BadValuesAreInputErrorsNamingTheField) {
  auto err = [](const char* text) -> std::string {
    try {
      parse_route_policy(json::parse(text), "policy.json");
    } catch (const lilac::InputError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(err(R"({"default_route": "moon"})").find("policy.json.default_route"), std::string::npos);
  EXPECT_NE(err(R"({"defualt_route": "local"})").find("unknown key 'defualt_route'"), std::string::npos);
  EXPECT_NE(err(R"({"detectors": ["email", "passport"]})").find("unknown detector"), std::string::npos);
  EXPECT_NE(err(R"({"rules": [{"name": "x", "regex": ["(unclosed"]}]})").find("bad regex"), std::string::npos);
  EXPECT_NE(err(R"({"rules": [{"name": "x"}]})").find("needs \"keywords\" or \"regex\""), std::string::npos);
  EXPECT_NE(err(R"({"models": [{"match": "x", "routes": []}]})").find("at least one route"), std::string::npos);
  EXPECT_NE(err(R"({"models": [{"match": "x", "routes": ["auto"]}]})").find("unknown route"), std::string::npos);
  EXPECT_NE(err(R"({"max_local_prompt_bytes": -3})").find("non-negative integer"), std::string::npos);
  EXPECT_NE(err(R"({"fallback": {"upstream_failure_to_local": "yes"}})").find("true or false"), std::string::npos);
  EXPECT_NE(err(R"({"upstream": {"read_timeout_ms": 0}})").find("between 1 and"), std::string::npos);
  EXPECT_NE(err(R"([1, 2])").find("must be a JSON object"), std::string::npos);
}

TEST(RoutePolicy, LoadsFileWithComments) {
  std::string path = ::testing::TempDir() + "/lilac_policy_test.json";
  {
    std::ofstream f(path);
    f << "// hybrid policy\n{\"default_route\": \"local\", /* keep it */ \"max_local_prompt_tokens\": 12}\n";
  }
  RoutePolicy p = load_route_policy_file(path);
  EXPECT_EQ(p.default_route, Route::local);
  EXPECT_EQ(p.max_local_prompt_tokens, 12u);
  std::remove(path.c_str());
  EXPECT_THROW(load_route_policy_file(path), lilac::InputError);
}

TEST(RoutePolicy, GlobAndRouteNames) {
  EXPECT_TRUE(glob_match("cloud/*", "cloud/gpt-4o"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXXbYY"));
  EXPECT_FALSE(glob_match("lilac", "lilac2"));
  Route r;
  EXPECT_TRUE(parse_route("CLOUD", &r));
  EXPECT_EQ(r, Route::cloud);
  EXPECT_FALSE(parse_route("remote", &r));
  EXPECT_STREQ(route_name(Route::auto_), "auto");
}

TEST(RoutePolicy, UnicodeRegexAndInvalidUtf8DoNotBreakMatching) {
  UserRule rule("names", {}, {"Müller"}, true);
  EXPECT_TRUE(rule.matches("Herr MÜLLER kommt", "herr mÜller kommt"));
  std::string bad = "abc\xff\xfe Müller";
  EXPECT_TRUE(rule.matches(bad, bad));
  EXPECT_FALSE(rule.matches("Herr Meier", "herr meier"));
}
