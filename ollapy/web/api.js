// The page's HTTP client of the server's own Ollama API (same origin only: the CSP allows nothing else).
// The API key, when the server wants one, lives in sessionStorage: this tab only, gone when it closes.

const KEY = 'ollapy.apiKey';

export class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

export function apiKey() { return sessionStorage.getItem(KEY) || ''; }
export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY);
}

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorOf(resp) {
  let text = '';
  try { text = await resp.text(); } catch { /* the body is gone */ }
  let message = text;
  try { const body = JSON.parse(text); message = body.error?.message || body.error || text; } catch { /* not JSON */ }
  return new ApiError(message || `${resp.status} ${resp.statusText}`, resp.status);
}

/** One JSON request; throws ApiError with the server's message on a non-2xx answer. */
export async function request(method, path, body) {
  const resp = await fetch(path, { method, headers: headers(body !== undefined),
                                   body: body === undefined ? undefined : JSON.stringify(body) });
  if (!resp.ok) throw await errorOf(resp);
  const text = await resp.text();
  return text ? JSON.parse(text) : {};
}

/** POST `body` to an NDJSON route and call onObject(obj) per line; an `{"error"}` line throws ApiError. */
export async function stream(path, body, onObject, signal) {
  const resp = await fetch(path, { method: 'POST', headers: headers(true), body: JSON.stringify(body), signal });
  if (!resp.ok) throw await errorOf(resp);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  const handle = (line) => {
    if (!line.trim()) return;
    const obj = JSON.parse(line);
    if (obj.error) throw new ApiError(typeof obj.error === 'string' ? obj.error : JSON.stringify(obj.error), 500);
    onObject(obj);
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      handle(line);
    }
  }
  handle(buf + decoder.decode());
}

export const tags = () => request('GET', '/api/tags');
export const ps = () => request('GET', '/api/ps');
export const remove = (model) => request('DELETE', '/api/delete', { model });
