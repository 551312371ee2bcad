// tito view: the runs page and the record page, drawn from the viewer's JSON API (no library, no CDN).
"use strict";

const PAGE_ROWS = 200; // rows of the runs table drawn at a time
const CHUNK = 1500; // tokens drawn at a time on the record page, when scrolled into view
const POLL_MS = 2000; // a live source's runs page (the gateway's /ui) is fetched again this often
const KINDS = { p: "prompt", o: "output (loss mask 1)", b: "template boundary" };
const PALETTE = ["#2f6fdd", "#e07b24", "#2ca05a", "#c53a8a", "#7a5af5", "#1a9aa8", "#b8860b", "#6b7280"];
const state = {
  runs: null, shown: PAGE_ROWS, sort: { key: "index", asc: true }, filter: "", status: "", heat: false,
  versions: [], // every weight version of the source, in order: a version's colour is its place here, on every page
  poll: null, // the live runs page's timer
};
const main = () => document.getElementById("main");
let current = null; // the record page's branch: { branch, images } (for the token details)
let selected = null; // the token chosen by keyboard or click: its index; its details stay shown while pinned
let pinned = false;

// --- data -------------------------------------------------------------------------------------------

function credential() {
  const hash = location.hash;
  if (hash.startsWith("#key=")) { // a gateway's key, given in the fragment (never sent to a server, never logged)
    sessionStorage.setItem("tito-key", decodeURIComponent(hash.slice(5)));
    history.replaceState(null, "", location.pathname + "#/");
  }
  return sessionStorage.getItem("tito-key");
}

async function get(path) {
  const key = credential();
  const response = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {} });
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response;
}

async function api(path) { return (await get(path)).json(); }

async function blobUrl(path) { return URL.createObjectURL(await (await get(path)).blob()); }

