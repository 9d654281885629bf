// lilac's Jinja subset: the lexer. Follows jinja2's whitespace rules (OptionalLStrip, trim_blocks,
// lstrip_blocks, `-` / `+` markers) and raw blocks.
#include <cstdlib>

#include "text/jinja_ast.h"

namespace lilac::jinja::detail {

namespace {

// ------------------------------------------------------------------------------------------------
// Lexer: follows jinja2's lexer (OptionalLStrip rules, trim_blocks, `-`/`+` markers, raw blocks).

class Lexer {
 public:
  explicit Lexer(const Impl& impl) : impl_(impl), src_(impl.source), n_(src_.size()) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < n_) {
      size_t t = find_tag(pos);
      if (t == std::string::npos) {
        data(src_.substr(pos), pos);
        break;
      }
      std::string text = src_.substr(pos, t - pos);
      char kind = src_[t + 1];
      size_t p = t + 2;
      char sign = 0;
      if (p < n_ && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      size_t raw_end = 0;
      if (kind == '%') raw_end = match_raw_begin(p);
      lstrip(text, sign, kind == '{', line_starting);
      data(std::move(text), pos);
      if (raw_end) {
        pos = lex_raw(raw_end, t, line_starting);
        continue;
      }
      if (kind == '#') {
        size_t q = src_.find("#}", p);
        if (q == std::string::npos) impl_.fail(t, "missing end of comment tag");
        size_t end = q + 2;
        if (q > p && src_[q - 1] == '-') {
          while (end < n_ && is_ws(src_[end])) ++end;
        } else if (!(q > p && src_[q - 1] == '+')) {
          if (impl_.options.trim_blocks && end < n_ && src_[end] == '\n') ++end;
        }
        line_starting = src_[end - 1] == '\n';
        pos = end;
        continue;
      }
      pos = lex_tag(kind == '%', t, p);
      line_starting = src_[pos - 1] == '\n';
    }
    toks_.push_back({Tok::Eof, "", 0, 0, n_});
    return std::move(toks_);
  }

 private:
  const Impl& impl_;
  const std::string& src_;
  size_t n_;
  std::vector<Token> toks_;

  size_t find_tag(size_t from) const {
    while (true) {
      size_t t = src_.find('{', from);
      if (t == std::string::npos || t + 1 >= n_) return std::string::npos;
      char c = src_[t + 1];
      if (c == '{' || c == '%' || c == '#') return t;
      from = t + 1;
    }
  }

  void data(std::string text, size_t pos) {
    if (!text.empty()) toks_.push_back({Tok::Data, std::move(text), 0, 0, pos});
  }

  void lstrip(std::string& text, char sign, bool is_var, bool line_starting) const {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_ws(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && impl_.options.lstrip_blocks && !is_var) {
      size_t l = text.rfind('\n');
      l = l == std::string::npos ? 0 : l + 1;
      if (l > 0 || line_starting) {
        bool all_ws = l < text.size();
        for (size_t k = l; k < text.size(); ++k)
          if (!is_ws(text[k])) all_ws = false;
        if (all_ws) text.resize(l);
      }
    }
  }

  // `{%[-+]? raw [-]?%}`: returns the offset after the tag, 0 if this is no raw tag.
  size_t match_raw_begin(size_t p) const {
    size_t q = p;
    while (q < n_ && is_ws(src_[q])) ++q;
    if (src_.compare(q, 3, "raw") != 0 || (q + 3 < n_ && is_name_char(src_[q + 3]))) return 0;
    q += 3;
    while (q < n_ && is_ws(src_[q])) ++q;
    if (src_.compare(q, 3, "-%}") == 0) {
      q += 3;
      while (q < n_ && is_ws(src_[q])) ++q;
      return q;
    }
    if (src_.compare(q, 2, "%}") == 0) return q + 2;
    return 0;
  }

  size_t lex_raw(size_t from, size_t tag_pos, bool& line_starting) {
    line_starting = src_[from - 1] == '\n';
    size_t search = from;
    while (true) {
      size_t r = src_.find("{%", search);
      if (r == std::string::npos) impl_.fail(tag_pos, "missing end of raw directive");
      size_t q = r + 2;
      char sign = 0;
      if (q < n_ && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < n_ && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0 || (q + 6 < n_ && is_name_char(src_[q + 6]))) {
        search = r + 2;
        continue;
      }
      q += 6;
      while (q < n_ && is_ws(src_[q])) ++q;
      size_t end;
      if (src_.compare(q, 3, "+%}") == 0) {
        end = q + 3;
      } else if (src_.compare(q, 3, "-%}") == 0) {
        end = q + 3;
        while (end < n_ && is_ws(src_[end])) ++end;
      } else if (src_.compare(q, 2, "%}") == 0) {
        end = q + 2;
        if (impl_.options.trim_blocks && end < n_ && src_[end] == '\n') ++end;
      } else {
        search = r + 2;
        continue;
      }
      std::string text = src_.substr(from, r - from);
      lstrip(text, sign, false, line_starting);
      data(std::move(text), from);
      line_starting = src_[end - 1] == '\n';
      return end;
    }
  }

