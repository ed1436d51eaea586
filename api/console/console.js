// tffleet's operator console: polls GET /v1/console/overview with an admin key and draws it.
// The page is at /console: every URL here is relative to it, so a proxy's path prefix is kept.
// Plain DOM, no framework, no build step: the file is served as it is, offline.
// Everything the fleet says is written with textContent, never as HTML.
"use strict";

const KEY = "tffleet.adminKey"; // sessionStorage: gone when the tab closes
const POLL_MS = 2000;
let timer = null;

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name === "onclick") node.addEventListener("click", value);
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  }
  return node;
}

async function read(path) {
  const key = sessionStorage.getItem(KEY);
  const response = await fetch(path, {
    headers: key ? { Authorization: `Bearer ${key}` } : {},
    cache: "no-store",
  });
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    const message = (body && body.error && body.error.message) || response.statusText;
    const error = new Error(`${response.status}: ${message}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

// ─── Login ────────────────────────────────────────────────────────────────────────────────────────

function showLogin(message) {
  clearTimeout(timer);
  $("console").hidden = true;
  $("forget").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("status").textContent = "not connected";
  $("status").className = "";
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("key").value = "";
  start();
});

$("forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  showLogin("");
});

function start() {
  // Without a key the first read tells: 401 asks for one; a fleet run with TFFLEET_AUTH=false
  // (loopback only) answers, and needs none.
  const key = sessionStorage.getItem(KEY);
  $("login").hidden = true;
  $("forget").hidden = !key;
  poll(!key);
}

async function poll(first = false) {
  clearTimeout(timer);
  try {
    const overview = await read("v1/console/overview");
    $("console").hidden = false;
    draw(overview);
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    $("status").className = "";
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      const had = sessionStorage.getItem(KEY);
      sessionStorage.removeItem(KEY);
      return showLogin(first && !had ? "" : `The key was refused (${error.message}).`);
    }
    $("status").textContent = `cannot read the fleet: ${error.message}; retrying`;
    $("status").className = "error";
  }
  timer = setTimeout(poll, document.hidden ? POLL_MS * 5 : POLL_MS);
}

// ─── Drawing ──────────────────────────────────────────────────────────────────────────────────────

function draw(o) {
  drawThroughput(o.minutes);
  drawLatency(o.minutes);
  fill("models", o.models, (m) => [
    el("td", { class: "mono" }, `${m.name}:${m.version}`),
    el("td", {}, m.format),
    el("td", {}, ...badges(m)),
    el("td", { class: "num" }, m.queued),
    el("td", { class: "num" }, m.running),
    el("td", { class: "num" }, age(m.oldest_queued_s)),
    el("td", {}, ...holders(m.holders)),
  ], "No model is registered yet: start a worker on a model repository.");
  // A model whose jobs wait beside ready children that claim none (TFFLEET_STALL_WARN_S).
  const stalled = $("stalled");
  stalled.replaceChildren();
  for (const s of o.stalled || []) {
    stalled.append(el("p", { class: "error stalled" },
      `${s.model}: ${s.queued} jobs queued, ${s.ready_children} children ready, no claim for `
      + `${Math.round(s.stalled_s)} s: consumers connected but not consuming; restart the `
      + "workers (see Operate and recover, \"A stalled model\")"));
  }
  const errors = $("load-errors");
  errors.replaceChildren();
  for (const e of o.load_errors) {
    errors.append(el("p", { class: "error" },
      `${e.host} ${e.device}: ${e.model}${e.version ? ":" + e.version : ""} failed to load: ${e.error}`));
  }
  fill("devices", o.devices, (d) => [
    el("td", {}, d.host),
    el("td", { class: "mono" }, d.device),
    el("td", { class: "num" }, d.pid),
    el("td", {}, busy(d.busy)),
    el("td", { class: "mono" }, d.models.join(", ")),
  ], "No live worker.");
  fill("tenants", o.tenants, (t) => [
    el("td", {}, t.name),
    el("td", { class: "num" }, t.weight),
    el("td", { class: "num" }, t.queued),
    el("td", { class: "num" }, t.running),
    el("td", { class: "num" }, t.max_queued_jobs ? t.max_queued_jobs : "none"),
    el("td", { class: "num" }, (t.device_s_1h || 0).toFixed(1)),
  ], "No tenant.");
  fill("storage", storageRows(o.storage), (r) => [
    el("td", {}, r[0]),
    el("td", { class: "num" }, r[1]),
    el("td", {}, r[2]),
  ], "Not read yet.");
  fill("failures", o.failures, (f) => [
    el("td", {}, time(f.finished_at)),
    el("td", { class: "mono" }, el("a", { onclick: () => lookup(f.id) }, f.id)),
    el("td", {}, f.tenant),
    el("td", { class: "mono" }, `${f.model}:${f.version}`),
    el("td", { class: "mono" }, f.code),
    el("td", {}, f.message),
  ], "No failure in the last 24 hours.");
  fill("transforms", o.transforms || [], (t) => [
    el("td", {}, time(t.created_at)),
    el("td", { class: "mono" }, t.id),
    el("td", {}, t.tenant),
    el("td", { class: "mono" }, `${t.model}:${t.version}`),
    el("td", {}, t.status),
    el("td", { class: "num" }, `${(100 * t.progress).toFixed(1)}%`),
    el("td", { class: "num" },
      `${t.counts.succeeded} / ${t.counts.failed} / ${t.counts.records}`),
    el("td", { class: "num" }, `${t.shards.done} / ${t.shards.failed} / ${t.shards.total}`),
    el("td", { class: "num" }, t.eta_s === null ? "" : age(t.eta_s)),
  ], "No transform yet.");
}

function fill(id, rows, cells, empty) {
  const body = $(id).tBodies[0];
  const columns = $(id).tHead.rows[0].cells.length;
  body.replaceChildren(...(rows.length
    ? rows.map((row) => el("tr", {}, ...cells(row)))
    : [el("tr", {}, el("td", { class: "empty", colspan: columns }, empty))]));
}

function badges(m) {
  const out = [];
  if (m.latest) out.push(el("span", { class: "badge" }, "latest"));
  if (m.served) out.push(el("span", { class: "badge served" }, "served"));
  else if (!m.retired) out.push(el("span", { class: "badge" }, "not served"));
  if (m.retired) out.push(el("span", { class: "badge retired" }, "retired"));
  return out;
}

function holders(list) {
  if (!list.length) return [el("span", { class: "empty" }, "no live worker")];
  return list.map((h) => el("div", {},
    `${h.host} ${h.device} ${h.state}`, " ", h.busy == null ? "" : busy(h.busy)));
}

// What the fleet keeps and for how long (TFFLEET_INPUT_TTL_S, _RESULT_TTL_S, _CACHE_*,
// _UPLOAD_TTL_S).
function storageRows(s) {
  if (!s || s.database_bytes == null) return [];
  const inputs = `${s.inputs_kept} jobs`
    + (s.inputs_bytes == null ? "" : `, ${bytes(s.inputs_bytes)}`);
  return [
    ["Database", bytes(s.database_bytes), ""],
    ["Object store", objectStore(s),
      `uploads ${period(s.upload_ttl_s)}; a job's objects go with its inputs and outputs`],
    ["Inputs", inputs, `until a job ends, then ${period(s.input_ttl_s)}`],
    ["Jobs and outputs", "", `${period(s.result_ttl_s)} after a job ends, or its own ttl_s`],
    ["Response cache", "", `${period(s.cache_ttl_s)}, at most ${bytes(s.cache_max_bytes)}`],
  ];
}