// --- small DOM helpers --------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name === "style") node.style.cssText = value; // CSSOM: allowed by the page's style-src 'self'
    else node.setAttribute(name, value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

const esc = (s) => s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
const num = (v, digits = 3) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
const sci = (v) => (v === null || v === undefined ? "–" : Number(v).toExponential(2));
const scroller = (...children) => el("div", { class: "scroll" }, ...children); // scrolls sideways on a narrow screen

function versionColour(version) {
  // the palette, then hues a golden angle apart: a file with many versions still gives each its own
  const at = state.versions.indexOf(version) < 0 ? state.versions.length : state.versions.indexOf(version);
  return at < PALETTE.length ? PALETTE[at] : `hsl(${Math.round((at * 137.508) % 360)} 65% 42%)`;
}

function versionLegend(versions, id) {
  if (!versions.length) return null;
  return el("div", { class: "legend versions", id },
    el("span", { class: "muted", text: "weights:" }),
    ...versions.map((v) => el("span", { class: "version", "data-version": v },
      el("i", { class: "swatch", style: `background:${versionColour(v)}` }), ` ${v}`)));
}

// --- the runs page ------------------------------------------------------------------------------------

async function runsPage() {
  const data = (state.runs = await api("api/runs"));
  state.versions = data.versions || [];
  document.getElementById("source").textContent = data.title + (data.live ? " (live)" : "");
  const root = main();
  root.replaceChildren(el("h2", { id: "title" }), el("div", { class: "chips", id: "statuses" }),
    el("div", { class: "charts", id: "charts" }), el("div", { id: "versions" }));
  if (data.audit) root.append(auditTable(data.audit));
  if (data.figures && data.figures.length) {
    const box = el("div", { class: "figures" });
    data.figures.forEach((name, i) => {
      const img = el("img", { alt: name, title: name, class: "figure" });
      blobUrl(`figures/${i}`).then((url) => (img.src = url));
      box.append(img);
    });
    root.append(box);
  }
  const filter = el("input", { type: "search", placeholder: "filter: task, status, reason", value: state.filter,
    "aria-label": "filter the rollouts" });
  filter.addEventListener("input", () => { state.filter = filter.value.toLowerCase(); state.shown = PAGE_ROWS; drawTable(); });
  const status = el("select", { id: "status", "aria-label": "status" });
  status.addEventListener("change", () => { state.status = status.value; state.shown = PAGE_ROWS; drawTable(); });
  root.append(el("div", { class: "controls" }, filter, status, el("span", { class: "muted", id: "count" }),
    data.live ? el("span", { class: "muted", id: "live", text: `live: refreshed every ${POLL_MS / 1000} s` }) : null));
  root.append(scroller(el("table", { class: "runs", id: "runs" })), el("div", { id: "more" }));
  drawRuns();
  if (data.live) poll();
}

function drawRuns() {
  const data = state.runs;
  const n = data.rows.length;
  document.getElementById("title").textContent = `${n} rollout${n === 1 ? "" : "s"}`;
  document.getElementById("statuses").replaceChildren(
    ...Object.entries(data.statuses).map(([s, k]) => el("span", { class: s, text: `${s}: ${k}` })));
  document.getElementById("charts").replaceChildren(rewardChart(data.groups), turnChart(data.rows));
  document.getElementById("versions").replaceChildren(versionLegend(state.versions, "version-legend") || "");
  const status = document.getElementById("status");
  status.replaceChildren(el("option", { value: "", text: "any status" }),
    ...Object.keys(data.statuses).map((s) => el("option", { value: s, text: s })));
  status.value = state.status;
  drawTable();
}

function poll() {
  clearTimeout(state.poll);
  state.poll = setTimeout(async () => {
    if (!document.getElementById("runs")) return; // left the runs page
    try {
      const data = await api("api/runs");
      if (JSON.stringify(data) !== JSON.stringify(state.runs)) {
        state.runs = data;
        state.versions = data.versions || state.versions;
        if (document.getElementById("runs")) drawRuns();
      }
      document.getElementById("live").textContent = `live: refreshed every ${POLL_MS / 1000} s`;
    } catch (error) {
      const live = document.getElementById("live");
      if (live) live.textContent = `live: not refreshed (${error.message})`;
    }
    poll();
  }, POLL_MS);
}

const COLUMNS = [
  ["task_id", "task"], ["sample", "sample"], ["status", "status"], ["status_reason", "reason"], ["reward", "reward"],
  ["advantage", "advantage"], ["tokens", "tokens"], ["turns", "turns"], ["branches", "branches"],
  ["images", "images"], ["weight_versions", "weights"],
];
const AUDIT_COLUMNS = [["audit_max_abs", "max |Δ|"], ["audit_free_k3", "free k3"]]; // with --audit

function columns() { return state.runs.audit ? [...COLUMNS, ...AUDIT_COLUMNS] : COLUMNS; }

function cell(key, r) {
  if (key === "task_id") return el("td", {}, el("a", { href: `#/record/${r.index}`, text: r.task_id }));
  if (key === "status_reason") return el("td", { class: "reason", text: r.status_reason || "" });
  if (key === "reward" || key === "advantage") return el("td", { text: num(r[key]) });
  if (key.startsWith("audit_")) return el("td", { class: "audit-cell", text: sci(r[key]) });
  return el("td", { text: r[key] ?? "–" });
}

function visibleRows() {
  const { filter, status, sort } = state;
  const rows = state.runs.rows.filter((r) => (!status || r.status === status) && (!filter ||
    `${r.task_id} ${r.status} ${r.status_reason || ""}`.toLowerCase().includes(filter)));
  const key = sort.key;
  rows.sort((a, b) => {
    const x = a[key], y = b[key];
    if (x === y) return String(a.index).localeCompare(String(b.index), undefined, { numeric: true });
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true });
    return sort.asc ? order : -order;
  });
  return rows;
}

