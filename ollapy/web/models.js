// The models view: pull a model with a progress bar (/api/pull, streamed), list and delete the installed ones
// (/api/tags, /api/delete), and show the loaded ones with their prompt-cache figures (/api/ps).

import * as api from './api.js';

const $ = (id) => document.getElementById(id);

export function formatBytes(n) {
  if (!n) return '0 B';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  const i = Math.min(units.length - 1, Math.floor(Math.log(n) / Math.log(1000)));
  return `${(n / 1000 ** i).toFixed(i ? 1 : 0)} ${units[i]}`;
}

function cell(tr, text) {
  const td = document.createElement('td');
  td.textContent = text;
  tr.appendChild(td);
  return td;
}

/** Fill the installed and loaded tables; `onChange` is called after a delete (the chat's model list changes). */
export async function refresh(onChange, onError) {
  const [tags, ps] = await Promise.all([api.tags(), api.ps()]);
  const body = $('model-list').tBodies[0];
  body.replaceChildren();
  for (const m of tags.models || []) {
    const tr = document.createElement('tr');
    tr.dataset.model = m.name;
    cell(tr, m.name);
    cell(tr, formatBytes(m.size));
    cell(tr, m.modified_at ? new Date(m.modified_at).toLocaleString() : '');
    const btn = document.createElement('button');
    btn.type = 'button';
    btn.className = 'small delete';
    btn.textContent = 'Delete';
    btn.addEventListener('click', async () => {
      if (btn.dataset.armed !== '1') { btn.dataset.armed = '1'; btn.textContent = 'Really delete?'; return; }
      try { await api.remove(m.name); } catch (e) { onError(e.message); }
      await refresh(onChange, onError);
      onChange();
    });
    cell(tr, '').appendChild(btn);
    body.appendChild(tr);
  }
  const loaded = $('loaded-list').tBodies[0];
  loaded.replaceChildren();
  for (const m of ps.models || []) {
    const tr = document.createElement('tr');
    tr.dataset.model = m.name;
    cell(tr, m.name);
    cell(tr, String(m.context_length ?? ''));
    cell(tr, `${m.slots_busy ?? 0} busy of ${m.num_parallel ?? 1}`);
    const pc = m.prompt_cache || {};
    const hits = (pc.hits_ram || 0) + (pc.hits_disk || 0);
    cell(tr, `${hits} hits, ${pc.tokens_reused || 0} tokens reused, ${formatBytes(pc.ram_bytes || 0)} in RAM`);
    cell(tr, m.expires_at ? new Date(m.expires_at).toLocaleTimeString() : '');
    loaded.appendChild(tr);
  }
}

/** Pull `name` with a progress bar; resolves when the pull ends (ok or not); `done(ok, message)` reports. */
export async function pull(name, done) {
  const bar = $('pull-progress');
  const status = $('pull-status');
  bar.hidden = false;
  bar.value = 0;
  status.textContent = `pulling ${name}…`;
  try {
    let last = null;
    await api.stream('/api/pull', { model: name, stream: true }, (obj) => {
      last = obj;
      if (obj.total) { bar.max = obj.total; bar.value = obj.completed || 0; }
      status.textContent = obj.total ? `${obj.status} ${formatBytes(obj.completed || 0)} / ${formatBytes(obj.total)}`
                                     : obj.status || '';
    });
    if (last?.status === 'success') { bar.value = bar.max; status.textContent = `${name}: success`; }
    done(true, status.textContent);
  } catch (e) {
    status.textContent = `pull failed: ${e.message}`;
    done(false, e.message);
  }
}
