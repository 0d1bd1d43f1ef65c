// Model output to inert HTML: Markdown (marked) with raw HTML and images shown as text, sanitized by DOMPurify
// (a short list of tags and attributes, links to http(s) and mailto only), then code blocks highlighted
// (highlight.js, which escapes what it colours) and given a Copy button. Nothing from the model runs or loads.

import { Marked } from './vendor/marked.esm.js';
import DOMPurify from './vendor/purify.es.mjs';
import hljs from './vendor/highlight.min.js';

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    html({ text }) { return escapeHtml(text); },            // raw HTML from the model stays visible text
    image({ href, text }) { return escapeHtml(`![${text}](${href})`); },  // no image loads from model output
  },
});

const PURIFY = {
  ALLOWED_TAGS: ['p', 'br', 'hr', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'strong', 'em', 'del', 'code', 'pre',
                 'blockquote', 'ul', 'ol', 'li', 'a', 'table', 'thead', 'tbody', 'tr', 'th', 'td', 'span', 'input'],
  ALLOWED_ATTR: ['href', 'title', 'class', 'start', 'align', 'type', 'checked', 'disabled'],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
  ALLOW_DATA_ATTR: false,
};

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') { node.setAttribute('target', '_blank'); node.setAttribute('rel', 'noopener noreferrer'); }
  if (node.tagName === 'INPUT' && node.getAttribute('type') !== 'checkbox') node.remove();
});

/** Render `text` (Markdown from a model) into `el`: sanitized, highlighted, with Copy buttons on code blocks. */
export function renderMarkdown(el, text) {
  const html = DOMPurify.sanitize(marked.parse(text || ''), PURIFY);
  el.innerHTML = html;
  for (const code of el.querySelectorAll('pre > code')) {
    const lang = /language-([\w+-]+)/.exec(code.className)?.[1];
    if (lang && !hljs.getLanguage(lang)) code.className = '';
    hljs.highlightElement(code);
    const pre = code.parentElement;
    const btn = document.createElement('button');
    btn.type = 'button';
    btn.className = 'copy small';
    btn.textContent = 'Copy';
    btn.addEventListener('click', () => copyText(code.textContent, btn));
    pre.appendChild(btn);
  }
}

/** Copy `text` to the clipboard and say so on `btn` for a moment. */
export async function copyText(text, btn) {
  try {
    await navigator.clipboard.writeText(text);
    if (btn) btn.textContent = 'Copied';
  } catch {
    if (btn) btn.textContent = 'Copy failed';
  }
  if (btn) setTimeout(() => { btn.textContent = 'Copy'; }, 1200);
}