function drawTable() {
  const rows = visibleRows();
  const table = document.getElementById("runs");
  const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest("th");
  const head = el("tr", {}, ...columns().map(([key, label]) => {
    const sorted = state.sort.key === key;
    const th = el("th", { "data-key": key, class: sorted ? `sorted${state.sort.asc ? " asc" : ""}` : null,
      "aria-sort": sorted ? (state.sort.asc ? "ascending" : "descending") : "none" },
    el("button", { type: "button", text: label, title: `sort by ${label}` })); // a button: Tab reaches it, Enter sorts
    th.addEventListener("click", () => {
      state.sort = { key, asc: state.sort.key === key ? !state.sort.asc : true };
      drawTable();
      document.querySelector(`#runs th[data-key="${key}"] button`).focus();
    });
    return th;
  }));
  const keys = columns().map(([key]) => key);
  const body = rows.slice(0, state.shown).map((r) =>
    el("tr", { class: "run", "data-status": r.status }, ...keys.map((key) => cell(key, r))));
  table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
  if (focused) { const again = table.querySelector(`th[data-key="${focused.dataset.key}"] button`); if (again) again.focus(); }
  document.getElementById("count").textContent = `${rows.length} shown of ${state.runs.rows.length}`;
  const more = document.getElementById("more");
  more.replaceChildren();
  if (rows.length > state.shown) {
    const button = el("button", { type: "button", text: `show ${Math.min(PAGE_ROWS, rows.length - state.shown)} more` });
    button.addEventListener("click", () => { state.shown += PAGE_ROWS; drawTable(); });
    more.append(button);
  }
}

function chartBox(title, cls, width, height) {
  const box = el("div", { class: `chart ${cls}` }, el("h3", { text: title }));
  const plot = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title });
  box.append(plot);
  return [box, plot];
}

function rewardChart(groups) {
  const [box, plot] = chartBox("reward per group (each dot a rollout, bar the mean)", "reward-chart", 460, 170);
  const rewards = groups.flatMap((g) => g.rewards);
  if (!rewards.length) { box.append(el("p", { class: "muted", text: "no rewards" })); return box; }
  let lo = Math.min(...rewards), hi = Math.max(...rewards);
  if (lo === hi) { lo -= 0.5; hi += 0.5; }
  const x0 = 34, x1 = 450, y0 = 150, y1 = 10;
  const x = (i) => x0 + ((i + 0.5) * (x1 - x0)) / groups.length;
  const y = (v) => y0 - ((v - lo) * (y0 - y1)) / (hi - lo);
  plot.append(svg("line", { x1: x0, y1: y0, x2: x1, y2: y0, stroke: "#d8dde5" }));
  for (const v of [lo, hi]) {
    const label = svg("text", { x: 2, y: y(v) + 3 }); label.textContent = num(v, 2); plot.append(label);
  }
  groups.forEach((g, i) => {
    const mean = g.rewards.reduce((a, b) => a + b, 0) / g.rewards.length;
    const bar = svg("line", { x1: x(i) - 5, x2: x(i) + 5, y1: y(mean), y2: y(mean), stroke: "#1d2430", "stroke-width": 2 });
    bar.append(Object.assign(svg("title"), { textContent: `${g.task_id}: mean ${num(mean)}` }));
    plot.append(bar);
    for (const r of g.rewards) plot.append(svg("circle", { class: "pt", cx: x(i), cy: y(r), r: 3, fill: "#2f6fdd", "fill-opacity": 0.5 }));
  });
  return box;
}

function turnChart(rows) {
  const [box, plot] = chartBox("output tokens per turn (final branch, mean over rollouts)", "turn-chart", 360, 170);
  const sums = [], counts = [];
  for (const r of rows) r.turn_tokens.forEach((n, i) => { sums[i] = (sums[i] || 0) + n; counts[i] = (counts[i] || 0) + 1; });
  if (!sums.length) { box.append(el("p", { class: "muted", text: "no turns" })); return box; }
  const means = sums.map((s, i) => s / counts[i]);
  const top = Math.max(...means), width = 320 / means.length;
  means.forEach((m, i) => {
    const h = (m / top) * 140;
    const bar = svg("rect", { class: "bar", x: 34 + i * width + 1, y: 150 - h, width: Math.max(width - 2, 1), height: h, fill: "#2ca05a" });
    bar.append(Object.assign(svg("title"), { textContent: `turn ${i}: ${num(m, 1)} tokens (${counts[i]} rollouts)` }));
    plot.append(bar);
  });
  const label = svg("text", { x: 2, y: 14 }); label.textContent = num(top, 0); plot.append(label);
  return box;
}