  size_t lex_tag(bool block, size_t tag_pos, size_t p) {
    toks_.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", 0, 0, tag_pos});
    int depth = 0;
    while (true) {
      while (p < n_ && is_ws(src_[p])) ++p;
      if (p >= n_) impl_.fail(tag_pos, std::string("unexpected end of template, expected '") + (block ? "%}" : "}}") + "'");
      if (depth == 0) {
        if (block) {
          if (src_.compare(p, 3, "-%}") == 0) {
            toks_.push_back({Tok::BlockEnd, "", 0, 0, p});
            p += 3;
            while (p < n_ && is_ws(src_[p])) ++p;
            return p;
          }
          if (src_.compare(p, 3, "+%}") == 0) {
            toks_.push_back({Tok::BlockEnd, "", 0, 0, p});
            return p + 3;
          }
          if (src_.compare(p, 2, "%}") == 0) {
            toks_.push_back({Tok::BlockEnd, "", 0, 0, p});
            p += 2;
            if (impl_.options.trim_blocks && p < n_ && src_[p] == '\n') ++p;
            return p;
          }
        } else {
          if (src_.compare(p, 3, "-}}") == 0) {
            toks_.push_back({Tok::VarEnd, "", 0, 0, p});
            p += 3;
            while (p < n_ && is_ws(src_[p])) ++p;
            return p;
          }
          if (src_.compare(p, 2, "}}") == 0) {
            toks_.push_back({Tok::VarEnd, "", 0, 0, p});
            return p + 2;
          }
        }
      }
      p = lex_token(p, depth);
    }
  }

  size_t lex_token(size_t p, int& depth) {
    char c = src_[p];
    if (is_name_start(c)) {
      size_t e = p;
      while (e < n_ && is_name_char(src_[e])) ++e;
      toks_.push_back({Tok::Name, src_.substr(p, e - p), 0, 0, p});
      return e;
    }
    if (is_digit(c)) return lex_number(p);
    if (c == '\'' || c == '"') return lex_string(p);
    static const char* ops2[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : ops2)
      if (src_.compare(p, 2, op) == 0) {
        toks_.push_back({Tok::Op, op, 0, 0, p});
        return p + 2;
      }
    static const std::string ops1 = "+-*/%~()[]{},.:|=<>";
    if (ops1.find(c) != std::string::npos) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) impl_.fail(p, std::string("unexpected '") + c + "'");
        --depth;
      }
      toks_.push_back({Tok::Op, std::string(1, c), 0, 0, p});
      return p + 1;
    }
    impl_.fail(p, std::string("unexpected character '") + c + "'");
  }

  size_t lex_number(size_t p) {
    size_t e = p;
    auto digits = [&]() {
      while (e < n_ && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < n_ && is_digit(src_[e + 1])))) ++e;
    };
    digits();
    bool after_dot = !toks_.empty() && toks_.back().t == Tok::Op && toks_.back().v == ".";
    bool is_float = false;
    if (!after_dot && e + 1 < n_ && src_[e] == '.' && is_digit(src_[e + 1])) {
      ++e;
      digits();
      is_float = true;
    }
    if (!after_dot && e < n_ && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < n_ && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < n_ && is_digit(src_[f])) {
        e = f;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    Token t{is_float ? Tok::Float : Tok::Int, text, 0, 0, p};
    try {
      if (is_float)
        t.fv = std::stod(text);
      else
        t.iv = std::stoll(text);
    } catch (const std::exception&) {
      impl_.fail(p, "number out of range: " + text);
    }
    toks_.push_back(t);
    return e;
  }

  size_t lex_string(size_t p) {
    char q = src_[p];
    size_t e = p + 1;
    std::string out;
    while (true) {
      if (e >= n_) impl_.fail(p, "unterminated string");
      char c = src_[e];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++e;
        continue;
      }
      if (e + 1 >= n_) impl_.fail(p, "unterminated string");
      char d = src_[e + 1];
      e += 2;
      auto hex = [&](int count) -> char32_t {
        if (e + count > n_) impl_.fail(p, "truncated escape in string");
        char32_t v = 0;
        for (int k = 0; k < count; ++k) {
          char h = src_[e + k];
          int dv = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
          if (dv < 0) impl_.fail(p, "bad escape in string");
          v = v * 16 + static_cast<char32_t>(dv);
        }
        e += count;
        return v;
      };
      switch (d) {
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case '\n': break;
        case 'x': utf8_append(out, hex(2)); break;
        case 'u': utf8_append(out, hex(4)); break;
        case 'U': utf8_append(out, hex(8)); break;
        default:
          if (d >= '0' && d <= '7') {
            char32_t v = static_cast<char32_t>(d - '0');
            for (int k = 0; k < 2 && e < n_ && src_[e] >= '0' && src_[e] <= '7'; ++k) v = v * 8 + (src_[e++] - '0');
            utf8_append(out, v);
          } else {
            out += '\\';
            out += d;
          }
      }
    }
    toks_.push_back({Tok::String, std::move(out), 0, 0, p});
    return e + 1;
  }
};

}  // namespace

std::vector<Token> lex(const Impl& impl) { return Lexer(impl).run(); }

}  // namespace lilac::jinja::detail
