// The pool's page: hosts x jobs, the jobs with why each waits or was resized, and each job's
// size over time. Reads the pool's API (GET /jobs, /hosts) once a second; changes nothing.
"use strict";

const WAITING = { queued: 0, suspended: 1, suspending: 2, running: 3, cancelling: 4 };

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function sparkline(sizes, maxNp, since) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", "160");
  svg.setAttribute("height", "28");
  if (!sizes.length) return svg;
  const now = Date.now() / 1000;
  const start = Math.min(since, sizes[0][0]);
  const span = Math.max(1, now - start);
  const points = [];
  let last = 0;
  for (const [t, size] of sizes) {
    const x = ((t - start) / span) * 158 + 1;
    points.push(`${x.toFixed(1)},${(27 - (last / Math.max(1, maxNp)) * 25).toFixed(1)}`);
    points.push(`${x.toFixed(1)},${(27 - (size / Math.max(1, maxNp)) * 25).toFixed(1)}`);
    last = size;
  }
  points.push(`159,${(27 - (last / Math.max(1, maxNp)) * 25).toFixed(1)}`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.appendChild(line);
  return svg;
}

function draw(jobs, hosts) {
  const live = jobs.filter((j) => j.state in WAITING);
  const running = live.filter((j) => Object.keys(j.hosts).length);
  const usable = hosts.filter((h) => h.joined && h.blacklisted_for_s === 0).reduce((n, h) => n + h.slots, 0);
  const used = hosts.reduce((n, h) => n + h.used, 0);
  const queued = live.filter((j) => j.state === "queued" || j.state === "suspended").length;
  document.getElementById("summary").textContent =
    `${used} of ${usable} slots used (${usable ? Math.round((100 * used) / usable) : 0}%), ` +
    `${running.length} job(s) running, ${queued} waiting`;

  const grid = document.getElementById("grid");
  grid.replaceChildren();
  const head = grid.insertRow();
  cell(head, "host (slots)");
  for (const job of running) cell(head, job.id);
  for (const host of hosts) {
    const row = grid.insertRow();
    if (host.blacklisted_for_s > 0 || !host.joined) row.className = "blacklisted";
    const gpus = host.resources && host.resources.gpu ? `, ${host.resources.gpu} GPU` : "";
    cell(row, `${host.name} (${host.slots}${gpus})${host.joined ? "" : ": its pool agent has not joined"}`);
    for (const job of running) {
      const n = host.jobs[job.id] || 0;
      cell(row, n ? String(n) : "", n ? "slots used" : "slots");
    }
  }

  const order = [...jobs].sort((a, b) =>
    (WAITING[a.state] ?? 9) - (WAITING[b.state] ?? 9) || a.submitted - b.submitted);
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  const since = Math.min(...jobs.map((j) => j.submitted), Date.now() / 1000);
  for (const job of order) {
    const row = body.insertRow();
    row.dataset.job = job.id;
    const id = cell(row, "");
    if (job.api_url) {
      const link = document.createElement("a");
      link.href = `${job.api_url}/`;
      link.textContent = job.id;
      id.appendChild(link);
    } else {
      id.textContent = job.id;
    }
    cell(row, job.queue);
    cell(row, String(job.priority));
    cell(row, job.state, `state-${job.state}`);
    cell(row, `${job.size} (${job.min_np}-${job.max_np})`);
    cell(row, job.steps_per_second == null ? "" : job.steps_per_second.toFixed(2));
    cell(row, job.reason);
    cell(row, "").appendChild(sparkline(job.sizes, job.max_np, since));
  }
}

async function refresh() {
  try {
    const [jobs, hosts] = await Promise.all(["jobs", "hosts"].map(async (path) => {
      const answer = await fetch(path);
      if (!answer.ok) throw new Error(`${path}: HTTP ${answer.status}`);
      return answer.json();
    }));
    draw(jobs, hosts);
    document.getElementById("error").textContent = "";
    window.ringmasterPoolRendered = (window.ringmasterPoolRendered || 0) + 1;
  } catch (error) {
    document.getElementById("error").textContent = `cannot read the pool: ${error.message}`;
  }
}

refresh();
setInterval(refresh, 1000);