function auditTable(audit) {
  const row = (name, s) => el("tr", {}, el("td", { text: name }), el("td", { text: s ? s.tokens : "–" }),
    el("td", { text: sci(s && s.mean_abs) }), el("td", { text: sci(s && s.max_abs) }), el("td", { text: sci(s && s.k3) }));
  return el("div", { class: "chart audit" }, el("h3", { text: `audit: ${audit.scorer}` }),
    scroller(el("table", { class: "runs" }, el("tr", {}, ...["tokens", "n", "mean |Δ|", "max |Δ|", "k3"].map((t) => el("th", { text: t }))),
      row("free turns", audit.free), row("constrained turns", audit.constrained), row("all", audit.all))),
    el("p", { class: "muted", text: "per rollout: the max |Δ| and free k3 columns of the table below (click to sort)" }));
}

// --- the record page ----------------------------------------------------------------------------------

async function recordPage(key, branchNo) {
  const rec = await api(`api/records/${encodeURIComponent(key)}`);
  if (rec.version_order) state.versions = rec.version_order;
  const branches = rec.branches;
  const branch = branches.find((b) => String(b.branch) === branchNo) || branches[branches.length - 1];
  const root = main();
  root.replaceChildren(el("p", {}, el("a", { href: "#/", text: "← runs" })),
    el("h2", { text: `${rec.task_id} · sample ${rec.sample}` }));
  const field = (name, value) => [el("dt", { text: name }), el("dd", { text: value ?? "–" })];
  root.append(el("dl", { class: "fields", id: "fields" },
    ...field("status", rec.status + (rec.status_reason ? ` (${rec.status_reason})` : "")),
    ...field("reward", num(rec.reward)), ...field("advantage", num(rec.advantage)),
    ...field("turn rewards", rec.turn_rewards ? rec.turn_rewards.map((v) => num(v)).join(", ") : null),
    ...field("weights", rec.weight_versions), ...field("engine", rec.server), ...field("group", rec.group),
    ...field("branch shown", `${branch.branch} of ${branches.length} (${branch.status}` +
      (branch.status_reason ? `: ${branch.status_reason}` : "") + ")")));
  root.append(branchTree(key, branches, branch.branch));
  const legend = el("div", { class: "legend", id: "legend" }, el("span", { class: "p", text: "prompt" }),
    el("span", { class: "o", text: "output (trained)" }), el("span", { class: "b", text: "boundary" }),
    el("span", { class: "forced", text: "forced turn output" }),
    el("span", { class: "muted marks", text: "marks: ↵ newline, · space" }));
  if (!rec.decoded) legend.append(el("span", { class: "muted", text: "token ids (start with --tokenizer or --config for text)" }));
  const own = state.versions.filter((v) => (branch.versions || []).includes(v));
  root.append(legend, versionLegend(own, "record-versions"));
  if (branch.deltas) {
    const heat = el("label", {}, el("input", { type: "checkbox", id: "heat" }), " audit |Δlogprob| heat map");
    heat.firstChild.checked = state.heat;
    heat.firstChild.addEventListener("change", (e) => { state.heat = e.target.checked; drawTokens(branch); });
    root.append(el("div", { class: "legend" }, heat, heatScale()));
  }
  root.append(el("p", { class: "muted keys", text: "tokens: hover or tap for details; Tab to them, ← → to move, " +
      "Enter to pin the details, Esc to close" }),
    el("div", { class: "tokens", id: "tokens", tabindex: "0", role: "group",
      "aria-label": "tokens: arrow keys move between them, Enter pins the details, Escape closes them" }));
  drawTokens(branch);
  const box = document.getElementById("tokens");
  box.addEventListener("keydown", onTokenKey);
  box.addEventListener("focus", () => { if (selected === null && box.matches(":focus-visible")) moveBy(1, -1); });
}

function heatScale() {
  // |Δ| on a log scale, 1e-6 .. 1 nats, as 10 levels: the same colours as the tokens (viewer.css)
  const steps = Array.from({ length: 10 }, (_, k) => el("span", { "data-heat": k, title: `|Δ| ≈ ${(10 ** (-6 + (6 * k) / 9)).toExponential(0)} nats` }));
  return el("span", { class: "heat-scale", id: "heat-scale", "aria-label": "heat scale: |Δlogprob| from 1e-6 to 1 nat" },
    el("span", { class: "muted", text: "1e-6" }), ...steps, el("span", { class: "muted", text: "1 nat" }));
}

