// memprof's report page: everything it shows comes from the JSON report
// (version 2) embedded above, put on the page as text, never as markup.
"use strict";
(function () {
  const R = JSON.parse(document.getElementById("memprof-data").textContent);
  const $ = (id) => document.getElementById(id);
  const el = (tag, text) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; return e; };

  // Frames, once each: the locations table resolved.
  const frames = R.locations.map((l) => {
    const fn = l.function != null ? R.functions[l.function] : null;
    const mod = l.module != null ? R.modules[l.module] : null;
    const path = mod && mod.path;
    const name = fn && fn.name ? fn.name : path ? "[" + path.split("/").pop() + "]" : "[" + l.address + "]";
    const file = fn && fn.file != null ? R.files[fn.file] : null;
    return { name, file, line: l.line, inlined: l.inlined, module: path };
  });
  const where = (f) => (f.file ? f.file.split("/").pop() + (f.line != null ? ":" + f.line : "") : f.module || "");

  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  function bytes(n) {
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
  }
  const number = (n) => Math.round(n).toLocaleString("en-US");

  const live = R.mode === "live";
  const views = [["bytes", "Allocated"], ["count", "Calls"]];
  if (live) views.push(["live_bytes", "Live"]);
  const state = {
    process: 0,
    // Live bytes first in a live report, unless nothing was left live.
    view: live && R.processes.some((p) => p.stacks.some((s) => s.live_bytes > 0)) ? "live_bytes" : "bytes",
    focus: null, // a path of names from the root
    search: null,
    matched: 0,
    selection: null, // {from, to} sample indices
    sort: null,
    rows: 0,
    drawn: 0,
  };
  window.memprof = { state, frames };

  // A selection in time weighs stacks by the timeline's bytes.
  const show = (v) => (state.view === "count" && !state.selection ? number(v) + " calls" : bytes(v));
  const estimate = R.exact ? "" : " (estimated)";

  // --- header, processes, views
  $("summary").textContent =
    bytes(R.bytes) + " in " + number(R.count) + " allocations, " + R.processes.length +
    " process" + (R.processes.length === 1 ? "" : "es") + ", " + R.duration_secs.toFixed(2) + " s" +
    (R.exact ? " (exact counts)" : " (estimates: sampled every " + bytes(R.sample_bytes || 0) + ")");
  R.processes.forEach((p, i) => {
    const o = el("option", p.command + " (pid " + p.pid + ") " + bytes(p.bytes));
    o.value = i;
    $("process").appendChild(o);
  });
  $("process").onchange = (e) => { state.process = +e.target.value; state.focus = null; state.selection = null; redraw(); };
  for (const [key, label] of views) {
    const b = el("button", label);
    b.type = "button";
    b.dataset.view = key;
    b.onclick = () => { state.view = key; state.focus = null; redraw(); };
    $("views").appendChild(b);
  }
  $("search").oninput = (e) => {
    const text = e.target.value;
    try { state.search = text ? new RegExp(text) : null; } catch (_) { state.search = null; }
    drawFlame();
  };
  $("reset").onclick = () => { state.focus = null; drawFlame(); };
  $("clear-selection").onclick = () => { state.selection = null; redraw(); };

  const proc = () => R.processes[state.process];

  // --- what each stack weighs in the current view (and selection)
  function weights() {
    const p = proc();
    const w = p.stacks.map((s) => s[state.view] || 0);
    const t = p.timeline;
    if (!state.selection || !t) return { w, other: 0 };
    const { from, to } = state.selection;
    const followed = new Array(p.stacks.length).fill(0);
    let sum = 0;
    for (const band of t.stacks) {
      const v = from === to ? band.values[to] : band.values[to] - band.values[from];
      followed[band.stack] = Math.max(0, v);
      sum += followed[band.stack];
    }
    const total = from === to ? t.total[to] : t.total[to] - t.total[from];
    return { w: followed, other: Math.max(0, total - sum) };
  }

  // --- the flame graph (an icicle: callers above their callees)
  function tree() {
    const root = { name: "all", value: 0, children: new Map() };
    const p = proc();
    const { w, other } = weights();
    p.stacks.forEach((s, i) => {
      const v = w[i];
      if (!v) return;
      root.value += v;
      let node = root;
      for (let k = s.frames.length - 1; k >= 0; k--) {
        const f = frames[s.frames[k]];
        let child = node.children.get(f.name);
        if (!child) { child = { name: f.name, frame: f, value: 0, children: new Map(), parent: node }; node.children.set(f.name, child); }
        child.value += v;
        node = child;
      }
    });
    if (other > 0) {
      root.value += other;
      root.children.set("[stacks the timeline does not follow]", { name: "[stacks the timeline does not follow]", value: other, children: new Map(), parent: root });
    }
    return root;
  }

  const ROW = 18;
  let rects = [];
  function color(name, matched) {
    if (matched) return "#e040fb";
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
    const r = 205 + (Math.abs(h) % 50), g = 80 + (Math.abs(h >> 8) % 130), b = 40 + (Math.abs(h >> 16) % 40);
    return "rgb(" + r + "," + g + "," + b + ")";
  }

  function drawFlame() {
    const root = tree();
    // The focus: the node its path of names leads to, if it still exists.
    let focus = root;
    const path = [];
    for (const name of state.focus || []) {
      const next = focus.children.get(name);
      if (!next) break;
      focus = next;
      path.push(focus);
    }
    const canvas = $("flame");
    const width = canvas.clientWidth || 1000;
    let depth = 0;
    (function measure(n, d) { depth = Math.max(depth, d); for (const c of n.children.values()) if (c.value / focus.value * width >= 0.5) measure(c, d + 1); })(focus, path.length + 1);
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio;
    canvas.height = (depth + 1) * ROW * ratio;
    canvas.style.height = (depth + 1) * ROW + "px";
    const g = canvas.getContext("2d");
    g.scale(ratio, ratio);
    g.font = "12px system-ui, sans-serif";
    g.textBaseline = "middle";
    rects = [];
    let matched = 0;
    const total = focus.value || 1;
    function box(n, x, y, w, isMatch) {
      g.fillStyle = color(n.name, isMatch);
      g.fillRect(x, y, Math.max(w - 1, 0.5), ROW - 1);
      rects.push([x, y, w, n]);
      if (w > 30) {
        g.fillStyle = "#000";
        g.save();
        g.beginPath(); g.rect(x, y, w - 2, ROW); g.clip();
        g.fillText(n.name, x + 3, y + ROW / 2);
        g.restore();
      }
    }
    const matches = (n) => state.search && n.frame && (state.search.test(n.name) || (n.frame.file && state.search.test(n.frame.file)));
    // The root and the focus's ancestors, full width.
    box(root, 0, 0, width, false);
    path.forEach((n, i) => box(n, 0, (i + 1) * ROW, width, matches(n)));
    // A match at or above the focus holds all of it.
    const focusMatched = path.some(matches);
    if (focusMatched) matched = focus.value;
    (function draw(n, x, d, inMatch) {
      let cx = x;
      for (const c of n.children.values()) {
        const w = (c.value / total) * width;
        if (w < 0.5) { cx += w; continue; }
        const m = matches(c);
        if (m && !inMatch) matched += c.value;
        box(c, cx, d * ROW, w, m);
        draw(c, cx, d + 1, inMatch || m);
        cx += w;
      }
    })(focus, 0, path.length + 1, focusMatched);
    state.drawn = rects.length;
    state.matched = matched;
    $("matched").textContent = state.search ? "matched " + show(matched) + " (" + (100 * matched / total).toFixed(1) + "%)" : "";
    $("flame-label").textContent =
      "width: " + (state.selection ? "bytes" : { bytes: "bytes allocated", count: "calls", live_bytes: "bytes still live" }[state.view]) + estimate +
      (state.selection ? ", " + selectionText() : "") + "; click a frame to zoom";
    window.memprof.focusName = focus === root ? null : focus.name;
  }

  function pathOf(n) { const p = []; while (n && n.parent) { p.unshift(n.name); n = n.parent; } return p; }
  const hit = (e) => {
    const r = $("flame").getBoundingClientRect();
    const x = e.clientX - r.left, y = e.clientY - r.top;
    return rects.find(([rx, ry, rw]) => x >= rx && x < rx + rw && y >= ry && y < ry + ROW);
  };
  $("flame").onclick = (e) => { const h = hit(e); if (h) { state.focus = pathOf(h[3]); drawFlame(); } };
  $("flame").onmousemove = (e) => {
    const h = hit(e), tip = $("tip");
    if (!h) { tip.hidden = true; return; }
    const n = h[3], f = n.frame;
    tip.textContent = n.name + (f && f.inlined ? " (inlined)" : "") + (f ? "\n" + where(f) : "") + "\n" + show(n.value) + estimate;
    tip.style.left = Math.min(e.offsetX + 12, $("flame").clientWidth - 300) + "px";
    tip.style.top = e.offsetY + 16 + "px";
    tip.hidden = false;
  };
  $("flame").onmouseleave = () => { $("tip").hidden = true; };

  // --- the heap over time
  const PAD = 40;
  function drawTimeline() {
    const t = proc().timeline, canvas = $("timeline");
    $("timeline-section").hidden = !t;
    if (!t) return;
    const width = canvas.clientWidth || 1000, height = 160, ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio; canvas.height = height * ratio;
    const g = canvas.getContext("2d");
    g.scale(ratio, ratio);
    const max = Math.max(1, ...t.total), last = t.secs[t.secs.length - 1] || 1;
    const x = (s) => PAD + (s / last) * (width - PAD - 8), y = (v) => height - 20 - (v / max) * (height - 30);
    if (state.selection) {
      const { from, to } = state.selection;
      g.fillStyle = "#fff59d";
      g.fillRect(x(t.secs[from]) - 1, 0, Math.max(2, x(t.secs[to]) - x(t.secs[from]) + 2), height - 20);
    }
    g.beginPath(); g.moveTo(x(t.secs[0]), y(0));
    t.secs.forEach((s, i) => g.lineTo(x(s), y(t.total[i])));
    g.lineTo(x(last), y(0)); g.closePath();
    g.fillStyle = "rgba(2,119,189,.35)"; g.fill();
    g.strokeStyle = "#0277bd"; g.stroke();
    g.fillStyle = "#455a64"; g.font = "11px system-ui, sans-serif";
    g.fillText(bytes(max), 2, 12);
    g.fillText("0", 2, height - 22);
    g.fillText("0 s", PAD, height - 6);
    g.fillText(last.toFixed(2) + " s", width - 50, height - 6);
    const p = proc();
    if (live && p.peak_live_bytes) {
      const px = x(p.peak_secs), py = y(p.peak_live_bytes);
      g.beginPath(); g.arc(px, py, 4, 0, 7); g.fillStyle = "#d50000"; g.fill();
      g.fillText("peak " + bytes(p.peak_live_bytes) + " at " + p.peak_secs.toFixed(2) + " s" + (p.peak_exact ? " (exact)" : ""), Math.min(px + 6, width - 200), Math.max(py - 6, 12));
    }
    canvas._x = x;
  }
  function sampleAt(e) {
    const t = proc().timeline, r = $("timeline").getBoundingClientRect(), x = $("timeline")._x;
    let best = 0;
    t.secs.forEach((s, i) => { if (Math.abs(x(s) - (e.clientX - r.left)) < Math.abs(x(t.secs[best]) - (e.clientX - r.left))) best = i; });
    return best;
  }
  let dragFrom = null;
  $("timeline").onmousedown = (e) => { dragFrom = sampleAt(e); };
  $("timeline").onmouseup = (e) => {
    if (dragFrom === null) return;
    const at = sampleAt(e);
    state.selection = { from: Math.min(dragFrom, at), to: Math.max(dragFrom, at) };
    dragFrom = null;
    state.focus = null;
    redraw();
  };
  function selectionText() {
    const t = proc().timeline, { from, to } = state.selection;
    const held = t.metric === "live_bytes";
    if (from === to) return (held ? "held" : "allocated so far") + " at " + t.secs[to].toFixed(2) + " s";
    return (held ? "grown" : "allocated") + " from " + t.secs[from].toFixed(2) + " to " + t.secs[to].toFixed(2) + " s";
  }

  // --- the top call sites
  const columns = [["name", "Call site"], ["bytes", "Bytes"], ["count", "Calls"], ["average", "Average"]];
  if (live) columns.push(["live_bytes", "Live"], ["temporary_count", "Temporary"]);
  function drawSites() {
    const p = proc(), { w } = weights();
    const sites = new Map();
    p.stacks.forEach((s, i) => {
      const f = frames[s.frames[0]];
      const key = f ? f.name + " " + where(f) : "[no frame] " + s.allocator;
      let site = sites.get(key);
      if (!site) { site = { name: key, fn: f ? f.name : null, selected: 0, bytes: 0, count: 0, live_bytes: 0, temporary_count: 0 }; sites.set(key, site); }
      site.selected += w[i]; site.bytes += s.bytes; site.count += s.count;
      site.live_bytes += s.live_bytes || 0; site.temporary_count += s.temporary_count || 0;
    });
    const rows = [...sites.values()];
    rows.forEach((r) => { r.average = r.count ? r.bytes / r.count : 0; });
    const shown = state.selection ? [["selected", "In the selection"], ...columns.slice(1)] : columns.slice(1);
    const all = [columns[0], ...shown];
    const key = state.sort && all.some(([k]) => k === state.sort) ? state.sort : state.selection ? "selected" : state.view;
    rows.sort((a, b) => (key === "name" ? a.name.localeCompare(b.name) : b[key] - a[key]));
    const head = $("sites").tHead;
    head.textContent = "";
    const hr = head.insertRow();
    for (const [k, label] of all) {
      const th = el("th", label);
      th.className = k === "name" ? "name" : "";
      if (k === key) th.setAttribute("aria-sort", k === "name" ? "ascending" : "descending");
      th.onclick = () => { state.sort = k; drawSites(); };
      hr.appendChild(th);
    }
    const body = $("sites").tBodies[0];
    body.textContent = "";
    for (const r of rows.slice(0, 200)) {
      const tr = body.insertRow();
      for (const [k] of all) {
        const td = tr.insertCell();
        td.textContent = k === "name" ? r.name : k === "count" || k === "temporary_count" ? number(r[k]) : bytes(r[k]);
        if (k === "name") td.className = "name";
      }
      tr.onclick = () => {
        if (!r.fn) return;
        const exact = "^" + r.fn.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "$";
        $("search").value = exact;
        state.search = new RegExp(exact);
        drawFlame();
        $("flame").scrollIntoView({ block: "nearest" });
      };
    }
    state.rows = Math.min(rows.length, 200);
  }

  // --- the run's settings and what was lost
  function drawAbout() {
    const dl = $("settings");
    dl.textContent = "";
    const add = (k, v) => { if (v === undefined || v === null) return; dl.appendChild(el("dt", k)); dl.appendChild(el("dd", String(v))); };
    const p = proc();
    add("command", (p.cmdline && p.cmdline.length ? p.cmdline.join(" ") : p.command) + "  (pid " + p.pid + (p.exited ? ", exited" : "") + ")");
    add("executable", p.exe);
    add("mode", R.mode === "live" ? "live: what is still allocated" : "totals: what each call site allocated");
    add("counts", R.exact ? "exact: every call recorded" : "estimates: sampled every " + bytes(R.sample_bytes || 0));
    add("started", R.started_at);
    add("duration", R.duration_secs.toFixed(3) + " s");
    add("stacks", number(p.stacks.length) + " saved of " + number(p.total_stacks));
    if (R.cut) add("cut", "top " + (R.cut.top ?? "all") + ", depth " + (R.cut.depth ?? "all"));
    if (p.timeline) add("timeline", "a sample every " + p.timeline.period_secs + " s, " + p.timeline.stacks.length + " stacks followed");
    const lost = Object.entries(R.lost || {}).filter(([, v]) => v > 0);
    $("lost").textContent = lost.length ? lost.map(([k, v]) => k + ": " + number(v)).join(", ") : "none: every event was recorded";
  }

  function redraw() {
    for (const b of $("views").children) b.setAttribute("aria-pressed", String(b.dataset.view === state.view));
    $("clear-selection").hidden = !state.selection;
    $("selection-label").textContent = state.selection ? selectionText() : "drag to choose a range, click a moment";
    drawTimeline();
    drawFlame();
    drawSites();
    drawAbout();
  }
  // Where a frame named `name` is drawn, for tests that click it.
  window.memprof.rectOf = (name) => {
    const r = rects.find((r) => r[3].name === name);
    const box = $("flame").getBoundingClientRect();
    return r && { x: box.left + r[0] + r[2] / 2, y: box.top + r[1] + ROW / 2 };
  };
  window.addEventListener("resize", () => { drawTimeline(); drawFlame(); });
  redraw();
  window.memprof.ready = true;
})();
