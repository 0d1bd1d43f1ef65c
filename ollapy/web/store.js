// Conversations in the browser's IndexedDB (database "ollapy", store "conversations", keyed by id), with export
// to and import from a JSON file.

const DB = 'ollapy';
const STORE = 'conversations';
let dbPromise = null;

function open() {
  if (!dbPromise) {
    dbPromise = new Promise((resolve, reject) => {
      const req = indexedDB.open(DB, 1);
      req.onupgradeneeded = () => req.result.createObjectStore(STORE, { keyPath: 'id' });
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }
  return dbPromise;
}

async function tx(mode, fn) {
  const db = await open();
  return new Promise((resolve, reject) => {
    const t = db.transaction(STORE, mode);
    const result = fn(t.objectStore(STORE));
    t.oncomplete = () => resolve(result && 'result' in result ? result.result : undefined);
    t.onerror = () => reject(t.error);
  });
}

/** Every conversation, the most recently updated first. */
export async function all() {
  const list = await tx('readonly', (s) => s.getAll());
  return (list || []).sort((a, b) => (b.updated || 0) - (a.updated || 0));
}

export const save = (conv) => tx('readwrite', (s) => s.put(structuredClone(conv)));
export const remove = (id) => tx('readwrite', (s) => s.delete(id));

export function newId() {
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

/** A JSON Blob of every conversation: {"ollapy_conversations": 1, "conversations": [...]} */
export async function exportBlob() {
  const body = { ollapy_conversations: 1, conversations: await all() };
  return new Blob([JSON.stringify(body, null, 2)], { type: 'application/json' });
}

/** Add the conversations of an exported file's text (new ids where one exists already); returns how many. */
export async function importText(text) {
  const body = JSON.parse(text);
  const list = Array.isArray(body) ? body : body.conversations;
  if (!Array.isArray(list)) throw new Error('not an ollapy export: no "conversations" list');
  const have = new Set((await all()).map((c) => c.id));
  let n = 0;
  for (const c of list) {
    if (!c || !Array.isArray(c.messages)) continue;
    const conv = { ...c, id: c.id && !have.has(c.id) ? String(c.id) : newId(),
                   messages: c.messages.filter((m) => m && typeof m.content === 'string'
                                                     && ['user', 'assistant', 'system'].includes(m.role)) };
    await save(conv);
    n += 1;
  }
  return n;
}