function branchTree(key, branches, current) {
  const children = new Map();
  for (const b of branches) {
    const parent = b.parent ?? null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(b);
  }
  const known = new Set(branches.map((b) => b.branch));
  const forked = (b) => ` · shares ${b.shared} token${b.shared === 1 ? "" : "s"} with branch ${b.parent}` +
    (b.fork_at !== b.shared ? ` (forked at token ${b.fork_at})` : "") + `: ${b.fork_reason || "?"}`;
  const node = (b) => el("li", { class: "branch", "data-branch": b.branch },
    el("a", { href: `#/record/${key}/${b.branch}`, class: b.branch === current ? "current" : null, text: `branch ${b.branch}` }),
    el("span", { class: "muted", text: ` · ${b.status}` + (b.label ? ` · lineage ${b.label}` : "") +
      (known.has(b.parent) ? forked(b) : b.fork_reason ? ` · ${b.fork_reason}` : "") }),
    list(b.branch));
  const list = (parent) => {
    const kids = children.get(parent) || [];
    return kids.length ? el("ul", {}, ...kids.map(node)) : null;
  };
  const top = el("ul", {}, ...branches.filter((b) => !known.has(b.parent)).map(node));
  return el("div", { class: "tree", id: "tree" }, el("h3", { text: `branches (${branches.length})` }), top);
}

function turnBlocks(branch) {
  // one block per turn: its prompt (boundary + new prompt) then its output; an image never split
  const blocks = new Map();
  branch.turn_of.forEach((t, i) => { if (!blocks.has(t)) blocks.set(t, [i, i]); blocks.get(t)[1] = i + 1; });
  return [...blocks.entries()].sort((a, b) => a[1][0] - b[1][0]);
}

function drawTokens(branch) {
  const images = new Map(branch.images.map((im, k) => [im.start, { ...im, k }]));
  current = { branch, images };
  selected = null;
  hideTip(true);
  const box = document.getElementById("tokens");
  box.replaceChildren();
  box.classList.toggle("heat", state.heat && !!branch.deltas);
  const turns = new Map(branch.turns.map((t) => [t.index, t]));
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) if (entry.isIntersecting) { fillChunk(entry.target); observer.unobserve(entry.target); }
  }, { rootMargin: "800px" });
  for (const [t, [start, end]] of turnBlocks(branch)) {
    const turn = turns.get(t);
    const block = el("div", { class: `turn${turn && turn.constrained ? " forced" : ""}`, "data-turn": t });
    const previous = turns.get(t - 1);
    const bits = [`turn ${t}`];
    if (previous && previous.tool_calls) bits.push(`prompt: ${previous.tool_calls} tool result(s)`);
    if (turn) bits.push(`output ${turn.output_len} tokens`, `finish ${turn.finish_reason}${turn.stop_reason ? " / " + turn.stop_reason : ""}`);
    if (turn && turn.tool_calls) bits.push(`${turn.tool_calls} tool call(s)`);
    if (turn && turn.tool_parse_errors) bits.push(`${turn.tool_parse_errors} malformed`);
    const head = el("div", { class: "head", text: bits.join(" · ") });
    if (turn && turn.constrained) head.append(el("span", { class: "badge", text: "forced" }));
    block.append(head);
    if (turn && turn.versions.length) {
      const band = el("div", { class: "band", title: "weight versions of this turn's output" });
      for (const [s, e, v] of turn.versions) {
        band.append(el("span", { class: "version", "data-version": v, title: `weights ${v}: tokens ${s}-${e}`,
          style: `width:${(100 * (e - s)) / Math.max(turn.output_len, 1)}%;background:${versionColour(v)}` }));
      }
      block.append(band);
    }
    // chunks of at most CHUNK tokens, cut outside images
    let at = start;
    while (at < end) {
      let stop = Math.min(at + CHUNK, end);
      for (const [s, im] of images) if (s < stop && s + im.length > stop) stop = Math.min(s + im.length, end);
      const chunk = el("div", { class: "chunk", "data-start": at, "data-end": stop, style: `min-height:${Math.ceil((stop - at) / 14) * 22}px` });
      block.append(chunk);
      observer.observe(chunk);
      at = stop;
    }
    box.append(block);
  }
}

