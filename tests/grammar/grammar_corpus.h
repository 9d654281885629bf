// Realistic schemas with documents valid under them (as a model would write them: pretty-printed
// or compact, properties in declared order), shared by bench_grammar and the grammar tests.
#pragma once
#include <string>
#include <vector>

namespace lilac::grammar::corpus {

struct Case {
  std::string name;
  std::string schema;              // "" = response_format json_object
  std::vector<std::string> docs;
};

inline std::string fifty_property_schema() {
  std::string props, req;
  for (int i = 0; i < 50; ++i) {
    const std::string n = "field_" + std::to_string(i);
    std::string s;
    switch (i % 7) {
      case 0: s = R"({"type":"string","description":"free text"})"; break;
      case 1: s = R"({"type":"integer","minimum":0,"maximum":1000})"; break;
      case 2: s = R"({"type":"number"})"; break;
      case 3: s = R"({"type":"boolean"})"; break;
      case 4: s = R"({"enum":["low","medium","high"]})"; break;
      case 5: s = R"({"type":"string","format":"date"})"; break;
      case 6: s = R"({"type":"array","items":{"type":"string","maxLength":20},"maxItems":5})"; break;
    }
    props += (i ? "," : "") + std::string("\"") + n + "\":" + s;
    if (i % 3 != 2) req += (req.empty() ? "" : ",") + std::string("\"") + n + "\"";
  }
  return R"({"type":"object","properties":{)" + props + R"(},"required":[)" + req + "],\"additionalProperties\":false}";
}

inline std::string fifty_property_doc(bool pretty) {
  std::string out = "{";
  const std::string nl = pretty ? "\n  " : "";
  for (int i = 0; i < 50; ++i) {
    std::string v;
    switch (i % 7) {
      case 0: v = "\"The quick brown fox number " + std::to_string(i) + " jumps over the lazy dog.\""; break;
      case 1: v = std::to_string(i * 17 % 1000); break;
      case 2: v = std::to_string(i) + ".25"; break;
      case 3: v = i % 2 ? "true" : "false"; break;
      case 4: v = "\"medium\""; break;
      case 5: v = "\"2024-0" + std::to_string(1 + i % 9) + "-1" + std::to_string(i % 10) + "\""; break;
      case 6: v = R"(["alpha", "beta", "gamma"])"; break;
    }
    out += (i ? "," : "") + nl + "\"field_" + std::to_string(i) + "\":" + (pretty ? " " : "") + v;
  }
  return out + (pretty ? "\n}" : "}");
}

inline std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"nested_objects",
               R"({"type":"object","properties":{
                   "name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
                   "email":{"type":"string","format":"email"},
                   "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
                      "zip":{"type":"string","pattern":"^[0-9]{5}$"},"country":{"type":"string","minLength":2,"maxLength":2}},
                      "required":["street","city","country"],"additionalProperties":false},
                   "tags":{"type":"array","items":{"type":"string"}}},
                 "required":["name","age","address"],"additionalProperties":false})",
               {"{\n  \"name\": \"Ada Lovelace\",\n  \"age\": 36,\n  \"email\": \"ada@example.org\",\n  \"address\": {\n"
                "    \"street\": \"12 St James's Square\",\n    \"city\": \"London\",\n    \"zip\": \"02139\",\n"
                "    \"country\": \"GB\"\n  },\n  \"tags\": [\"mathematician\", \"writer\"]\n}",
                R"({"name": "Grace Hopper", "age": 85, "address": {"street": "Navy Yard", "city": "Arlington", "country": "US"}})"}});
  c.push_back({"array_of_objects",
               R"({"type":"object","properties":{"items":{"type":"array","minItems":1,"items":{"type":"object",
                   "properties":{"sku":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{4}$"},"description":{"type":"string"},
                   "quantity":{"type":"integer","minimum":1},"price":{"type":"number"},"in_stock":{"type":"boolean"}},
                   "required":["sku","quantity","price"],"additionalProperties":false}},
                   "total":{"type":"number"}},"required":["items","total"],"additionalProperties":false})",
               {"{\n  \"items\": [\n    {\n      \"sku\": \"ABC-1234\",\n      \"description\": \"Stainless steel water bottle, 750 ml\",\n"
                "      \"quantity\": 2,\n      \"price\": 19.99,\n      \"in_stock\": true\n    },\n    {\n"
                "      \"sku\": \"XYZ-0042\",\n      \"quantity\": 1,\n      \"price\": 5.5\n    }\n  ],\n  \"total\": 45.48\n}",
                R"({"items":[{"sku":"QQQ-9999","description":"Replacement filter","quantity":12,"price":3.25,"in_stock":false}],"total":39})"}});
  c.push_back({"enums",
               R"({"type":"object","properties":{"sentiment":{"enum":["positive","negative","neutral"]},
                   "confidence":{"type":"number"},"category":{"type":"string","enum":["billing","technical","account","other"]},
                   "priority":{"enum":[1,2,3]},"escalate":{"type":"boolean"},"language":{"const":"en"}},
                   "required":["sentiment","category","priority","escalate"],"additionalProperties":false})",
               {"{\n  \"sentiment\": \"negative\",\n  \"confidence\": 0.92,\n  \"category\": \"billing\",\n  \"priority\": 2,\n"
                "  \"escalate\": true,\n  \"language\": \"en\"\n}",
                R"({"sentiment": "neutral", "category": "other", "priority": 3, "escalate": false})"}});
  c.push_back({"formats_and_patterns",
               R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},
                   "created":{"type":"string","format":"date-time"},"due":{"type":"string","format":"date"},
                   "reminder":{"type":"string","format":"time"},"owner":{"type":"string","format":"email"},
                   "phone":{"type":"string","pattern":"^\\+?[0-9]{1,3}[- ]?[0-9]{3}[- ]?[0-9]{3,4}$"},
                   "code":{"type":"string","pattern":"^[a-z][a-z0-9_]{2,15}$"},
                   "title":{"type":"string","minLength":1,"maxLength":80}},
                   "required":["id","created","owner","title"],"additionalProperties":false})",
               {"{\n  \"id\": \"123e4567-e89b-12d3-a456-426614174000\",\n  \"created\": \"2024-02-29T13:45:00Z\",\n"
                "  \"due\": \"2024-12-31\",\n  \"reminder\": \"09:30:00+02:00\",\n  \"owner\": \"j.doe@mail.example.com\",\n"
                "  \"phone\": \"+1 555-1234\",\n  \"code\": \"release_2024\",\n  \"title\": \"Quarterly report: revenue, costs and outlook\"\n}",
                R"({"id":"00000000-0000-4000-8000-00000000abcd","created":"2023-11-05T08:00:00.123+01:00","owner":"x@y.io","title":"Hi"})"}});
  c.push_back({"fifty_properties", fifty_property_schema(), {fifty_property_doc(true), fifty_property_doc(false)}});
  c.push_back({"recursive_ref",
               R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"name":{"type":"string"},
                   "size":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
                   "required":["name"],"additionalProperties":false}}})",
               {"{\n  \"name\": \"root\",\n  \"children\": [\n    {\n      \"name\": \"src\",\n      \"children\": [\n"
                "        {\"name\": \"main.cpp\", \"size\": 1204},\n        {\"name\": \"util.h\", \"size\": 88}\n      ]\n"
                "    },\n    {\n      \"name\": \"README.md\",\n      \"size\": 4096\n    }\n  ]\n}",
                R"({"name":"a","children":[{"name":"b","children":[{"name":"c","children":[{"name":"d"}]}]}]})"}});
  c.push_back({"anyof_nullable",
               R"({"type":"object","properties":{"result":{"anyOf":[{"type":"object","properties":{"value":{"type":"number"},
                   "unit":{"type":"string"}},"required":["value","unit"],"additionalProperties":false},{"type":"null"}]},
                   "error":{"anyOf":[{"type":"string"},{"type":"null"}]},
                   "kind":{"oneOf":[{"const":"measurement"},{"const":"estimate"}]}},
                   "required":["result","error","kind"],"additionalProperties":false})",
               {"{\n  \"result\": {\n    \"value\": 9.81,\n    \"unit\": \"m/s^2\"\n  },\n  \"error\": null,\n  \"kind\": \"measurement\"\n}",
                R"({"result": null, "error": "sensor offline since 04:00 UTC", "kind": "estimate"})"}});
  c.push_back({"json_object", "",
               {"{\n  \"title\": \"Les Misérables\",\n  \"author\": \"Victor Hugo\",\n  \"year\": 1862,\n  \"genres\": [\"historical\", \"drama\"],\n"
                "  \"ratings\": {\"goodreads\": 4.2, \"amazon\": null},\n  \"summary\": \"Jean Valjean, an ex-convict, \\\"rises\\\" — 世界 — to redemption.\\n\"\n}",
                R"({"ok":true,"data":[1,2.5,-3e2,{"k":[]},"x"],"note":""})"}});
  return c;
}

}  // namespace lilac::grammar::corpus
