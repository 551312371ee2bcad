// tito view: the runs page and the record page, drawn from the viewer's JSON API (no library, no CDN).
"use strict";

const PAGE_ROWS = 200; // rows of the runs table drawn at a time
const CHUNK = 1500; // tokens drawn at a time on the record page, when scrolled into view
const KINDS = { p: "prompt", o: "output (loss mask 1)", b: "template boundary" };
const PALETTE = ["#2f6fdd", "#e07b24", "#2ca05a", "#c53a8a", "#7a5af5", "#1a9aa8", "#b8860b", "#6b7280"];
const state = { runs: null, shown: PAGE_ROWS, sort: { key: "index", asc: true }, filter: "", status: "", heat: false };
const main = () => document.getElementById("main");
let current = null; // the branch drawn on the record page (for the hover details)

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
const colour = (i) => PALETTE[i % PALETTE.length];

// --- the runs page ------------------------------------------------------------------------------------

async function runsPage() {
  const data = (state.runs = await api("api/runs"));
  document.getElementById("source").textContent = data.title + (data.live ? " (live)" : "");
  const root = main();
  const n = data.rows.length;
  root.replaceChildren(el("h2", { text: `${n} rollout${n === 1 ? "" : "s"}` }));
  root.append(el("div", { class: "chips", id: "statuses" },
    ...Object.entries(data.statuses).map(([s, n]) => el("span", { class: s, text: `${s}: ${n}` }))));
  root.append(el("div", { class: "charts" }, rewardChart(data.groups), turnChart(data.rows)));
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
  const filter = el("input", { type: "search", placeholder: "filter: task, status, reason", value: state.filter });
  filter.addEventListener("input", () => { state.filter = filter.value.toLowerCase(); state.shown = PAGE_ROWS; drawTable(); });
  const status = el("select", {}, el("option", { value: "", text: "any status" }),
    ...Object.keys(data.statuses).map((s) => el("option", { value: s, text: s })));
  status.value = state.status;
  status.addEventListener("change", () => { state.status = status.value; state.shown = PAGE_ROWS; drawTable(); });
  root.append(el("div", { class: "controls" }, filter, status, el("span", { class: "muted", id: "count" })));
  root.append(el("table", { class: "runs", id: "runs" }), el("div", { id: "more" }));
  drawTable();
}

const COLUMNS = [
  ["task_id", "task"], ["sample", "sample"], ["status", "status"], ["status_reason", "reason"], ["reward", "reward"],
  ["advantage", "advantage"], ["tokens", "tokens"], ["turns", "turns"], ["branches", "branches"],
  ["images", "images"], ["weight_versions", "weights"],
];