function heatLevel(delta) {
  // |Δ| on a log scale, 1e-6 .. 1 nats, as 0 .. 9 (viewer.css colours each level; no inline style: the CSP)
  if (delta === null || delta === undefined) return null;
  return Math.round(9 * Math.min(1, Math.max(0, (Math.log10(Math.abs(delta) + 1e-12) + 6) / 6)));
}

function tokenHtml(text) {
  // a token's text, its invisible characters marked: a newline as ↵ (then the break), spaces and tabs alone as · and →
  if (text === "") return "∅";
  const blank = /^[ \t]+$/.test(text);
  const shown = blank ? `<i class="ws">${esc(text.replace(/ /g, "·").replace(/\t/g, "→"))}</i>` : esc(text);
  return shown.replace(/\n/g, '<i class="nl">↵</i>\n');
}

function fillChunk(chunk) {
  if (chunk.dataset.filled) return;
  chunk.dataset.filled = "1";
  const { branch, images } = current;
  const start = Number(chunk.dataset.start), end = Number(chunk.dataset.end);
  const { ids, texts, kinds, deltas } = branch;
  const heat = state.heat && !!deltas;
  const parts = [];
  for (let i = start; i < end; i++) {
    const image = images.get(i);
    if (image) {
      parts.push(`<figure class="image" data-start="${i}" data-length="${image.length}"><img alt="image ${image.k}" data-sha="${image.sha256}">` +
        `<figcaption>image ${image.k}: ${image.size ? `${image.size[0]}×${image.size[1]} ` : ""}${esc(image.format)}, tokens ${i}–${i + image.length}</figcaption></figure>`);
      i += image.length - 1;
      continue;
    }
    const level = heat && kinds[i] === "o" ? heatLevel(deltas[i]) : null;
    const attr = level === null ? "" : ` data-heat="${level}"`;
    const sel = i === selected ? " sel" : "";
    parts.push(`<span class="t ${kinds[i]}${sel}" data-i="${i}"${attr}>${texts ? tokenHtml(texts[i]) : `[${ids[i]}]`}</span>`);
  }
  chunk.innerHTML = parts.join("");
  chunk.style.minHeight = "";
  for (const img of chunk.querySelectorAll("img[data-sha]")) {
    const image = branch.images.find((im) => im.sha256 === img.dataset.sha);
    if (image && image.url) blobUrl(image.url).then((url) => (img.src = url)).catch(() => (img.alt += " (not found)"));
  }
}

// --- token details: hover, tap, keyboard ------------------------------------------------------------------

function tipLines(i) {
  const b = current.branch;
  const lines = [`token ${i} · id ${b.ids[i]}`, `text ${JSON.stringify(b.texts ? b.texts[i] : null)}`,
    `${KINDS[b.kinds[i]]} · turn ${b.turn_of[i]}`];
  if (b.logprobs[i] !== null) lines.push(`logprob ${b.logprobs[i].toFixed(5)}`);
  if (b.versions && b.versions[i] !== null) lines.push(`weights ${b.versions[i]}`);
  if (b.deltas && b.deltas[i] !== null) lines.push(`audit Δlogprob ${b.deltas[i].toExponential(2)}`);
  if (pinned && i === selected) lines.push("pinned: Esc closes");
  return lines;
}

function placeTip(lines, anchor) {
  // beside the anchor (a rectangle), flipped above it or to its left where it would leave the window
  const tip = document.getElementById("tip");
  tip.textContent = lines.join("\n");
  tip.hidden = false;
  const width = document.documentElement.clientWidth, height = window.innerHeight, margin = 4;
  const w = tip.offsetWidth, h = tip.offsetHeight;
  let x = anchor.right + 8;
  if (x + w > width - margin) x = anchor.left - 8 - w;
  let y = anchor.bottom + 6;
  if (y + h > height - margin) y = anchor.top - 6 - h;
  tip.style.left = `${Math.max(margin, Math.min(x, width - margin - w))}px`;
  tip.style.top = `${Math.max(margin, Math.min(y, height - margin - h))}px`;
}

