// anna chat page: conversations in localStorage, streaming chat through
// /v1/chat/completions (fetch + ReadableStream over SSE), reasoning folded, tool calls shown,
// a stop button that aborts the request (the server cancels the generation when the
// connection closes), images as data: URLs. Untrusted text (model output, stored
// conversations) only ever reaches the page through textContent / text nodes, never innerHTML.
'use strict';

const KEYS = { convs: 'anna.webui.conversations', current: 'anna.webui.current', apiKey: 'anna.webui.apiKey' };
const $ = (id) => document.getElementById(id);

const state = {
  convs: [],       // [{id, title, created, messages: [{role, content, reasoning, tool_calls, images, error, stopped}]}]
  current: null,   // id of the conversation shown
  model: null,     // id from /v1/models
  abort: null,     // AbortController of the request in flight
  pending: [],     // data: URLs attached to the next message
  imagesOk: true,  // false once the server said the model takes no images
};

// ---- storage ----

function loadState() {
  try {
    const v = JSON.parse(localStorage.getItem(KEYS.convs) || '[]');
    state.convs = Array.isArray(v) ? v.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages)) : [];
  } catch (e) {
    state.convs = [];
    showError('stored conversations could not be read and were ignored: ' + e.message);
  }
  // A reply still marked in flight was cut by a reload or a closed tab: say so.
  for (const c of state.convs)
    for (const m of c.messages)
      if (m && m.role === 'assistant' && !m.finish_reason && !m.error && !m.stopped) m.stopped = true;
  const cur = localStorage.getItem(KEYS.current);
  state.current = state.convs.some((c) => c.id === cur) ? cur : (state.convs[0] ? state.convs[0].id : null);
}

function saveState() {
  try {
    localStorage.setItem(KEYS.convs, JSON.stringify(state.convs));
    localStorage.setItem(KEYS.current, state.current || '');
  } catch (e) {
    showError('could not save the conversation in this browser (storage full?): ' + e.message);
  }
}

function currentConv() {
  return state.convs.find((c) => c.id === state.current) || null;
}

function newConv() {
  const id = 'c' + Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  const c = { id, title: 'New chat', created: Date.now(), messages: [] };
  state.convs.unshift(c);
  state.current = id;
  saveState();
  return c;
}

// ---- small DOM helpers (text only) ----

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function showError(msg) {
  const e = $('error');
  e.textContent = msg;
  e.hidden = !msg;
}

function setStatus(msg) {
  $('status').textContent = msg || '';
}

// ---- markdown-ish rendering: fenced code, headings, lists, paragraphs, `code`, **bold** ----

