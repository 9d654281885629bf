// JSON as text, where its strings may hold bytes that are not UTF-8. Such bytes come from outside lilac: a model's
// token can be part of a character (U+10FFFD's first token is the lone byte 0xF4) and a backend's error may quote
// one, an upstream's answer may be in any encoding, and text cut at a byte count may end inside a character.
// nlohmann's plain dump() throws on them ([json.exception.type_error.316]); dump_json writes U+FFFD for them (and is
// the plain dump for valid UTF-8), and never throws on bytes.
//
// The rule: from text/ up (text, grammar, engine, server, router, cli), JSON becomes text only through dump_json:
// what is sent, what a store measures, a forwarded body, a cache key, a value quoted in a message. Only model/ (below
// text/: config.json and checkpoint headers lilac reads and writes) dumps with nlohmann's own call.
// tests/text/test_json_dump.cpp checks the rule over the sources.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace lilac {

// `indent` as nlohmann's: -1 compact, else that many spaces per level with newlines.
inline std::string dump_json(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}
inline std::string dump_json(const nlohmann::ordered_json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace lilac