function hideTip(unpin = false) {
  if (unpin) pinned = false;
  if (!pinned) document.getElementById("tip").hidden = true;
}

function showTip(event) {
  const target = event.target;
  if (!current || !target.closest) return;
  const token = target.closest(".tokens .t");
  if (!token) { if (selected === null) hideTip(); return; }
  if (pinned) return; // the pinned details stay until Esc or a click elsewhere
  const point = { left: event.clientX - 12, right: event.clientX + 12, top: event.clientY - 14, bottom: event.clientY + 14 };
  placeTip(tipLines(Number(token.dataset.i)), point);
}

function tokenElement(i) {
  // the element of token i, its chunk drawn first if it was not yet (scrolled out of view)
  const box = document.getElementById("tokens");
  let token = box.querySelector(`.t[data-i="${i}"]`);
  if (!token) {
    for (const chunk of box.querySelectorAll(".chunk")) {
      if (Number(chunk.dataset.start) <= i && i < Number(chunk.dataset.end)) { fillChunk(chunk); break; }
    }
    token = box.querySelector(`.t[data-i="${i}"]`);
  }
  return token;
}

function select(i) {
  const old = selected === null ? null : document.querySelector(`.tokens .t[data-i="${selected}"]`);
  if (old) old.classList.remove("sel");
  selected = i;
  const token = tokenElement(i);
  token.classList.add("sel");
  token.scrollIntoView({ block: "nearest", inline: "nearest" });
  placeTip(tipLines(i), token.getBoundingClientRect());
}

function moveBy(step, from = selected) {
  // the next drawn token in that direction (a picture's placeholders are skipped)
  const { branch, images } = current;
  let i = from + step;
  while (i >= 0 && i < branch.ids.length) {
    const image = images.get(i) || [...images.values()].find((im) => im.start < i && i < im.start + im.length);
    if (image) { i = step > 0 ? image.start + image.length : image.start - 1; continue; }
    if (tokenElement(i)) { select(i); return; }
    i += step;
  }
}

function onTokenKey(event) {
  if (!current) return;
  const keys = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
  if (event.key in keys) {
    event.preventDefault();
    moveBy(keys[event.key], selected === null ? -1 : selected);
  } else if (event.key === "Home" || event.key === "End") {
    event.preventDefault();
    moveBy(event.key === "Home" ? 1 : -1, event.key === "Home" ? -1 : current.branch.ids.length);
  } else if ((event.key === "Enter" || event.key === " ") && selected !== null) {
    event.preventDefault();
    pinned = !pinned;
    select(selected);
  } else if (event.key === "Escape") {
    hideTip(true);
  }
}

function onClick(event) {
  // a click or a tap on a token pins its details (a phone has no hover); anywhere else closes them
  const token = current && event.target.closest ? event.target.closest(".tokens .t") : null;
  if (token) { pinned = true; select(Number(token.dataset.i)); return; }
  if (!event.target.closest || !event.target.closest("#tip")) hideTip(true);
}

// --- routing ------------------------------------------------------------------------------------------

async function route() {
  credential();
  clearTimeout(state.poll);
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  try {
    current = null;
    selected = null;
    hideTip(true);
    if (parts[0] === "record" && parts[1] !== undefined) await recordPage(decodeURIComponent(parts[1]), parts[2]);
    else await runsPage();
  } catch (error) {
    main().replaceChildren(el("p", { class: "error", text: String(error) }));
  } finally {
    document.body.dataset.ready = location.hash || "#/";
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("scroll", () => { // the details of a chosen token follow it
  const token = selected === null ? null : document.querySelector(`.tokens .t[data-i="${selected}"]`);
  if (token) placeTip(tipLines(selected), token.getBoundingClientRect());
}, { passive: true });
document.addEventListener("mouseover", showTip);
document.addEventListener("click", onClick);
document.addEventListener("DOMContentLoaded", route);
