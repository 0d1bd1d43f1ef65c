// The chat view: conversations (IndexedDB), the model picker, streamed answers with Stop, edit and resend,
// regenerate, per-answer figures (prompt tokens, how many came from the prompt cache, TTFT, tokens/s), the
// theme, the API key dialog, and the switch to the models view.

import * as api from './api.js';
import * as models from './models.js';
import { copyText, renderMarkdown } from './render.js';
import * as store from './store.js';

const $ = (id) => document.getElementById(id);
const state = { convs: [], conv: null, models: [], controller: null, images: [] };

// ---- banner, theme, key ---------------------------------------------------------------------------------
function showError(text) {
  const b = $('banner');
  b.textContent = text;
  b.hidden = !text;
}

function applyTheme(theme) {
  const dark = theme === 'dark';
  document.documentElement.classList.toggle('dark', dark);
  $('hljs-dark').disabled = !dark;
  $('hljs-light').disabled = dark;
  $('theme').textContent = dark ? 'Light' : 'Dark';
  $('theme').setAttribute('aria-pressed', String(dark));
}

function initialTheme() {
  return localStorage.getItem('ollapy.theme')
    || (window.matchMedia?.('(prefers-color-scheme: dark)').matches ? 'dark' : 'light');
}

/** Ask for the API key in a dialog; resolves once a key has been entered and tried. */
function askKey(message) {
  const dlg = $('key-dialog');
  $('key-error').hidden = !message;
  $('key-error').textContent = message || '';
  $('key-input').value = '';
  dlg.oncancel = (e) => e.preventDefault();  // Escape would close it and leave the page waiting for a key
  if (!dlg.open) dlg.showModal();
  $('key-input').focus();
  return new Promise((resolve) => {
    const done = () => {
      api.setApiKey($('key-input').value.trim());
      dlg.close();
      $('key-save').removeEventListener('click', done);
      $('key-input').removeEventListener('keydown', onKey);
      resolve();
    };
    const onKey = (e) => { if (e.key === 'Enter') { e.preventDefault(); done(); } };
    $('key-save').addEventListener('click', done);
    $('key-input').addEventListener('keydown', onKey);
  });
}

/** Run `fn`; on a 401 ask for the key and try again until it passes. */
async function withKey(fn) {
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (!(e instanceof api.ApiError) || e.status !== 401) throw e;
      await askKey(api.apiKey() ? 'That key was refused: try again.' : '');
    }
  }
}

// ---- models -----------------------------------------------------------------------------------------------
async function loadModels() {
  const tags = await withKey(api.tags);
  state.models = (tags.models || []).map((m) => m.name).sort();
  fillModelSelect();
}

function fillModelSelect() {
  const sel = $('model');
  sel.replaceChildren();
  const names = [...state.models];
  const want = state.conv?.model;
  if (want && !names.includes(want)) names.push(want);  // a conversation's model that is gone: kept, and the error says so
  for (const n of names) {
    const o = document.createElement('option');
    o.value = n;
    o.textContent = n;
    sel.appendChild(o);
  }
  if (!names.length) {
    const o = document.createElement('option');
    o.value = '';
    o.textContent = '(no models: pull one in Models)';
    sel.appendChild(o);
  }
  sel.value = want || localStorage.getItem('ollapy.model') || names[0] || '';
  if (!sel.value && names.length) sel.value = names[0];
}

// ---- conversations ------------------------------------------------------------------------------------------
function newConversation() {
  return { id: store.newId(), title: 'New chat', model: $('model').value || state.models[0] || '', system: '',
           options: {}, messages: [], updated: Date.now() };
}

async function persist(conv = state.conv) {
  conv.updated = Date.now();
  await store.save(conv);
  if (!state.convs.includes(conv)) state.convs.unshift(conv);
  renderConversationList();
}

