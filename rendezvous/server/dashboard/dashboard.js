// Ringmaster's dashboard: reads GET /status once a second and draws it; POST /scale with the job
// secret, and drains hosts (POST /hosts/NAME/drain, /undrain). Everything from the job (host names, worker ids, messages) is set as text, never as
// markup. No framework, no build step, nothing fetched from elsewhere.
"use strict";

const POLL_MS = 1000;
const HISTORY = 300; // points kept for the charts (five minutes at one a second)
// A host's loss (or silence) explains its workers' failures, which are often seen a moment before
// it when a whole host dies: a generation with both is shown as the host's.
const CAUSE_ORDER = ["host_lost", "partition", "failure", "host_removed", "host_added", "scale"];
const history = { rate: [], loss: [] };
let lastStatus = null;

function $(id) { return document.getElementById(id); }

function text(element, value) { element.textContent = value; }

function cell(row, value, className) {
  const td = document.createElement("td");
  td.textContent = value;
  if (className) td.className = className;
  row.appendChild(td);
}

function fill(tableId, rows) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  for (const values of rows) {
    const tr = document.createElement("tr");
    for (const [value, className] of values) cell(tr, value, className);
    body.appendChild(tr);
  }
}

function headers() {
  const token = sessionStorage.getItem("ringmaster-token");
  return token ? { Authorization: "Bearer " + token } : {};
}

function duration(seconds) {
  if (seconds < 60) return seconds.toFixed(0) + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.floor(seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
}

function mainCause(generation) {
  for (const cause of CAUSE_ORDER) if (generation.causes.includes(cause)) return cause;
  return "start";
}

function drawStrip(status) {
  const strip = $("strip");
  strip.replaceChildren();
  const gens = status.generations;
  const now = Date.now() / 1000;
  const spans = gens.map((g, i) => Math.max(0.5, (i + 1 < gens.length ? gens[i + 1].started : now) - g.started));
  const total = spans.reduce((a, b) => a + b, 0) || 1;
  gens.forEach((g, i) => {
    const box = document.createElement("div");
    const cause = mainCause(g);
    box.className = "gen" + (g.number === status.generation ? " current" : "");
    box.style.flexGrow = String(spans[i] / total);
    box.style.background = "var(--" + cause + ")";
    box.dataset.number = String(g.number);
    box.dataset.cause = cause;
    box.textContent = g.number + " · " + g.size;
    box.title = "generation " + g.number + ": " + g.size + " workers; " + (g.cause || "the first") +
      (g.recovery_s != null ? "; training resumed after " + g.recovery_s.toFixed(2) + " s" : "");
    strip.appendChild(box);
  });
  const legend = $("legend");
  legend.replaceChildren();
  for (const cause of ["start", ...CAUSE_ORDER]) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = "var(--" + cause + ")";
    item.appendChild(swatch);
    item.appendChild(document.createTextNode(cause.replace("_", " ")));
    legend.appendChild(item);
  }
}