// What the database accounts for in the object store (no listing of it): uploads and jobs.
function objectStore(s) {
  if (s.object_store_bytes == null) return "";
  return `${bytes(s.object_store_bytes)} (${s.object_store_objects} uploads and jobs)`;
}

function period(seconds) {
  if (seconds >= 86400) return `${+(seconds / 86400).toFixed(1)} d`;
  if (seconds >= 3600) return `${+(seconds / 3600).toFixed(1)} h`;
  return age(seconds);
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function busy(share) {
  if (share == null) return el("span", { class: "empty" }, "measuring");
  const percent = Math.round(share * 100);
  return el("span", {}, el("span", { class: "bar" }, el("span", { style: `width:${percent}%` })),
    `${percent}%`);
}

function age(seconds) {
  if (seconds == null) return "";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function time(iso) {
  return iso ? new Date(iso).toLocaleTimeString() : "";
}

// ─── Charts (SVG) ─────────────────────────────────────────────────────────────────────────────────

const SVG = "http://www.w3.org/2000/svg";
const W = 480, H = 120, PAD = 14;

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

function axis(chart, top, minutes) {
  chart.append(svg("line", { x1: 0, y1: H - PAD, x2: W, y2: H - PAD, stroke: "#e5e7eb" }));
  const label = svg("text", { x: 2, y: 10, "font-size": 10, fill: "#6b7280" });
  label.textContent = String(Math.round(top));
  chart.append(label);
  const first = svg("text", { x: 2, y: H - 2, "font-size": 10, fill: "#6b7280" });
  first.textContent = time(minutes[0].start);
  const last = svg("text", { x: W - 2, y: H - 2, "font-size": 10, fill: "#6b7280",
    "text-anchor": "end" });
  last.textContent = "now";
  chart.append(first, last);
}

function drawThroughput(minutes) {
  const chart = $("throughput");
  chart.replaceChildren();
  const top = Math.max(1, ...minutes.map((m) => m.ended));
  const step = W / minutes.length;
  const scale = (H - 2 * PAD) / top;
  minutes.forEach((m, i) => {
    const x = i * step + 1;
    const group = svg("g", {});
    const title = svg("title", {});
    title.textContent = `${time(m.start)}: ${m.ended} ended, ${m.failed} failed, ` +
      `${m.canceled} canceled`;
    group.append(title);
    // Stacked from the bottom: failed, canceled, then the ones that succeeded.
    let y = H - PAD;
    for (const [count, color] of [[m.failed, "#c53030"], [m.canceled, "#a0aec0"],
      [m.ended - m.failed - m.canceled, "#2f855a"]]) {
      const height = count * scale;
      y -= height;
      if (height > 0) group.append(svg("rect", { x, y, width: step - 2, height, fill: color }));
    }
    chart.append(group);
  });
  axis(chart, top, minutes);
}

function drawLatency(minutes) {
  const chart = $("latency");
  chart.replaceChildren();
  const top = Math.max(1, ...minutes.map((m) => m.p95_ms || 0));
  const step = W / minutes.length;
  for (const [key, color] of [["p95_ms", "#b7791f"], ["p50_ms", "#2b6cb0"]]) {
    const points = minutes
      .map((m, i) => (m[key] == null ? null
        : `${(i + 0.5) * step},${H - PAD - (m[key] / top) * (H - 2 * PAD)}`))
      .filter(Boolean);
    if (points.length) {
      chart.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: color,
        "stroke-width": 2 }));
    }
    for (const point of points) { // a lone minute is a dot, not a line
      const [cx, cy] = point.split(",");
      chart.append(svg("circle", { cx, cy, r: 2.5, fill: color }));
    }
  }
  axis(chart, top, minutes);
}