function renderConversationList() {
  const ul = $('conversations');
  ul.replaceChildren();
  for (const c of [...state.convs].sort((a, b) => b.updated - a.updated)) {
    if (!c.messages.length && c !== state.conv) continue;
    const li = document.createElement('li');
    li.dataset.id = c.id;
    li.classList.toggle('active', c === state.conv);
    const t = document.createElement('span');
    t.className = 'title';
    t.textContent = c.title || 'New chat';
    li.appendChild(t);
    const del = document.createElement('button');
    del.type = 'button';
    del.className = 'small';
    del.textContent = '✕';
    del.title = 'Delete this conversation';
    del.addEventListener('click', async (e) => {
      e.stopPropagation();
      await store.remove(c.id);
      state.convs = state.convs.filter((x) => x !== c);
      if (c === state.conv) selectConversation(state.convs[0] || newConversation());
      else renderConversationList();
    });
    li.appendChild(del);
    li.addEventListener('click', () => selectConversation(c));
    ul.appendChild(li);
  }
}

function selectConversation(conv) {
  if (state.controller) return;  // not while an answer streams
  state.conv = conv;
  fillModelSelect();
  $('system').value = conv.system || '';
  $('temperature').value = conv.options?.temperature ?? '';
  $('num_ctx').value = conv.options?.num_ctx ?? '';
  renderConversationList();
  renderMessages();
  showError('');
}

// ---- messages -----------------------------------------------------------------------------------------------
function button(text, cls, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = `small ${cls}`;
  b.textContent = text;
  b.addEventListener('click', onClick);
  return b;
}

function statsText(s) {
  const parts = [`prompt ${s.prompt} tok`, `${s.cached} from cache`];
  if (s.ttft_ms !== undefined) parts.push(`TTFT ${Math.round(s.ttft_ms)} ms`);
  if (s.tps !== undefined) parts.push(`${s.tps.toFixed(1)} tok/s`);
  parts.push(`${s.eval} tok out`);
  return parts.join(' · ');
}

function messageElement(m, i) {
  const div = document.createElement('div');
  div.className = `msg ${m.role}`;
  div.dataset.index = String(i);
  const role = document.createElement('div');
  role.className = 'role';
  role.textContent = m.role === 'user' ? 'You' : (m.model || 'assistant');
  div.appendChild(role);
  if (m.role === 'user') {
    const body = document.createElement('div');
    body.className = 'body';
    body.textContent = m.content;
    div.appendChild(body);
    if (m.images?.length) div.appendChild(imageRow(m.images));
    const actions = document.createElement('div');
    actions.className = 'actions';
    actions.appendChild(button('Edit', 'edit', () => editMessage(div, i)));
    div.appendChild(actions);
    return div;
  }
  if (m.thinking) {
    const d = document.createElement('details');
    d.className = 'thinking';
    const s = document.createElement('summary');
    s.textContent = state.controller && i === state.conv.messages.length - 1 && !m.content ? 'Thinking…' : 'Thinking';
    const t = document.createElement('div');
    t.className = 'thinking-text';
    t.textContent = m.thinking;
    d.append(s, t);
    div.appendChild(d);
  }
  const content = document.createElement('div');
  content.className = 'content';
  renderMarkdown(content, m.content);
  div.appendChild(content);
  if (m.error) {
    const e = document.createElement('div');
    e.className = 'error-text';
    e.textContent = `Error: ${m.error}`;
    div.appendChild(e);
  }
  if (m.stopped) {
    const e = document.createElement('div');
    e.className = 'stats stopped';
    e.textContent = 'stopped';
    div.appendChild(e);
  }
  if (m.stats) {
    const st = document.createElement('div');
    st.className = 'stats';
    st.dataset.prompt = String(m.stats.prompt);
    st.dataset.cached = String(m.stats.cached);
    st.textContent = statsText(m.stats);
    div.appendChild(st);
  }
  const streaming = state.controller && i === state.conv.messages.length - 1;
  div.classList.toggle('streaming', Boolean(streaming));
  if (!streaming) {
    const actions = document.createElement('div');
    actions.className = 'actions';
    if (m.content) actions.appendChild(button('Copy', 'copy-msg', (e) => copyText(m.content, e.target)));
    if (i === state.conv.messages.length - 1) actions.appendChild(button('Regenerate', 'regenerate', () => regenerate(i)));
    div.appendChild(actions);
  }
  return div;
}

