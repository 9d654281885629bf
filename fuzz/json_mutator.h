// A structure-aware mutator for targets whose input is a few choice bytes then a JSON document (request
// bodies): half the time it edits the parsed document — a value replaced by one of another type or an
// extreme one, a key of the APIs' requests added with a random value, an element removed, duplicated or
// wrapped — and writes it back, so mutations reach the validation of fields instead of dying in the
// JSON syntax; the other half it leaves to libFuzzer's byte mutations.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lilac::fuzz {

size_t mutate_json_body(uint8_t* data, size_t size, size_t max_size, unsigned seed);

}  // namespace lilac::fuzz