function drawChart(canvasId, points) {
  const canvas = $(canvasId);
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  if (points.length < 2) return;
  const lo = Math.min(...points), hi = Math.max(...points);
  const span = hi - lo || Math.abs(hi) || 1;
  ctx.strokeStyle = "#2e90fa";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  points.forEach((v, i) => {
    const x = (i / (points.length - 1)) * w;
    const y = h - 6 - ((v - lo) / span) * (h - 12);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#667085";
  ctx.font = "11px sans-serif";
  ctx.fillText(hi.toPrecision(3), 4, 11);
  ctx.fillText(lo.toPrecision(3), 4, h - 2);
}

function remember(series, value) {
  if (value == null) return;
  series.push(value);
  if (series.length > HISTORY) series.shift();
}

function render(status) {
  lastStatus = status;
  document.body.dataset.state = status.state;
  document.body.dataset.generation = String(status.generation);
  text($("state"), status.state);
  text($("message"), status.message);
  text($("generation"), String(status.generation));
  text($("world-size"), String(status.world_size));
  text($("steps"), String(status.steps));
  text($("rate"), status.steps_per_second != null ? status.steps_per_second.toFixed(2) : "–");
  text($("loss"), status.loss != null ? status.loss.toPrecision(4) : "–");
  text($("resets"), String(status.resets));
  // A global batch the script declared: its samples (micro-batches x their size), the same at any
  // world size, and each rank's share of a step below.
  const batch = status.global_batch;
  text($("global-batch"), batch ? batch.size + " (" + batch.micro_batches + " × " + batch.micro_batch + ")" : "–");
  const current = status.generations.find((g) => g.number === status.generation);
  text($("since-reset"), current ? duration(Date.now() / 1000 - current.started) : "–");
  text($("bounds"), status.min_np + " and " + (status.max_np != null ? status.max_np : "every discovered slot's"));
  fill("hosts", status.hosts.filter((h) => h.discovered).map((h) => [
    [h.name], [String(h.slots)], [h.state, "state-" + h.state], [h.agent_connected ? "pid " + h.agent_pid : "not connected"],
  ]));
  const ranked = status.workers.filter((w) => w.rank != null).sort((a, b) => a.rank - b.rank);
  const share = (w) => (batch && w.worker_id in batch.accumulation ? String(batch.accumulation[w.worker_id]) : "–");
  fill("ranks", ranked.map((w) => [[String(w.rank)], [w.worker_id], [w.host], [w.phase], [String(w.commits)], [share(w)]]));
  drawStrip(status);
  remember(history.rate, status.steps_per_second);
  remember(history.loss, status.loss);
  drawChart("rate-chart", history.rate);
  drawChart("loss-chart", history.loss);
  const events = $("events");
  events.replaceChildren();
  for (const line of status.events.slice(-30).reverse()) {
    const li = document.createElement("li");
    li.textContent = line;
    events.appendChild(li);
  }
  text($("updated"), "updated " + new Date().toLocaleTimeString());
  if (window.ringmasterFirstRender === undefined) window.ringmasterFirstRender = performance.now();
  window.ringmasterRenders = (window.ringmasterRenders || 0) + 1;
}

async function poll() {
  try {
    const reply = await fetch("status", { headers: headers(), cache: "no-store" });
    if (reply.status === 401) {
      text($("problem"), "this page is not on the job's machine: enter the job secret below to see the job");
    } else if (!reply.ok) {
      text($("problem"), "GET /status answered " + reply.status);
    } else {
      text($("problem"), "");
      render(await reply.json());
    }
  } catch (err) {
    text($("problem"), "the rendezvous does not answer (the job may have ended)");
  }
  if (!lastStatus || (lastStatus.state !== "succeeded" && lastStatus.state !== "failed")) setTimeout(poll, POLL_MS);
}

// POST a change (the secret from the form) and say the answer in `replyId`.
async function change(path, body, replyId) {
  const token = $("token").value.trim();
  if (token) sessionStorage.setItem("ringmaster-token", token);
  try {
    const reply = await fetch(path, {
      method: "POST", headers: { "Content-Type": "application/json", ...headers() }, body: JSON.stringify(body),
    });
    const answer = await reply.json().catch(() => ({}));
    const detail = typeof answer.detail === "string" ? answer.detail : JSON.stringify(answer.detail || "");
    text($(replyId), reply.ok ? answer.message : "refused (" + reply.status + "): " + detail);
  } catch (err) {
    text($(replyId), "the rendezvous does not answer");
  }
}

function scale(event) {
  event.preventDefault();
  change("scale", { np: Number($("scale-np").value) }, "scale-reply");
}

function drainPath(verb) {
  return "hosts/" + encodeURIComponent($("drain-host").value.trim()) + "/" + verb;
}

document.addEventListener("DOMContentLoaded", () => {
  $("scale-form").addEventListener("submit", scale);
  $("drain-form").addEventListener("submit", (event) => {
    event.preventDefault();
    change(drainPath("drain"), {}, "drain-reply");
  });
  $("undrain").addEventListener("click", () => change(drainPath("undrain"), {}, "drain-reply"));
  poll();
});
