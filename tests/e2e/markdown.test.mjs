// The chat page's Markdown renderer (web/markdown.mjs) on its own: the HTML it makes, and that text
// from a model can never become markup (tags, attributes, javascript: links).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const SOURCE = process.env.LILAC_SOURCE_DIR || path.resolve(import.meta.dirname, '../..');
const { renderMarkdown, renderInline, escapeHtml } = await import(pathToFileURL(path.join(SOURCE, 'web/markdown.mjs')));

test('blocks: headings, paragraphs with line breaks, lists, quotes, rules, code fences', () => {
  assert.equal(renderMarkdown('# Hi\n\nline one\nline two'), '<h1>Hi</h1>\n<p>line one<br>line two</p>');
  assert.equal(renderMarkdown('- a\n- b\n\n1. c\n2. d'), '<ul><li>a</li><li>b</li></ul>\n<ol><li>c</li><li>d</li></ol>');
  assert.equal(renderMarkdown('> quoted\n> more'), '<blockquote><p>quoted<br>more</p></blockquote>');
  assert.equal(renderMarkdown('---'), '<hr>');
  assert.equal(renderMarkdown('```py\nif a < b:\n    pass\n```'), '<pre><code class="language-py" data-lang="py">if a &lt; b:\n    pass</code></pre>');
  // A fence still streaming renders as code.
  assert.equal(renderMarkdown('```\nx = 1'), '<pre><code>x = 1</code></pre>');
});

test('inline: bold, italic, strikethrough, code spans (literal), links', () => {
  assert.equal(renderInline('**b** *i* _j_ ~~s~~'), '<strong>b</strong> <em>i</em> <em>j</em> <del>s</del>');
  assert.equal(renderInline('use `a **not bold** <b>` here'), 'use <code>a **not bold** &lt;b&gt;</code> here');
  assert.equal(renderInline('[lilac](https://example.org/a?b=1&c=2)'),
    '<a href="https://example.org/a?b=1&amp;c=2" target="_blank" rel="noopener noreferrer">lilac</a>');
  assert.equal(renderInline('snake_case_name stays'), 'snake_case_name stays');
});

test('no injection: tags, attributes and script URLs stay text', () => {
  const evil = '<img src=x onerror=alert(1)> <script>alert(2)</script> [x](javascript:alert(3)) [y](" onmouseover="alert(4))';
  const html = renderMarkdown(evil);
  assert.ok(!/<img|<script|<a /.test(html), html);
  assert.ok(html.includes('&lt;img src=x onerror=alert(1)&gt;'));
  assert.ok(html.includes('[x](javascript:alert(3))'));
  const h = renderMarkdown('```"><script>\n</code><script>alert(1)</script>\n```');
  // Not a fence (the language is not a word): a paragraph; the last line opens an empty fence.
  assert.equal(h, '<p>```&quot;&gt;&lt;script&gt;<br>&lt;/code&gt;&lt;script&gt;alert(1)&lt;/script&gt;</p>\n<pre><code></code></pre>');
  assert.equal(renderMarkdown('```\n</code><script>alert(1)</script>\n```'), '<pre><code>&lt;/code&gt;&lt;script&gt;alert(1)&lt;/script&gt;</code></pre>');
  assert.equal(escapeHtml(`<>&"'`), '&lt;&gt;&amp;&quot;&#39;');
});