function visibleRows() {
  const { filter, status, sort } = state;
  const rows = state.runs.rows.filter((r) => (!status || r.status === status) && (!filter ||
    `${r.task_id} ${r.status} ${r.status_reason || ""}`.toLowerCase().includes(filter)));
  const key = sort.key;
  rows.sort((a, b) => {
    const x = a[key], y = b[key];
    if (x === y) return a.index - b.index;
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
  const head = el("tr", {}, ...COLUMNS.map(([key, label]) => {
    const th = el("th", { "data-key": key, class: state.sort.key === key ? `sorted${state.sort.asc ? " asc" : ""}` : null, text: label });
    th.addEventListener("click", () => {
      state.sort = { key, asc: state.sort.key === key ? !state.sort.asc : true };
      drawTable();
    });
    return th;
  }));
  const body = rows.slice(0, state.shown).map((r) => {
    const link = el("a", { href: `#/record/${r.index}`, text: r.task_id });
    return el("tr", { class: "run", "data-status": r.status }, el("td", {}, link), el("td", { text: r.sample }),
      el("td", { text: r.status }), el("td", { class: "reason", text: r.status_reason || "" }),
      el("td", { text: num(r.reward) }), el("td", { text: num(r.advantage) }), el("td", { text: r.tokens }),
      el("td", { text: r.turns }), el("td", { text: r.branches }), el("td", { text: r.images }),
      el("td", { text: r.weight_versions ?? "–" }));
  });
  table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
  document.getElementById("count").textContent = `${rows.length} shown of ${state.runs.rows.length}`;
  const more = document.getElementById("more");
  more.replaceChildren();
  if (rows.length > state.shown) {
    const button = el("button", { text: `show ${Math.min(PAGE_ROWS, rows.length - state.shown)} more` });
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
  const [box, plot] = chartBox("output tokens per turn (mean over rollouts)", "turn-chart", 360, 170);
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
    el("td", { text: s && s.mean_abs != null ? s.mean_abs.toExponential(2) : "–" }),
    el("td", { text: s && s.max_abs != null ? s.max_abs.toExponential(2) : "–" }),
    el("td", { text: s && s.k3 != null ? s.k3.toExponential(2) : "–" }));
  return el("div", { class: "chart audit" }, el("h3", { text: `audit: ${audit.scorer}` }),
    el("table", { class: "runs" }, el("tr", {}, ...["tokens", "n", "mean |Δ|", "max |Δ|", "k3"].map((t) => el("th", { text: t }))),
      row("free turns", audit.free), row("constrained turns", audit.constrained), row("all", audit.all)));
}

// --- the record page ----------------------------------------------------------------------------------

async function recordPage(key, branchNo) {
  const rec = await api(`api/records/${encodeURIComponent(key)}`);
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
  const legend = el("div", { class: "legend" }, el("span", { class: "p", text: "prompt" }),
    el("span", { class: "o", text: "output (trained)" }), el("span", { class: "b", text: "boundary" }),
    el("span", { class: "forced", text: "forced turn output" }));
  if (!rec.decoded) legend.append(el("span", { class: "muted", text: "token ids (start with --tokenizer or --config for text)" }));
  if (branch.deltas) {
    const heat = el("label", {}, el("input", { type: "checkbox", id: "heat" }), " audit |Δlogprob| heat map");
    heat.firstChild.checked = state.heat;
    heat.firstChild.addEventListener("change", (e) => { state.heat = e.target.checked; drawTokens(branch); });
    legend.append(heat);
  }
  root.append(legend, el("div", { class: "tokens", id: "tokens" }));
  drawTokens(branch);
}

function branchTree(key, branches, current) {
  const children = new Map();
  for (const b of branches) {
    const parent = b.parent ?? null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(b);
  }
  const known = new Set(branches.map((b) => b.branch));
  const node = (b) => el("li", { class: "branch", "data-branch": b.branch },
    el("a", { href: `#/record/${key}/${b.branch}`, class: b.branch === current ? "current" : null, text: `branch ${b.branch}` }),
    el("span", { class: "muted", text: ` · ${b.status}` + (known.has(b.parent) ? ` · forked at token ${b.fork_at}: ${b.fork_reason || "?"}`
      : b.fork_reason ? ` · ${b.fork_reason}` : "") }),
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
  current = branch;
  const box = document.getElementById("tokens");
  box.replaceChildren();
  box.classList.toggle("heat", state.heat && !!branch.deltas);
  const turns = new Map(branch.turns.map((t) => [t.index, t]));
  const images = new Map(branch.images.map((im, k) => [im.start, { ...im, k }]));
  const versions = [...new Set((branch.versions || []).filter((v) => v !== null))];
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) if (entry.isIntersecting) { fillChunk(entry.target, branch, images); observer.unobserve(entry.target); }
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
          style: `width:${(100 * (e - s)) / Math.max(turn.output_len, 1)}%;background:${colour(versions.indexOf(v))}` }));
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

function fillChunk(chunk, branch, images) {
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
    const text = texts ? texts[i] : `[${ids[i]}]`;
    const level = heat && kinds[i] === "o" ? heatLevel(deltas[i]) : null;
    const attr = level === null ? "" : ` data-heat="${level}"`;
    parts.push(`<span class="t ${kinds[i]}" data-i="${i}"${attr}>${esc(text === "" ? "∅" : text)}</span>`);
  }
  chunk.innerHTML = parts.join("");
  chunk.style.minHeight = "";
  for (const img of chunk.querySelectorAll("img[data-sha]")) {
    const image = branch.images.find((im) => im.sha256 === img.dataset.sha);
    if (image && image.url) blobUrl(image.url).then((url) => (img.src = url)).catch(() => (img.alt += " (not found)"));
  }
}

// --- hover details ------------------------------------------------------------------------------------

function showTip(event) {
  const tip = document.getElementById("tip");
  const target = event.target;
  if (!current || !target.classList || !target.classList.contains("t")) { tip.hidden = true; return; }
  const i = Number(target.dataset.i);
  const b = current;
  const lines = [`token ${i} · id ${b.ids[i]}`, `text ${JSON.stringify(b.texts ? b.texts[i] : null)}`,
    `${KINDS[b.kinds[i]]} · turn ${b.turn_of[i]}`];
  if (b.logprobs[i] !== null) lines.push(`logprob ${b.logprobs[i].toFixed(5)}`);
  if (b.versions && b.versions[i] !== null) lines.push(`weights ${b.versions[i]}`);
  if (b.deltas && b.deltas[i] !== null) lines.push(`audit Δlogprob ${b.deltas[i].toExponential(2)}`);
  tip.textContent = lines.join("\n");
  tip.hidden = false;
  tip.style.left = `${Math.min(event.clientX + 12, window.innerWidth - 440)}px`;
  tip.style.top = `${event.clientY + 14}px`;
}

// --- routing ------------------------------------------------------------------------------------------

async function route() {
  credential();
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  try {
    current = null;
    if (parts[0] === "record" && parts[1] !== undefined) await recordPage(decodeURIComponent(parts[1]), parts[2]);
    else await runsPage();
  } catch (error) {
    main().replaceChildren(el("p", { class: "error", text: String(error) }));
  } finally {
    document.body.dataset.ready = location.hash || "#/";
  }
}

window.addEventListener("hashchange", route);
document.addEventListener("mouseover", showTip);
document.addEventListener("DOMContentLoaded", route);
