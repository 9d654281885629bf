// A small Markdown renderer for the chat page, safe against HTML injection: every piece of text is
// HTML-escaped before any tag is added, and links keep only http(s) and mailto URLs. Supports fenced
// code blocks (```lang), inline code, headings, bold, italic, strikethrough, links, block quotes,
// ordered and unordered lists, horizontal rules and paragraphs with line breaks.

export function escapeHtml(s) {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&#39;');
}

function safeUrl(url) {
  const u = url.trim();
  return /^(https?:\/\/|mailto:)/i.test(u) ? u : null;
}

// Inline markup of one line of text (already split from code blocks).
export function renderInline(text) {
  // Code spans first: their content is taken literally.
  const parts = text.split(/(`+)([\s\S]*?[^`])\1(?!`)/);
  let out = '';
  for (let i = 0; i < parts.length; i++) {
    if (i % 3 === 0) out += inlineText(parts[i]);
    else if (i % 3 === 2) out += `<code>${escapeHtml(parts[i].replace(/^ (.*) $/, '$1'))}</code>`;
  }
  return out;
}

function inlineText(raw) {
  let s = escapeHtml(raw);
  // Links: [text](url); the URL was escaped with the rest, so unescape it for the check only.
  s = s.replace(/\[([^\]]+)\]\(([^)\s]+)\)/g, (m, label, url) => {
    const u = safeUrl(url.replace(/&amp;/g, '&'));
    return u ? `<a href="${escapeHtml(u)}" target="_blank" rel="noopener noreferrer">${label}</a>` : m;
  });
  s = s.replace(/\*\*([^*]+)\*\*/g, '<strong>$1</strong>').replace(/__([^_]+)__/g, '<strong>$1</strong>');
  s = s.replace(/(^|[^*])\*([^*\s][^*]*)\*/g, '$1<em>$2</em>').replace(/(^|[^\w_])_([^_\s][^_]*)_(?!\w)/g, '$1<em>$2</em>');
  s = s.replace(/~~([^~]+)~~/g, '<del>$1</del>');
  return s;
}

// Renders a whole message. An unterminated code fence (a message still streaming) renders as code.
export function renderMarkdown(src) {
  const lines = String(src).replace(/\r\n?/g, '\n').split('\n');
  const out = [];
  let para = [];
  let list = null;  // { tag: 'ul'|'ol', items: [] }
  const flushPara = () => {
    if (para.length) out.push(`<p>${para.map(renderInline).join('<br>')}</p>`);
    para = [];
  };
  const flushList = () => {
    if (list) out.push(`<${list.tag}>${list.items.map((it) => `<li>${renderInline(it)}</li>`).join('')}</${list.tag}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/);
    if (fence) {
      flushPara();
      flushList();
      const code = [];
      let j = i + 1;
      while (j < lines.length && !lines[j].trim().startsWith(fence[1])) code.push(lines[j++]);
      const lang = fence[2] ? ` class="language-${escapeHtml(fence[2])}" data-lang="${escapeHtml(fence[2])}"` : '';
      out.push(`<pre><code${lang}>${escapeHtml(code.join('\n'))}</code></pre>`);
      i = j;
      continue;
    }
    let m;
    if ((m = line.match(/^(#{1,6})\s+(.*)$/))) {
      flushPara();
      flushList();
      out.push(`<h${m[1].length}>${renderInline(m[2])}</h${m[1].length}>`);
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flushPara();
      flushList();
      out.push('<hr>');
    } else if ((m = line.match(/^\s*>\s?(.*)$/))) {
      flushPara();
      flushList();
      const quote = [m[1]];
      while (i + 1 < lines.length && (m = lines[i + 1].match(/^\s*>\s?(.*)$/))) { quote.push(m[1]); i++; }
      out.push(`<blockquote>${renderMarkdown(quote.join('\n'))}</blockquote>`);
    } else if ((m = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/))) {
      flushPara();
      const tag = /\d/.test(m[1]) ? 'ol' : 'ul';
      if (list && list.tag !== tag) flushList();
      if (!list) list = { tag, items: [] };
      list.items.push(m[2]);
    } else if (line.trim() === '') {
      flushPara();
      flushList();
    } else if (list && /^\s{2,}\S/.test(line)) {
      list.items[list.items.length - 1] += ' ' + line.trim();
    } else {
      flushList();
      para.push(line);
    }
  }
  flushPara();
  flushList();
  return out.join('\n');
}
