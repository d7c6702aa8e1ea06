// The deepboot dashboard's only script: polls /dashboard/api/status and redraws the
// page from it; reloads the timeline image now and then. Text goes in with
// textContent only (job and service names come from users). Every fetch has a bound.
"use strict";

const TIMELINE_MS = 30000;
const FETCH_TIMEOUT_MS = 10000;
let refreshMs = 3000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(key, String(value));
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function banner(text) {
  const b = document.getElementById("banner");
  b.textContent = text;
  b.hidden = !text;
}

function pct(x) {
  return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%";
}

function attained(counts) {
  const total = counts.within + counts.over;
  return total ? `${pct(counts.attainment)} (${counts.within}/${total})` : "-";
}

function seconds(x) {
  if (x === null || x === undefined) return "-";
  return x < 1 ? (1000 * x).toFixed(0) + " ms" : x.toFixed(2) + " s";
}

// What the SLO guard reads of a service's demand (--slo): its forecast, the
// dispersion of its one-second counts and the replicas they ask for.
function demandText(d) {
  if (!d) return "-";
  const bursts = d.peakedness > 1 ? `bursts x${d.dispersion.toFixed(1)}` : "Poisson-like";
  return `${d.forecast_rps.toFixed(2)}/s, ${bursts}, ${d.sized} sized`;
}

function holderText(gpu) {
  if (gpu.state === "lent") return `lent to ${gpu.holder}`;
  if (gpu.holder) return gpu.holder;
  if (gpu.service) return `${gpu.service} · ${gpu.state}`;
  return gpu.state;
}

function renderNodes(gpus) {
  const nodes = new Map();
  for (const g of gpus) {
    if (!nodes.has(g.node)) nodes.set(g.node, { pool: g.pool, gpus: [] });
    nodes.get(g.node).gpus.push(g);
  }
  const rows = [];
  for (const [node, info] of [...nodes.entries()].sort((a, b) => a[0] - b[0])) {
    const boxes = info.gpus
      .sort((a, b) => a.index - b.index)
      .map((g) =>
        el(
          "div",
          {
            class: `gpu s-${g.state}`,
            "data-gpu": g.gpu,
            "data-state": g.state,
            "data-holder": g.holder || g.service || "",
            title: `${g.gpu} (${g.pool} pool): ${holderText(g)}`,
          },
          el("span", { class: "id" }, g.gpu),
          el("span", { class: "holder" }, holderText(g)),
        ),
      );
    rows.push(el("div", { class: "node" }, el("div", { class: "node-label" }, `node ${node} (${info.pool})`), ...boxes));
  }
  document.getElementById("nodes").replaceChildren(...rows);
}

function cell(field, text, cls) {
  return el("td", { "data-field": field, class: cls || null, title: String(text) }, text);
}

function renderJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  const rows = jobs.map((j) => {
    const batch = j.batch_size ? `${j.batch_size} (${j.local_batch_size} × ${j.accumulation_steps})` : "";
    return el(
      "tr",
      { "data-job": j.name },
      cell("name", j.name),
      cell("state", j.state),
      cell("workers", j.num_workers, "num"),
      cell("lent", j.lent_gpus.join(", ")),
      cell("batch", batch),
      cell("step", j.step, "num"),
      cell("loss", j.loss === null ? "" : Number(j.loss).toPrecision(4), "num"),
      cell("resizes", j.restarts, "num"),
    );
  });
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 8, class: "note" }, "no jobs"))]));
}

function renderServices(services) {
  const body = document.querySelector("#services tbody");
  const rows = services.map((s) => {
    const byState = {};
    for (const r of s.replicas) byState[r.state] = (byState[r.state] || 0) + 1;
    const replicas = Object.entries(byState).map(([k, n]) => `${n} ${k}`).join(", ") || "none";
    const live = s.live || {};
    const slo = s.slo;
    const recent = slo.recent;
    const miss = recent.attainment !== null && recent.attainment < slo.slo_target;
    return el(
      "tr",
      { "data-service": s.name },
      cell("name", s.name),
      cell("replicas", replicas),
      cell("queue", `${live.queued ?? "-"} / ${live.in_flight ?? "-"}`, "num"),
      cell("slo", `${slo.slo_wait_s} s (${(100 * slo.slo_target).toFixed(3).replace(/\.?0+$/, "")}%)`),
      cell("attainment", attained(recent), miss ? "num miss" : "num"),
      cell("p99", seconds(slo.p99_wait_s), "num"),
      cell("total", attained(slo.total), "num"),
      cell("demand", demandText(s.demand)),
    );
  });
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 8, class: "note" }, "no services"))]));
}

function renderReclaims(reclaims) {
  const list = document.getElementById("reclaims");
  const items = reclaims.slice(0, 20).map((r) => {
    const kind = r.proactive ? "proactive" : "reactive";
    const ago = r.ago_s < 90 ? `${Math.round(r.ago_s)} s ago` : `${Math.round(r.ago_s / 60)} min ago`;
    return el("li", { "data-kind": kind }, `${ago}: a GPU of ${r.job} `, el("span", { class: kind }, kind));
  });
  list.replaceChildren(...(items.length ? items : [el("li", { class: "note" }, "none")]));
}

function render(doc) {
  const c = doc.cluster;
  const ctl = c.controller_pid ? `controller pid ${c.controller_pid}` : "controller NOT running";
  const beat = c.heartbeat_age_s === null ? "" : `, heartbeat ${c.heartbeat_age_s.toFixed(1)} s ago`;
  document.getElementById("cluster").textContent = `${c.mode || "down"} cluster · ${ctl}${beat}`;
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  renderNodes(doc.gpus);
  renderJobs(doc.jobs);
  renderServices(doc.services);
  renderReclaims(doc.reclaims_last_hour || []);
  if (doc.refresh_s) refreshMs = 1000 * doc.refresh_s;
}

async function fetchBounded(url) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    return await fetch(url, { credentials: "same-origin", cache: "no-store", signal: abort.signal });
  } finally {
    clearTimeout(timer);
  }
}

async function refresh() {
  try {
    const r = await fetchBounded("/dashboard/api/status");
    if (r.status === 401) {
      banner("Logged out (the controller restarted, or the session expired): run 'deepboot dashboard' for a new link.");
      return; // nothing more to poll for
    }
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
    banner("");
  } catch (e) {
    banner(`No answer from the controller (${e.message || e}); retrying every ${refreshMs / 1000} s.`);
  }
  setTimeout(refresh, refreshMs);
}

function reloadTimeline() {
  const img = document.getElementById("timeline");
  const next = new Image();
  next.onload = () => { img.src = next.src; };
  next.src = "/dashboard/api/timeline.png?t=" + Date.now();
  setTimeout(reloadTimeline, TIMELINE_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  refresh();
  setTimeout(reloadTimeline, TIMELINE_MS);
});