// ─── One job ──────────────────────────────────────────────────────────────────────────────────────

$("lookup").addEventListener("submit", (event) => {
  event.preventDefault();
  lookup($("job-id").value.trim());
});

async function lookup(id) {
  $("job-id").value = id;
  const out = $("job");
  out.replaceChildren(el("p", { class: "empty" }, "reading…"));
  try {
    const job = await read(`v1/console/jobs/${encodeURIComponent(id)}`);
    const facts = [
      ["Status", job.status], ["Tenant", job.tenant], ["Model", `${job.model}:${job.version}`],
      ["Samples", job.samples], ["Priority", job.priority], ["Attempts", job.attempts],
      ["Worker", job.worker || ""],
      ["Error", job.error ? `${job.error.code}: ${job.error.message}` : ""],
    ];
    if (job.queue_position != null) {
      facts.push(["Queue position", `${job.queue_position} jobs ahead` +
        (job.eta_s != null ? `, about ${age(job.eta_s)}` : "")]);
    }
    const timeline = el("ol", {}, ...job.timeline.map((e) => el("li", {},
      `${new Date(e.at).toLocaleString()} ${e.event}${e.detail ? " (" + e.detail + ")" : ""}`)));
    const shapes = job.output_shapes
      ? el("ul", {}, ...Object.entries(job.output_shapes).map(([name, s]) =>
        el("li", { class: "mono" }, `${name}: ${s.dtype} [${s.shape.join(", ")}]`)))
      : el("p", { class: "empty" }, "no outputs (yet)");
    out.replaceChildren(
      el("h3", { class: "mono" }, job.id),
      el("dl", {}, ...facts.filter(([, v]) => v !== "" && v != null)
        .flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
      el("h4", {}, "Timeline"), timeline,
      el("h4", {}, "Outputs"), shapes);
  } catch (error) {
    out.replaceChildren(el("p", { class: "error" }, `Cannot show job ${id}: ${error.message}`));
  }
}

start();