// ---- images (the user's own, sent to a vision model as Ollama's base64 `images`) -------------------------
function imageElement(dataUrl) {
  const img = document.createElement('img');
  img.alt = 'attached image';
  img.src = dataUrl;  // a data: URL of the user's own file (the CSP allows data: images; model output has none)
  return img;
}

function imageRow(images) {
  const row = document.createElement('div');
  row.className = 'images';
  row.append(...images.map(imageElement));
  return row;
}

function renderAttachments() {
  const box = $('attachments');
  box.replaceChildren();
  state.images.forEach((url, i) => {
    const t = document.createElement('span');
    t.className = 'thumb';
    t.append(imageElement(url), button('✕', 'remove-image', () => { state.images.splice(i, 1); renderAttachments(); }));
    box.appendChild(t);
  });
}

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

function renderMessages() {
  const box = $('messages');
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  box.replaceChildren(...state.conv.messages.map(messageElement));
  if (atBottom || state.controller) box.scrollTop = box.scrollHeight;
}

/** Redraw the last message only (the streaming answer): Markdown is parsed once per frame, not once per token. */
function renderLast() {
  const box = $('messages');
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  const i = state.conv.messages.length - 1;
  const fresh = messageElement(state.conv.messages[i], i);
  const el = box.lastElementChild;
  if (el && el.dataset.index === String(i)) el.replaceWith(fresh); else box.appendChild(fresh);
  if (atBottom) box.scrollTop = box.scrollHeight;
}

let pending = false;
function renderSoon() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => { pending = false; if (state.controller) renderLast(); });
}

function editMessage(div, i) {
  if (state.controller) return;
  const m = state.conv.messages[i];
  const box = document.createElement('div');
  box.className = 'edit-box';
  const ta = document.createElement('textarea');
  ta.value = m.content;
  ta.rows = Math.min(10, m.content.split('\n').length + 1);
  const row = document.createElement('div');
  row.className = 'actions';
  const resend = async () => {
    const text = ta.value.trim();
    if (!text) return;
    state.conv.messages = state.conv.messages.slice(0, i);
    state.conv.messages.push(m.images?.length ? { role: 'user', content: text, images: m.images } : { role: 'user', content: text });
    await generate();
  };
  row.append(button('Send', 'primary resend', resend), button('Cancel', 'cancel', () => renderMessages()));
  ta.addEventListener('keydown', (e) => { if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); resend(); } });
  box.append(ta, row);
  div.querySelector('.body').replaceWith(box);
  div.querySelector('.actions:not(.edit-box .actions)')?.remove();
  ta.focus();
}

async function regenerate(i) {
  if (state.controller) return;
  state.conv.messages = state.conv.messages.slice(0, i);
  await generate();
}

async function send() {
  const text = $('input').value;
  if (!text.trim() || state.controller) return;
  if (!$('model').value) { showError('Pick a model first (or pull one in Models).'); return; }
  $('input').value = '';
  const conv = state.conv;
  if (!conv.messages.length) conv.title = text.trim().split('\n')[0].slice(0, 60);
  const msg = { role: 'user', content: text };
  if (state.images.length) msg.images = state.images;
  state.images = [];
  renderAttachments();
  conv.messages.push(msg);
  await generate();
}

function requestBody(conv) {
  const messages = [];
  if (conv.system?.trim()) messages.push({ role: 'system', content: conv.system });
  for (const m of conv.messages) {
    if (m.role === 'assistant' && m.error && !m.content) continue;
    const out = { role: m.role, content: m.content };
    if (m.images?.length) out.images = m.images.map((u) => u.slice(u.indexOf(',') + 1));  // base64 without the data: head
    messages.push(out);
  }
  const options = {};
  for (const [k, v] of Object.entries(conv.options || {})) if (v !== '' && v !== null && v !== undefined) options[k] = Number(v);
  return { model: conv.model, messages, stream: true, options };
}

