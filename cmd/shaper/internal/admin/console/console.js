// shaper console: polls the admin API of this origin (SPEC §6) and draws
// what it answers. Plain browser JavaScript, no library, no build step.
//
// Values from the API (lane names, reasons, errors, keys) are only ever
// written with textContent or as attribute values, never parsed as HTML.
'use strict';

(() => {
  const POLL_MS = 1000;                 // GET v1/lanes once a second
  const HISTORY_MS = 5 * 60 * 1000;     // the charts' window, kept in memory
  const MIN_SPAN_MS = 60 * 1000;        // the charts' shortest window
  const TICK_STEPS_MS = [10000, 15000, 30000, 60000];
  const GAP_MS = 3500;                  // a longer gap between samples breaks a line
  const DEAD_LETTER_LIMIT = 100;
  const TOKEN_KEY = 'shaper.admin.token'; // sessionStorage: this tab only
  const COLORS = ['#2b6cb0', '#dd6b20', '#38a169', '#805ad5', '#d53f8c', '#319795', '#b7791f', '#e53e3e'];

  const $ = (sel) => document.querySelector(sel);
  const lanes = new Map(); // name -> {row, cells, formRow, color, history}
  let colorNext = 0;
  let polls = 0;
  let dlLane = null;

  // el builds an element; strings among children become text nodes.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === 'class') e.className = v;
      else if (k === 'data') Object.assign(e.dataset, v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    e.append(...children);
    return e;
  }

  // ---------------------------------------------------------------- formats

  function fmtNum(x) {
    if (!Number.isFinite(x)) return '–';
    const a = Math.abs(x);
    const digits = a >= 100 ? 0 : a >= 10 ? 1 : 2;
    return String(Number(x.toFixed(digits))); // 20, 19.5, 0.25
  }
  function fmtSeconds(s) {
    if (!Number.isFinite(s)) return '–';
    if (s === 0) return '0';
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 1 : 0) + ' ms';
    if (s < 120) return s.toFixed(1) + ' s';
    return (s / 60).toFixed(1) + ' min';
  }
  function fmtTime(d) {
    return d.toLocaleTimeString([], { hour12: false });
  }
  function fmtDate(iso) {
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString([], { hour12: false });
  }

  // ---------------------------------------------------------------- the API

  let tokenAsk = null; // the pending token request, shared by concurrent writes

  // askToken shows the token form and resolves to the token entered, or to
  // null when the operator cancels.
  function askToken(rejected) {
    if (tokenAsk) return tokenAsk;
    const dialog = $('#token-dialog');
    const input = $('#token-input');
    $('#token-error').hidden = !rejected;
    input.value = '';
    tokenAsk = new Promise((resolve) => {
      const done = (v) => {
        form.removeEventListener('submit', onSubmit);
        cancel.removeEventListener('click', onCancel);
        dialog.removeEventListener('cancel', onCancel);
        input.value = '';
        if (dialog.open) dialog.close();
        tokenAsk = null;
        resolve(v);
      };
      const form = $('#token-form');
      const cancel = $('#token-cancel');
      const onSubmit = (ev) => { ev.preventDefault(); if (input.value !== '') done(input.value); };
      const onCancel = (ev) => { ev.preventDefault(); done(null); };
      form.addEventListener('submit', onSubmit);
      cancel.addEventListener('click', onCancel);
      dialog.addEventListener('cancel', onCancel);
      dialog.showModal();
      input.focus();
    });
    return tokenAsk;
  }

  // api calls the admin API and returns the decoded JSON answer, or throws
  // an Error with the API's message. A write answered 401 asks for the
  // token, keeps it for the tab and tries again.
  async function api(method, path, body) {
    let rejected = false;
    for (;;) {
      const headers = { Accept: 'application/json' };
      if (body !== undefined) headers['Content-Type'] = 'application/json';
      const token = method === 'GET' ? null : sessionStorage.getItem(TOKEN_KEY);
      if (token) headers.Authorization = 'Bearer ' + token;
      const resp = await fetch(path, {
        method, headers, cache: 'no-store', credentials: 'same-origin',
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (resp.status === 401 && method !== 'GET') {
        if (token) {
          sessionStorage.removeItem(TOKEN_KEY);
          rejected = true;
        }
        const entered = await askToken(rejected);
        if (entered === null) throw new Error('not sent: this action needs the admin token');
        sessionStorage.setItem(TOKEN_KEY, entered);
        continue;
      }
      let data = null;
      try { data = await resp.json(); } catch (_) { /* not JSON */ }
      if (!resp.ok) throw new Error((data && data.error) || (resp.status + ' ' + resp.statusText));
      return data;
    }
  }

  const lanePath = (name, rest) => 'v1/lanes/' + encodeURIComponent(name) + (rest || '');

  function setStatus(text, isError) {
    const s = $('#status');
    s.textContent = text;
    s.classList.toggle('error', !!isError);
  }
  function setMessage(text, isError) {
    const m = $('#message');
    m.textContent = text;
    m.className = isError ? 'error' : 'muted';
  }

  // ---------------------------------------------------------------- lanes

  function laneEntry(name) {
    let L = lanes.get(name);
    if (L) return L;
    const cell = (field, cls) => el('td', { class: cls || '', data: { field } });
    const cells = {
      lane: cell('lane'),
      state: cell('state'),
      rate: el('span', { data: { field: 'rate' } }),
      limit: el('span', { data: { field: 'limit' } }),
      achieved: cell('achieved', 'num'),
      depth: el('span', { data: { field: 'depth' } }),
      capacity: el('span', { data: { field: 'capacity' } }),
      bar: el('span'),
      inFlight: cell('in_flight', 'num'),
      wait: cell('queue_wait_p99', 'num'),
      dead: el('button', { type: 'button', class: 'link', data: { action: 'dead-letters', field: 'dead_letters' }, title: 'show the dead letters' }),
      lastError: cell('last_error', 'error-text'),
      pause: el('button', { type: 'button', data: { action: 'pause' } }, 'Pause…'),
      resume: el('button', { type: 'button', data: { action: 'resume' } }, 'Resume'),
    };
    cells.lane.textContent = name;
    const row = el('tr', { data: { lane: name } },
      cells.lane, cells.state,
      el('td', { class: 'num' }, cells.rate, ' / ', cells.limit, '/s'),
      cells.achieved,
      el('td', { class: 'num' }, cells.depth, ' / ', cells.capacity, el('span', { class: 'bar' }, cells.bar)),
      cells.inFlight, cells.wait,
      el('td', { class: 'num' }, cells.dead),
      cells.lastError,
      el('td', { class: 'actions' }, cells.pause, cells.resume));

    const forInput = el('input', { name: 'for', size: '10', placeholder: 'e.g. 10m', title: 'a Go duration; empty: until resumed' });
    const reasonInput = el('input', { name: 'reason', size: '24', placeholder: 'optional' });
    const formMsg = el('span', { class: 'error' });
    const form = el('form', { class: 'inline' },
      el('label', {}, 'pause for ', forInput), el('span', { class: 'muted' }, '(empty: until resumed)'),
      el('label', {}, 'reason ', reasonInput),
      el('button', { type: 'submit', class: 'danger', data: { action: 'pause-confirm' } }, 'Pause lane'),
      el('button', { type: 'button', onclick: () => { formRow.hidden = true; } }, 'Cancel'),
      formMsg);
    const formRow = el('tr', { class: 'pause-form', data: { pauseFormFor: name } }, el('td', { colspan: '10' }, form));
    formRow.hidden = true;

    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const req = {};
      if (forInput.value.trim() !== '') req.for = forInput.value.trim();
      if (reasonInput.value.trim() !== '') req.reason = reasonInput.value.trim();
      formMsg.textContent = '';
      try {
        const v = await api('POST', lanePath(name, '/pause'), req);
        formRow.hidden = true;
        updateLane(v);
        setMessage('Paused ' + name + '.', false);
      } catch (e) {
        formMsg.textContent = e.message;
      }
    });
    cells.pause.addEventListener('click', () => {
      formRow.hidden = !formRow.hidden;
      if (!formRow.hidden) forInput.focus();
    });
    cells.resume.addEventListener('click', async () => {
      try {
        updateLane(await api('POST', lanePath(name, '/resume')));
        setMessage('Resumed ' + name + '.', false);
      } catch (e) {
        setMessage('Resume ' + name + ': ' + e.message, true);
      }
    });
    cells.dead.addEventListener('click', () => openDeadLetters(name));

    L = { row, formRow, cells, color: COLORS[colorNext++ % COLORS.length], history: [], view: null };
    lanes.set(name, L);
    return L;
  }

  // updateLane writes view v into its row.
  function updateLane(v) {
    const L = laneEntry(v.lane);
    const c = L.cells;
    L.view = v;
    c.state.replaceChildren(el('span', { class: 'state ' + v.state }, v.state));
    if (v.state === 'paused') {
      const until = v.paused_until ? 'until ' + fmtTime(new Date(v.paused_until)) : 'until resumed';
      c.state.append(el('span', { class: 'state-detail' }, until));
      if (v.pause_reason) c.state.append(el('span', { class: 'state-detail' }, v.pause_reason));
    } else if (v.state === 'open' && v.pause_reason) { // the breaker: probing, or held after a 410
      c.state.append(el('span', { class: 'state-detail' }, v.pause_reason));
    }
    if (v.quota_remaining !== null && v.quota_remaining !== undefined) { // rate.quota
      c.state.append(el('span', { class: 'state-detail' }, 'quota left ' + String(v.quota_remaining)));
    }
    c.rate.textContent = fmtNum(v.rate_per_second);
    c.limit.textContent = fmtNum(v.limit_per_second);
    c.achieved.textContent = fmtNum(v.achieved_per_second) + '/s';
    c.depth.textContent = String(v.depth);
    c.capacity.textContent = String(v.capacity);
    c.bar.style.width = (v.capacity > 0 ? Math.min(100, 100 * v.depth / v.capacity) : 0) + '%';
    c.inFlight.textContent = String(v.in_flight);
    c.wait.textContent = fmtSeconds(v.queue_wait_p99_seconds);
    c.dead.textContent = String(v.dead_letters);
    c.lastError.textContent = v.last_error || '';
    c.lastError.title = v.last_error || '';
    c.resume.disabled = !(v.state === 'paused' || v.state === 'open');
    c.pause.disabled = v.state === 'draining' || v.state === 'stopped';
  }

  function render(views, now) {
    const tbody = $('#lanes tbody');
    const seen = new Set();
    // Rows are moved only when out of order: moving a row takes it out of
    // the document for a moment, which blurs a pause form being typed in
    // and detaches a button under the pointer, on every poll.
    let next = tbody.firstElementChild; // where the next row belongs
    views.slice().sort((a, b) => (a.lane < b.lane ? -1 : a.lane > b.lane ? 1 : 0)).forEach((v) => {
      seen.add(v.lane);
      updateLane(v);
      const L = lanes.get(v.lane);
      L.history.push({ t: now, achieved: v.achieved_per_second, limit: v.limit_per_second,
        depth: v.depth, wait: v.queue_wait_p99_seconds });
      while (L.history.length && L.history[0].t < now - HISTORY_MS) L.history.shift();
      for (const node of [L.row, L.formRow]) {
        if (node === next) next = node.nextElementSibling;
        else tbody.insertBefore(node, next); // next null: at the end
      }
    });
    for (const [name, L] of lanes) {
      if (!seen.has(name)) { L.row.remove(); L.formRow.remove(); lanes.delete(name); }
    }
    $('#no-lanes').hidden = lanes.size > 0;
    renderLegend();
    drawCharts(now);
  }

  function renderLegend() {
    const items = [];
    for (const [name, L] of lanes) {
      const sw = el('span', { class: 'swatch' });
      sw.style.background = L.color;
      items.push(el('span', {}, sw, name));
    }
    $('#legend').replaceChildren(...items);
  }

  // ---------------------------------------------------------------- charts

  const charts = [
    { id: 'chart-achieved', key: 'achieved', fmt: fmtNum, limitLine: true },
    { id: 'chart-depth', key: 'depth', fmt: (x) => x.toFixed(0) },
    { id: 'chart-wait', key: 'wait', fmt: fmtSeconds },
  ];

  function drawCharts(now) {
    let samples = 0;
    for (const L of lanes.values()) samples = Math.max(samples, L.history.length);
    for (const ch of charts) {
      const canvas = document.getElementById(ch.id);
      drawChart(canvas, ch, now);
      canvas.dataset.samples = String(samples);
    }
  }

  // drawChart draws one series per lane over the last HISTORY_MS, y from 0,
  // with the lane's limit as a dashed line where ch.limitLine is set.
  function drawChart(canvas, ch, now) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(200, Math.round(canvas.clientWidth || 600));
    const h = Math.max(100, Math.round(canvas.clientHeight || 180));
    if (canvas.width !== w * dpr || canvas.height !== h * dpr) {
      canvas.width = w * dpr;
      canvas.height = h * dpr;
    }
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const pad = { l: 56, r: 10, t: 8, b: 20 };
    const pw = w - pad.l - pad.r;
    const ph = h - pad.t - pad.b;
    // The window: the history kept, at most HISTORY_MS and at least a
    // minute, so that the first samples after the page opened are visible.
    let oldest = now;
    for (const L of lanes.values()) if (L.history.length) oldest = Math.min(oldest, L.history[0].t);
    const span = Math.min(HISTORY_MS, Math.max(MIN_SPAN_MS, now - oldest));
    const t0 = now - span;

    let max = 0;
    for (const L of lanes.values()) {
      for (const s of L.history) {
        max = Math.max(max, s[ch.key] || 0);
        if (ch.limitLine) max = Math.max(max, s.limit || 0);
      }
    }
    max = max > 0 ? max * 1.1 : 1;
    const x = (t) => pad.l + pw * (t - t0) / span;
    const y = (v) => pad.t + ph * (1 - v / max);

    // Grid and labels.
    g.font = '11px system-ui, sans-serif';
    g.fillStyle = '#677083';
    g.strokeStyle = '#e6e9ef';
    g.lineWidth = 1;
    g.textBaseline = 'middle';
    g.textAlign = 'right';
    for (let i = 0; i <= 4; i++) {
      const v = max * i / 4;
      const yy = Math.round(y(v)) + 0.5;
      g.beginPath(); g.moveTo(pad.l, yy); g.lineTo(w - pad.r, yy); g.stroke();
      g.fillText(ch.fmt(v), pad.l - 6, yy);
    }
    g.textAlign = 'center';
    g.textBaseline = 'top';
    const step = TICK_STEPS_MS.find((st) => span / st <= 6) || 60000;
    for (let back = 0; back <= span; back += step) {
      const xx = Math.round(x(now - back)) + 0.5;
      g.beginPath(); g.moveTo(xx, pad.t); g.lineTo(xx, pad.t + ph); g.stroke();
      const label = back === 0 ? 'now' : back % 60000 === 0 ? '−' + back / 60000 + ' min' : '−' + back / 1000 + ' s';
      g.fillText(label, Math.min(Math.max(xx, pad.l + 12), w - pad.r - 12), pad.t + ph + 4);
    }

    // Series.
    const line = (hist, key, color, dash) => {
      g.strokeStyle = color;
      g.lineWidth = dash ? 1 : 1.8;
      g.setLineDash(dash ? [4, 4] : []);
      g.beginPath();
      let prev = null;
      for (const s of hist) {
        const v = s[key];
        if (!Number.isFinite(v)) { prev = null; continue; }
        if (prev === null || s.t - prev > GAP_MS) g.moveTo(x(s.t), y(v));
        else g.lineTo(x(s.t), y(v));
        prev = s.t;
      }
      g.stroke();
      g.setLineDash([]);
    };
    for (const L of lanes.values()) {
      if (ch.limitLine) line(L.history, 'limit', L.color, true);
      line(L.history, ch.key, L.color, false);
    }
  }

  // ---------------------------------------------------------------- dead letters

  function dlFilter() {
    const f = {};
    const reason = $('#dl-reason').value;
    const since = $('#dl-since').value.trim();
    if (reason) f.reason = reason;
    if (since) f.since = since;
    return f;
  }

  function openDeadLetters(name) {
    dlLane = name;
    $('#dl-lane').textContent = name;
    $('#dl-confirm').hidden = true;
    $('#dead-letters').hidden = false;
    loadDeadLetters();
    $('#dead-letters').scrollIntoView({ block: 'start' });
  }

  async function loadDeadLetters() {
    if (dlLane === null) return;
    const name = dlLane;
    const q = new URLSearchParams({ limit: String(DEAD_LETTER_LIMIT), ...dlFilter() });
    const msg = $('#dl-message');
    const tbody = $('#dl-table tbody');
    msg.className = 'muted';
    msg.textContent = 'loading…';
    try {
      const list = (await api('GET', lanePath(name, '/dead-letters?' + q.toString()))) || [];
      if (dlLane !== name) return;
      tbody.replaceChildren(...list.map((d) => el('tr', { data: { seq: String(d.seq) } },
        el('td', { class: 'num' }, String(d.seq)),
        el('td', { class: 'num' }, fmtDate(d.time)),
        el('td', {}, d.key || ''),
        el('td', {}, d.reason || ''),
        el('td', { class: 'num' }, String(d.attempts)),
        el('td', { class: 'num' }, d.last_status ? String(d.last_status) : ''),
        el('td', { class: 'error-text' }, d.last_error || ''),
        el('td', {}, d.subject || ''))));
      msg.textContent = list.length === 0 ? 'No dead letters match.'
        : list.length >= DEAD_LETTER_LIMIT ? 'The first ' + DEAD_LETTER_LIMIT + ' shown.'
          : list.length + (list.length === 1 ? ' dead letter.' : ' dead letters.');
    } catch (e) {
      msg.className = 'error';
      msg.textContent = e.message;
    }
  }

  function setupDeadLetters() {
    $('#dl-filter').addEventListener('submit', (ev) => { ev.preventDefault(); loadDeadLetters(); });
    $('#dl-reason').addEventListener('change', loadDeadLetters);
    $('#dl-close').addEventListener('click', () => { $('#dead-letters').hidden = true; dlLane = null; });
    $('#dl-replay').addEventListener('click', () => {
      const f = dlFilter();
      $('#dl-confirm-text').textContent = 'Replay every dead letter of ' + dlLane +
        (f.reason ? ' with reason ' + f.reason : '') + (f.since ? ' since ' + f.since : '') + '?';
      $('#dl-confirm').hidden = false;
    });
    $('#dl-replay-cancel').addEventListener('click', () => { $('#dl-confirm').hidden = true; });
    $('#dl-replay-confirm').addEventListener('click', async () => {
      $('#dl-confirm').hidden = true;
      const name = dlLane;
      const msg = $('#dl-message');
      try {
        const res = await api('POST', lanePath(name, '/dead-letters/replay'), dlFilter());
        await loadDeadLetters();
        msg.className = 'muted';
        msg.textContent = 'Replayed ' + (res ? res.replayed : 0) + ' through ' + name + '. ' + msg.textContent;
      } catch (e) {
        msg.className = 'error';
        msg.textContent = 'Replay: ' + e.message;
      }
    });
  }

  // ---------------------------------------------------------------- polling

  async function poll() {
    const started = Date.now();
    try {
      const views = (await api('GET', 'v1/lanes')) || [];
      const now = Date.now();
      render(views, now);
      polls++;
      document.body.dataset.polls = String(polls);
      setStatus('updated ' + fmtTime(new Date(now)), false);
    } catch (e) {
      setStatus('admin API unreachable: ' + e.message, true);
    } finally {
      setTimeout(poll, Math.max(0, POLL_MS - (Date.now() - started)));
    }
  }

  setupDeadLetters();
  window.addEventListener('resize', () => drawCharts(Date.now()));
  poll();
})();