function renderInline(parent, text) {
  // Tokens: `code` and **bold**; everything else is a text node.
  const re = /(`[^`\n]+`|\*\*[^*\n]+\*\*)/g;
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    const t = m[0];
    if (t[0] === '`') parent.appendChild(el('code', null, t.slice(1, -1)));
    else parent.appendChild(el('strong', null, t.slice(2, -2)));
    last = m.index + t.length;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

function renderMarkdown(parent, text) {
  parent.textContent = '';
  const lines = String(text).replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  let para = null;
  let list = null;
  const endBlocks = () => { para = null; list = null; };
  while (i < lines.length) {
    const ln = lines[i];
    const fence = /^\s*```(.*)$/.exec(ln);
    if (fence) {
      endBlocks();
      const body = [];
      i++;
      while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) body.push(lines[i++]);
      i++; // the closing fence (or the end while it is still streaming)
      const pre = el('pre');
      const code = el('code', null, body.join('\n'));
      if (fence[1].trim()) code.dataset.lang = fence[1].trim();
      pre.appendChild(code);
      parent.appendChild(pre);
      continue;
    }
    const h = /^(#{1,6})\s+(.*)$/.exec(ln);
    const li = /^\s*(?:[-*+]|\d+[.)])\s+(.*)$/.exec(ln);
    if (!ln.trim()) {
      endBlocks();
    } else if (h) {
      endBlocks();
      const e = el('h' + Math.min(6, h[1].length + 2));
      renderInline(e, h[2]);
      parent.appendChild(e);
    } else if (li) {
      para = null;
      if (!list) {
        list = el(/^\s*\d/.test(ln) ? 'ol' : 'ul');
        parent.appendChild(list);
      }
      const item = el('li');
      renderInline(item, li[1]);
      list.appendChild(item);
    } else {
      list = null;
      if (!para) {
        para = el('p');
        parent.appendChild(para);
      } else {
        para.appendChild(el('br'));
      }
      renderInline(para, ln);
    }
    i++;
  }
}

// <think>...</think> in the content (a server without --reasoning-format): shown as reasoning.
function splitThink(content) {
  const s = String(content || '');
  const a = s.indexOf('<think>');
  if (a < 0) {
    const b = s.indexOf('</think>'); // templates that open the block in the prompt
    return b < 0 ? { reasoning: '', content: s } : { reasoning: s.slice(0, b), content: s.slice(b + 8) };
  }
  const b = s.indexOf('</think>', a);
  if (b < 0) return { reasoning: s.slice(a + 7), content: s.slice(0, a) };
  return { reasoning: s.slice(a + 7, b), content: s.slice(0, a) + s.slice(b + 8) };
}

// ---- conversation list and messages ----

function renderConvList() {
  const ul = $('conv-list');
  ul.textContent = '';
  for (const c of state.convs) {
    const li = el('li', c.id === state.current ? 'conv active' : 'conv');
    li.dataset.id = c.id;
    const t = el('button', 'conv-title', c.title || 'New chat');
    t.type = 'button';
    t.title = c.title || '';
    t.addEventListener('click', () => switchConv(c.id));
    const d = el('button', 'conv-delete', '\u00d7');
    d.type = 'button';
    d.title = 'Delete this conversation';
    d.setAttribute('aria-label', 'Delete conversation');
    d.addEventListener('click', () => deleteConv(c.id));
    li.append(t, d);
    ul.appendChild(li);
  }
}

function renderMessage(m) {
  const box = el('div', 'msg ' + (m.role === 'user' ? 'user' : 'assistant'));
  updateMessage(box, m);
  return box;
}

// Rebuilds one message's children from its record (also on every streamed chunk).
function updateMessage(box, m) {
  box.textContent = '';
  box.appendChild(el('div', 'who', m.role === 'user' ? 'You' : (m.model || 'assistant')));
  const split = m.role === 'assistant' ? splitThink(m.content) : { reasoning: '', content: m.content || '' };
  const reasoning = (m.reasoning || '') + split.reasoning;
  if (reasoning.trim()) {
    const det = el('details', 'reasoning');
    const open = box.dataset.reasoningOpen === '1';
    det.open = open;
    det.appendChild(el('summary', null, 'Reasoning'));
    det.appendChild(el('div', 'reasoning-text', reasoning.trim()));
    det.addEventListener('toggle', () => { box.dataset.reasoningOpen = det.open ? '1' : '0'; });
    box.appendChild(det);
  }
  for (const src of m.images || []) {
    const img = el('img');
    img.alt = 'attached image';
    img.src = src; // data: URLs only (img-src 'self' data: in the policy)
    box.appendChild(img);
  }
  const content = el('div', 'content');
  renderMarkdown(content, split.content);
  box.appendChild(content);
  for (const tc of m.tool_calls || []) {
    const det = el('details', 'tool-call');
    det.appendChild(el('summary', null, 'Tool call: ' + (tc.name || '?')));
    let args = tc.arguments || '';
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* shown as it came */ }
    const pre = el('pre');
    pre.appendChild(el('code', null, args));
    det.appendChild(pre);
    box.appendChild(det);
  }
  if (m.stopped) box.appendChild(el('div', 'note', '(stopped)'));
  if (m.error) box.appendChild(el('div', 'msg-error', m.error));
  if (m.usage) {
    box.appendChild(el('div', 'note', m.usage.prompt_tokens + ' prompt tokens, ' + m.usage.completion_tokens +
      ' generated' + (m.tps ? ', ' + m.tps.toFixed(1) + ' tokens/s' : '')));
  }
}

function renderMessages() {
  const box = $('messages');
  box.textContent = '';
  const c = currentConv();
  if (c) for (const m of c.messages) box.appendChild(renderMessage(m));
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderConvList();
  renderMessages();
}

function switchConv(id) {
  if (state.abort) return; // one generation at a time: stop it first
  state.current = id;
  saveState();
  renderAll();
}

function deleteConv(id) {
  if (state.abort && id === state.current) return;
  state.convs = state.convs.filter((c) => c.id !== id);
  saveState();
  if (state.current !== id) {
    renderConvList(); // the messages shown (maybe streaming) stay as they are
    return;
  }
  state.current = state.convs[0] ? state.convs[0].id : null;
  saveState();
  renderAll();
}

// ---- API ----

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  const key = localStorage.getItem(KEYS.apiKey);
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

function needKey() {
  $('key-box').hidden = false;
  $('api-key').focus();
}

async function errorText(resp) {
  let msg = 'HTTP ' + resp.status;
  try {
    const j = await resp.json();
    if (j && j.error && j.error.message) msg += ': ' + j.error.message;
  } catch (e) { /* not JSON */ }
  return msg;
}

async function loadModel() {
  try {
    const resp = await fetch('v1/models', { headers: headers(false) });
    if (resp.status === 401) {
      $('model-name').textContent = 'API key needed';
      needKey();
      return;
    }
    if (!resp.ok) throw new Error(await errorText(resp));
    const j = await resp.json();
    state.model = j.data && j.data[0] ? String(j.data[0].id) : null;
    $('model-name').textContent = state.model || '(no model)';
    document.title = state.model ? state.model + ' \u2014 anna' : 'anna';
  } catch (e) {
    $('model-name').textContent = '(server unreachable)';
    showError('GET /v1/models: ' + e.message);
  }
}

// Applies one SSE event's data to the assistant message m; returns true at [DONE].
function applyEvent(m, data) {
  if (data === '[DONE]') return true;
  let j;
  try { j = JSON.parse(data); } catch (e) { return false; }
  if (j.error) {
    m.error = j.error.message || JSON.stringify(j.error);
    return false;
  }
  if (j.usage) m.usage = { prompt_tokens: j.usage.prompt_tokens, completion_tokens: j.usage.completion_tokens };
  const ch = j.choices && j.choices[0];
  if (!ch) return false;
  const d = ch.delta || {};
  if (typeof d.content === 'string') m.content += d.content;
  if (typeof d.reasoning_content === 'string') m.reasoning = (m.reasoning || '') + d.reasoning_content;
  if (Array.isArray(d.tool_calls)) {
    m.tool_calls = m.tool_calls || [];
    for (const t of d.tool_calls) {
      const k = Number.isInteger(t.index) ? t.index : m.tool_calls.length;
      const cur = m.tool_calls[k] || (m.tool_calls[k] = { name: '', arguments: '' });
      if (t.function && typeof t.function.name === 'string' && t.function.name) cur.name = t.function.name;
      if (t.function && typeof t.function.arguments === 'string') cur.arguments += t.function.arguments;
    }
  }
  if (ch.finish_reason) m.finish_reason = ch.finish_reason;
  return false;
}

function apiMessages(conv) {
  // History as the server takes it: text, images as image_url parts; reasoning and failed
  // turns stay on the page only.
  const out = [];
  for (const m of conv.messages) {
    if (m.role === 'assistant') {
      if (m.error && !m.content) continue;
      out.push({ role: 'assistant', content: splitThink(m.content).content });
    } else if (m.images && m.images.length) {
      // Images before the question, as vision chat templates and their examples order them.
      const parts = m.images.map((u) => ({ type: 'image_url', image_url: { url: u } }));
      if (m.content) parts.push({ type: 'text', text: m.content });
      out.push({ role: 'user', content: parts });
    } else {
      out.push({ role: 'user', content: m.content });
    }
  }
  return out;
}

function setBusy(busy) {
  $('send').hidden = busy;
  $('stop').hidden = !busy;
}

async function send(text) {
  if (state.abort) return;
  showError('');
  const conv = currentConv() || newConv();
  const images = state.pending.slice();
  if (!text.trim() && !images.length) return;
  conv.messages.push({ role: 'user', content: text, images });
  if (conv.title === 'New chat') conv.title = (text.trim() || 'Image').slice(0, 48);
  const m = { role: 'assistant', model: state.model, content: '', reasoning: '', tool_calls: [] };
  const body = { messages: apiMessages(conv), stream: true, stream_options: { include_usage: true } };
  if (state.model) body.model = state.model;
  conv.messages.push(m);
  state.pending = [];
  renderPreviews();
  saveState();
  renderAll();
  const box = $('messages').lastElementChild;
  const ctl = new AbortController();
  state.abort = ctl;
  setBusy(true);
  setStatus('generating…');
  const t0 = performance.now();
  let tFirst = 0;
  let frame = 0;
  let tSaved = t0;
  const redraw = () => {
    frame = 0;
    updateMessage(box, m);
    const mb = $('messages');
    if (mb.scrollHeight - mb.scrollTop - mb.clientHeight < 120) mb.scrollTop = mb.scrollHeight;
  };
  try {
    const resp = await fetch('v1/chat/completions', {
      method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: ctl.signal,
    });
    if (!resp.ok) {
      const msg = await errorText(resp);
      if (resp.status === 401) needKey();
      if (resp.status === 400 && images.length && /image/i.test(msg)) {
        state.imagesOk = false;
        $('attach').hidden = true;
      }
      throw new Error(msg);
    }
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    let done = false;
    while (!done) {
      const r = await reader.read();
      if (r.done) break;
      buf += dec.decode(r.value, { stream: true }).replace(/\r\n?/g, '\n');
      let k;
      while (!done && (k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        const data = ev.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (data) done = applyEvent(m, data);
      }
      if (!tFirst && (m.content || m.reasoning)) tFirst = performance.now();
      if (!frame) frame = requestAnimationFrame(redraw);
      if (performance.now() - tSaved > 1000) { // a reload mid-reply keeps what came
        tSaved = performance.now();
        saveState();
      }
    }
    if (m.usage && tFirst && m.usage.completion_tokens > 1) {
      const s = (performance.now() - tFirst) / 1000;
      if (s > 0) m.tps = (m.usage.completion_tokens - 1) / s;
    }
    setStatus(m.finish_reason ? 'done (' + m.finish_reason + ', ' + ((performance.now() - t0) / 1000).toFixed(1) + ' s)' : 'done');
  } catch (e) {
    if (e.name === 'AbortError') {
      m.stopped = true;
      setStatus('stopped');
    } else {
      m.error = e.message;
      setStatus('');
    }
  } finally {
    if (frame) cancelAnimationFrame(frame);
    state.abort = null;
    setBusy(false);
    saveState();
    updateMessage(box, m);
    $('input').focus();
  }
}

// ---- images ----

function renderPreviews() {
  const p = $('previews');
  p.textContent = '';
  state.pending.forEach((src, i) => {
    const img = el('img');
    img.src = src;
    img.alt = 'attachment ' + (i + 1) + ' (click to remove)';
    img.title = 'Click to remove';
    img.addEventListener('click', () => { state.pending.splice(i, 1); renderPreviews(); });
    p.appendChild(img);
  });
}

function readFile(f) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result));
    r.onerror = () => reject(r.error || new Error('read failed'));
    r.readAsDataURL(f);
  });
}

async function attachFiles(files) {
  for (const f of files) {
    if (!/^image\//.test(f.type)) {
      showError(f.name + ': not an image');
      continue;
    }
    try { state.pending.push(await readFile(f)); } catch (e) { showError(f.name + ': ' + e.message); }
  }
  renderPreviews();
}

// ---- wiring ----

function init() {
  loadState();
  renderAll();
  const key = localStorage.getItem(KEYS.apiKey);
  if (key) {
    $('key-box').hidden = false;
    $('api-key').value = key;
  }
  $('api-key').addEventListener('change', (e) => {
    const v = e.target.value.trim();
    if (v) localStorage.setItem(KEYS.apiKey, v); else localStorage.removeItem(KEYS.apiKey);
    showError('');
    loadModel();
  });
  $('new-chat').addEventListener('click', () => {
    if (state.abort) return;
    newConv();
    renderAll();
    $('input').focus();
  });
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const input = $('input');
    const text = input.value;
    if (state.abort || (!text.trim() && !state.pending.length)) return;
    input.value = '';
    send(text);
  });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').addEventListener('click', () => { if (state.abort) state.abort.abort(); });
  $('attach').addEventListener('click', () => $('file').click());
  $('file').addEventListener('change', (e) => { attachFiles(Array.from(e.target.files || [])); e.target.value = ''; });
  loadModel();
  $('input').focus();
}

document.addEventListener('DOMContentLoaded', init);