async function generate() {
  const conv = state.conv;
  conv.model = $('model').value;
  const body = requestBody(conv);
  const m = { role: 'assistant', content: '', thinking: '', model: conv.model };
  conv.messages.push(m);
  const controller = new AbortController();
  state.controller = controller;
  $('send').hidden = true;
  $('stop').hidden = false;
  showError('');
  renderMessages();
  await persist(conv);
  const t0 = performance.now();
  let ttft;
  try {
    await withKey(() => api.stream('/api/chat', body, (obj) => {
      const piece = obj.message || {};
      if ((piece.content || piece.thinking) && ttft === undefined) ttft = performance.now() - t0;
      m.content += piece.content || '';
      m.thinking += piece.thinking || '';
      if (obj.done) {
        const evalS = (obj.eval_duration || 0) / 1e9;
        m.stats = { prompt: obj.prompt_eval_count || 0, cached: obj.prompt_cache_tokens || 0,
                    eval: obj.eval_count || 0, ttft_ms: ttft,
                    tps: evalS > 0 ? (obj.eval_count || 0) / evalS : undefined, done_reason: obj.done_reason };
      }
      renderSoon();
    }, controller.signal));
  } catch (e) {
    if (e.name === 'AbortError') m.stopped = true;
    else { m.error = e.message; showError(e.message); }
  } finally {
    state.controller = null;
    $('send').hidden = false;
    $('stop').hidden = true;
    if (!m.thinking) delete m.thinking;
    renderMessages();
    await persist(conv);
  }
}

// ---- wiring ---------------------------------------------------------------------------------------------------
function showModelsView(show) {
  $('models-view').hidden = !show;
  $('chat-view').hidden = show;
  if (show) models.refresh(onModelsChanged, showError).catch((e) => showError(e.message));
}

async function onModelsChanged() {
  try { await loadModels(); } catch (e) { showError(e.message); }
}

function bind() {
  $('send').addEventListener('click', send);
  $('stop').addEventListener('click', () => state.controller?.abort());
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $('new-chat').addEventListener('click', () => selectConversation(newConversation()));
  $('model').addEventListener('change', () => {
    localStorage.setItem('ollapy.model', $('model').value);
    state.conv.model = $('model').value;
    if (state.conv.messages.length) persist();
  });
  $('system').addEventListener('change', () => { state.conv.system = $('system').value; persist(); });
  for (const k of ['temperature', 'num_ctx']) {
    $(k).addEventListener('change', () => { state.conv.options = { ...state.conv.options, [k]: $(k).value }; persist(); });
  }
  $('theme').addEventListener('click', () => {
    const next = document.documentElement.classList.contains('dark') ? 'light' : 'dark';
    localStorage.setItem('ollapy.theme', next);
    applyTheme(next);
  });
  $('export').addEventListener('click', async () => {
    const url = URL.createObjectURL(await store.exportBlob());
    const a = document.createElement('a');
    a.href = url;
    a.download = `ollapy-conversations-${new Date().toISOString().slice(0, 10)}.json`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  });
  $('import').addEventListener('change', async (e) => {
    const file = e.target.files?.[0];
    if (!file) return;
    try {
      const n = await store.importText(await file.text());
      state.convs = await store.all();
      renderConversationList();
      showError(n ? '' : 'No conversations in that file.');
    } catch (err) {
      showError(`Import failed: ${err.message}`);
    }
    e.target.value = '';
  });
  $('attach').addEventListener('change', async (e) => {
    for (const f of e.target.files || []) state.images.push(await readDataUrl(f));
    e.target.value = '';
    renderAttachments();
  });
  $('show-models').addEventListener('click', () => showModelsView(true));
  $('back-to-chat').addEventListener('click', () => showModelsView(false));
  $('pull').addEventListener('click', async () => {
    const name = $('pull-name').value.trim();
    if (!name) return;
    $('pull').disabled = true;
    await withKey(() => models.pull(name, () => {}));
    $('pull').disabled = false;
    await models.refresh(onModelsChanged, showError).catch((e) => showError(e.message));
    await onModelsChanged();
  });
}

async function main() {
  applyTheme(initialTheme());
  bind();
  try {
    await loadModels();
  } catch (e) {
    showError(`Could not list models: ${e.message}`);
  }
  state.convs = await store.all();
  selectConversation(state.convs[0] || newConversation());
  document.body.dataset.ready = '1';
}

main();
