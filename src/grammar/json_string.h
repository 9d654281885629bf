// The body of a JSON string literal as a byte automaton: well-formed UTF-8 (no overlongs, no
// surrogates, nothing above U+10FFFF), no raw control characters, every escape of RFC 8259
// (\" \\ \/ \b \f \n \r \t \uXXXX); a \u escape of a high surrogate must be followed by one of a
// low surrogate (the pair is one character), a lone low surrogate is rejected.
//
// Each move reports whether it completed a character, so the same automaton counts characters
// (code points, as JSON Schema's minLength / maxLength do) for the implicit String rule kind:
// state 0 = before the opening quote, 1 = after the closing quote, 2 + k * kSubStates + sub =
// inside, k characters so far, at substate `sub`.
#pragma once
#include <cstdint>

namespace lilac::grammar::jstr {

enum Sub : uint8_t {
  N,                   // between characters
  C1, C2, C3,          // UTF-8: 1, 2 or 3 continuation bytes to go
  E0, ED, F0, F4,      // UTF-8 after a lead byte whose next byte has a restricted range
  Esc,                 // after a backslash
  U0, U1, U2, U3,      // \u with 0..3 hex digits read (non-surrogate or undecided)
  UD,                  // \uD: surrogate or not decided by the next digit
  H2, H3,              // \uD8.. high surrogate, 2 or 3 hex digits read
  HP,                  // complete high surrogate escape, a low one must follow
  L0, L1, L2, L3, L4,  // the low surrogate escape: after '\', 'u', 'D', [C-F], one more hex
  kSubStates
};

enum class MoveKind : uint8_t { Dead, Partial, Char, Close };

struct Move {
  MoveKind kind = MoveKind::Dead;
  Sub next = N;
};

// The move from substate `s` on byte `b`.
const Move& move(Sub s, uint8_t b);

// A character is under way (at least one more byte must come before it counts).
inline bool pending(Sub s) { return s != N; }

constexpr int32_t kOpen = 0, kClosed = 1;
inline int32_t body_state(int64_t k, Sub s) { return int32_t(2 + k * kSubStates + s); }
inline Sub body_sub(int32_t state) { return Sub((state - 2) % kSubStates); }
inline int64_t body_count(int32_t state) { return (state - 2) / kSubStates; }

// One step of the String rule with length bounds [min_chars, max_chars] (max -1 = unbounded, the
// count then saturates at min_chars). `no_lt`: a raw '<' is refused (it must be written \u003c: used
// inside markup such as XML tool calls). Returns the next state or -1.
int32_t string_step(int64_t min_chars, int64_t max_chars, bool no_lt, int32_t state, uint8_t b);

}  // namespace lilac::grammar::jstr
