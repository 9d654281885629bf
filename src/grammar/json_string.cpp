#include "grammar/json_string.h"

#include <array>
#include <cstddef>

namespace lilac::grammar::jstr {

namespace {

struct Table {
  std::array<std::array<Move, 256>, kSubStates> m{};

  void set(Sub s, int lo, int hi, MoveKind k, Sub next) {
    for (int b = lo; b <= hi; ++b) m[s][std::size_t(b)] = {k, next};
  }
  void hex(Sub s, MoveKind k, Sub next) {
    set(s, '0', '9', k, next);
    set(s, 'a', 'f', k, next);
    set(s, 'A', 'F', k, next);
  }

  Table() {
    using K = MoveKind;
    set(N, 0x20, 0x7F, K::Char, N);
    set(N, '"', '"', K::Close, N);
    set(N, '\\', '\\', K::Partial, Esc);
    set(N, 0xC2, 0xDF, K::Partial, C1);
    set(N, 0xE0, 0xE0, K::Partial, E0);
    set(N, 0xE1, 0xEC, K::Partial, C2);
    set(N, 0xED, 0xED, K::Partial, ED);
    set(N, 0xEE, 0xEF, K::Partial, C2);
    set(N, 0xF0, 0xF0, K::Partial, F0);
    set(N, 0xF1, 0xF3, K::Partial, C3);
    set(N, 0xF4, 0xF4, K::Partial, F4);
    set(C1, 0x80, 0xBF, K::Char, N);
    set(C2, 0x80, 0xBF, K::Partial, C1);
    set(C3, 0x80, 0xBF, K::Partial, C2);
    set(E0, 0xA0, 0xBF, K::Partial, C1);
    set(ED, 0x80, 0x9F, K::Partial, C1);
    set(F0, 0x90, 0xBF, K::Partial, C2);
    set(F4, 0x80, 0x8F, K::Partial, C2);
    for (char c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) set(Esc, c, c, K::Char, N);
    set(Esc, 'u', 'u', K::Partial, U0);
    hex(U0, K::Partial, U1);
    set(U0, 'd', 'd', K::Partial, UD);
    set(U0, 'D', 'D', K::Partial, UD);
    hex(U1, K::Partial, U2);
    hex(U2, K::Partial, U3);
    hex(U3, K::Char, N);
    set(UD, '0', '7', K::Partial, U2);
    set(UD, '8', '9', K::Partial, H2);
    set(UD, 'a', 'b', K::Partial, H2);
    set(UD, 'A', 'B', K::Partial, H2);
    hex(H2, K::Partial, H3);
    hex(H3, K::Partial, HP);
    set(HP, '\\', '\\', K::Partial, L0);
    set(L0, 'u', 'u', K::Partial, L1);
    set(L1, 'd', 'd', K::Partial, L2);
    set(L1, 'D', 'D', K::Partial, L2);
    set(L2, 'c', 'f', K::Partial, L3);
    set(L2, 'C', 'F', K::Partial, L3);
    hex(L3, K::Partial, L4);
    hex(L4, K::Char, N);
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

const Move& move(Sub s, uint8_t b) { return table().m[s][b]; }

int32_t string_step(int64_t min_chars, int64_t max_chars, bool no_lt, int32_t state, uint8_t b) {
  if (state == kOpen) return b == '"' ? body_state(0, N) : -1;
  if (state == kClosed || (no_lt && b == '<')) return -1;
  const Sub s = body_sub(state);
  int64_t k = body_count(state);
  const Move& m = move(s, b);
  switch (m.kind) {
    case MoveKind::Dead: return -1;
    case MoveKind::Close: return k >= min_chars ? kClosed : -1;
    case MoveKind::Char: ++k; break;
    case MoveKind::Partial: break;
  }
  if (max_chars >= 0) {
    if (k + (pending(m.next) ? 1 : 0) > max_chars) return -1;
  } else if (k > min_chars) {
    k = min_chars;
  }
  return body_state(k, m.next);
}

}  // namespace lilac::grammar::jstr
