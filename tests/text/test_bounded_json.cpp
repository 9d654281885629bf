// parse_bounded_json: the same documents as nlohmann's parser (key order, repeated keys, numbers,
// escapes), bounded depth and value count, invalid input as a status, and key handling linear in the
// number of keys (nlohmann's ordered_json parse is quadratic in one object's keys).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/bounded_json.h"

using lilac::JsonLimits;
using lilac::JsonParseResult;
using lilac::parse_bounded_json;
using ojson = nlohmann::ordered_json;

TEST(BoundedJson, SameDocumentsAsNlohmann) {
  const char* docs[] = {
      R"({"b": 1, "a": [true, false, null, -3, 18446744073709551615, 1.5e300, "x\u00e9\ud83d\ude00"], "c": {}})",
      R"([{"z": 1, "y": 2, "z": 3}, [], [[[]]], ""])",
      R"("just a string")",
      "42",
      R"({"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,)"
      R"("k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k3":"again","k16":"again","k20":20})",
  };
  for (const char* d : docs) {
    JsonParseResult r = parse_bounded_json(d);
    ASSERT_TRUE(r.ok()) << d << ": " << r.message;
    EXPECT_EQ(r.value.dump(), ojson::parse(d).dump()) << d;
  }
}

TEST(BoundedJson, RepeatedKeyKeepsFirstPositionAndLastValue) {
  JsonParseResult r = parse_bounded_json(R"({"a": 1, "b": 2, "a": 3})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value.dump(), R"({"a":3,"b":2})");
}

TEST(BoundedJson, DepthLimit) {
  JsonLimits lim;
  lim.max_depth = 8;
  std::string ok8 = std::string(8, '[') + std::string(8, ']');
  EXPECT_TRUE(parse_bounded_json(ok8, lim).ok());
  std::string deep9 = std::string(9, '[') + std::string(9, ']');
  EXPECT_EQ(parse_bounded_json(deep9, lim).status, JsonParseResult::TooDeep);
  // 100,000 levels (what crashed the hybrid router by recursion): refused at the default depth.
  std::string deep = "{\"metadata\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  JsonParseResult r = parse_bounded_json(deep);
  EXPECT_EQ(r.status, JsonParseResult::TooDeep);
  EXPECT_NE(r.message.find("64 levels"), std::string::npos) << r.message;
  EXPECT_TRUE(r.value.is_null());
  std::string objs;
  for (int i = 0; i < 65; ++i) objs += "{\"a\":";
  objs += "1" + std::string(65, '}');
  EXPECT_EQ(parse_bounded_json(objs).status, JsonParseResult::TooDeep);
}

TEST(BoundedJson, ValueLimit) {
  JsonLimits lim;
  lim.max_values = 10;
  EXPECT_TRUE(parse_bounded_json("[1,2,3,4,5,6,7,8,9]", lim).ok());  // 10 values with the array
  EXPECT_EQ(parse_bounded_json("[1,2,3,4,5,6,7,8,9,10]", lim).status, JsonParseResult::TooManyValues);
  EXPECT_EQ(parse_bounded_json(R"({"a":1,"b":2,"c":3,"d":4,"e":5})", lim).status, JsonParseResult::TooManyValues);
}

// Keys per object: a new key past the limit fails (each object counted on its own); a repeated key does not count.
TEST(BoundedJson, ObjectKeyLimit) {
  JsonLimits lim;
  lim.max_object_keys = 3;
  EXPECT_TRUE(parse_bounded_json(R"({"a":1,"b":2,"c":3})", lim).ok());
  EXPECT_TRUE(parse_bounded_json(R"({"a":1,"b":2,"c":3,"a":4,"c":5})", lim).ok());
  EXPECT_TRUE(parse_bounded_json(R"({"a":{"x":1,"y":2,"z":3},"b":[{"x":1,"y":2,"z":3}],"c":3})", lim).ok());
  JsonParseResult r = parse_bounded_json(R"({"a":1,"b":2,"c":3,"d":4})", lim);
  EXPECT_EQ(r.status, JsonParseResult::TooManyValues);
  EXPECT_NE(r.message.find("more than 3 keys"), std::string::npos) << r.message;
  EXPECT_TRUE(r.value.is_null());
  EXPECT_EQ(parse_bounded_json(R"([{"x":1,"y":2,"z":3,"w":4}])", lim).status, JsonParseResult::TooManyValues);
  // The request limits: 16,384 keys pass, one more fails, past the linear-search size of the index too.
  EXPECT_EQ(lilac::kRequestJsonLimits.max_object_keys, 16384u);
  std::string body = "{";
  for (int i = 0; i < 16384; ++i) body += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
  EXPECT_TRUE(parse_bounded_json(body + ",\"7\":1}", lilac::kRequestJsonLimits).ok());
  EXPECT_EQ(parse_bounded_json(body + ",\"x\":1}", lilac::kRequestJsonLimits).status, JsonParseResult::TooManyValues);
}

TEST(BoundedJson, InvalidIsAStatus) {
  for (const char* bad : {"", "{", "{oops", "[1,]", "{\"a\" 1}", "1 2", "\"\xff\"", "[1] x"}) {
    JsonParseResult r = parse_bounded_json(bad);
    EXPECT_EQ(r.status, JsonParseResult::Invalid) << bad;
    EXPECT_NE(r.message.find("parse error"), std::string::npos) << r.message;
  }
}

// 400,000 keys in one object (a 4.6 MB body): the repeated-key check costs about one comparison per key,
// not one per pair of keys.
TEST(BoundedJson, KeysOfOneObjectAreLinear) {
  const size_t n = 400000;
  std::string body = "{";
  for (size_t i = 0; i < n; ++i) body += (i ? ",\"" : "\"") + std::to_string(i * 7919) + "\":0";
  body += "}";
  JsonParseResult r = parse_bounded_json(body);
  ASSERT_TRUE(r.ok()) << r.message;
  ASSERT_EQ(r.value.size(), n);
  const auto& entries = r.value.get_ref<const ojson::object_t&>();
  EXPECT_EQ(entries.front().first, "0");
  EXPECT_EQ(entries.back().first, std::to_string((n - 1) * 7919));
  EXPECT_LE(r.key_compares, 2 * n) << "repeated-key detection is not linear";
}

// parse_bounded_json_handing (Message Batches' create: up to 10,000 requests in one body): the elements of the array
// under the root object's key are handed out one at a time, in order, each complete, and the result keeps a null in
// each one's place; everything else is parse_bounded_json's document, limits and errors.
TEST(BoundedJson, HandingGivesTheElementsOfOneArrayOneAtATime) {
  std::vector<std::pair<size_t, std::string>> got;
  const lilac::JsonElementTaker take = [&](size_t i, ojson& v) { got.emplace_back(i, v.dump()); };
  const std::string doc =
      R"({"a": {"requests": [1]}, "requests": [{"x": [1, 2]}, 5, "s", [], {"requests": [9]}, null], "z": [true]})";
  JsonParseResult r = lilac::parse_bounded_json_handing(doc, {}, "requests", take);
  ASSERT_TRUE(r.ok()) << r.message;
  const std::vector<std::pair<size_t, std::string>> want = {
      {0, R"({"x":[1,2]})"}, {1, "5"}, {2, R"("s")"}, {3, "[]"}, {4, R"({"requests":[9]})"}, {5, "null"}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(r.value.dump(), R"({"a":{"requests":[1]},"requests":[null,null,null,null,null,null],"z":[true]})");
  // Not under the root object, or not an array: nothing is handed, the document is parse_bounded_json's.
  for (const char* d : {R"([{"requests": [1, 2]}])", R"({"requests": {"a": [1]}})", R"({"other": [1, 2]})", "7"}) {
    got.clear();
    JsonParseResult h = lilac::parse_bounded_json_handing(d, {}, "requests", take);
    ASSERT_TRUE(h.ok()) << d;
    EXPECT_TRUE(got.empty()) << d;
    EXPECT_EQ(h.value.dump(), parse_bounded_json(d).value.dump()) << d;
  }
  // A repeated key: each array's elements, the indexes from 0 again; the result keeps the last.
  got.clear();
  r = lilac::parse_bounded_json_handing(R"({"requests": [1, 2], "requests": [3]})", {}, "requests", take);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(got, (std::vector<std::pair<size_t, std::string>>{{0, "1"}, {1, "2"}, {0, "3"}}));
  EXPECT_EQ(r.value.dump(), R"({"requests":[null]})");
  // The limits count the elements handed out (root, key, array and 5 elements: 8 values).
  JsonLimits lim;
  lim.max_values = 7;
  EXPECT_EQ(lilac::parse_bounded_json_handing(R"({"requests": [1, 2, 3, 4, 5]})", lim, "requests", take).status,
            JsonParseResult::TooManyValues);
  lim.max_values = 8;
  EXPECT_TRUE(lilac::parse_bounded_json_handing(R"({"requests": [1, 2, 3, 4, 5]})", lim, "requests", take).ok());
  lim = JsonLimits{};
  lim.max_depth = 3;
  EXPECT_EQ(lilac::parse_bounded_json_handing(R"({"requests": [[[1]]]})", lim, "requests", take).status,
            JsonParseResult::TooDeep);
  // Elements read before an error were handed; the result is the error.
  got.clear();
  r = lilac::parse_bounded_json_handing(R"({"requests": [1, {"a": 2}, 3)", {}, "requests", take);
  EXPECT_EQ(r.status, JsonParseResult::Invalid);
  EXPECT_EQ(got, (std::vector<std::pair<size_t, std::string>>{{0, "1"}, {1, R"({"a":2})"}, {2, "3"}}));
  // The taker's exception ends the parse.
  const lilac::JsonElementTaker refuse = [](size_t i, ojson&) {
    if (i == 1) throw std::runtime_error("second");
  };
  EXPECT_THROW(lilac::parse_bounded_json_handing(R"({"requests": [1, 2, 3]})", {}, "requests", refuse), std::runtime_error);
}
