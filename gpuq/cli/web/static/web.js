// gpuq web: the queue page and a job's page, drawn from the JSON the server gives when asked (the
// page itself holds no data). Every text that comes from a job (names, commands, logs) goes in
// through textContent, never as HTML, so a name like <script> shows as those characters.
"use strict";
(function () {
  const POLL_MS = 2000; // the queue and a job's facts
  const LOG_POLL_MS = 1000; // a running job's log
  const LOG_LINES_KEPT = 5000; // lines kept on the page; older ones leave it (the file keeps them)
  const TOKEN_KEY = "gpuq-token";
  const NO_TOKEN = "403 forbidden: open the URL `gpuq web` printed (it carries the token)";
  const ELSEWHERE = "another server answers at this address, not the gpuq web this page came from";
  const $ = (id) => document.getElementById(id);

  // The token comes once in the address's fragment, which the browser sends to no server; it is
  // kept for this origin only (scheme, host and port: no other port's page can read it), across
  // browser restarts, and leaves the address bar. No cookie: those go to every port of the host.
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.has("token")) history.replaceState(null, "", location.pathname + location.search);
  const secure = window.isSecureContext && window.crypto && crypto.subtle;
  if (secure && fragment.get("token")) localStorage.setItem(TOKEN_KEY, fragment.get("token"));
  const token = secure ? localStorage.getItem(TOKEN_KEY) : null;
  let key = null; // the token as an HMAC key, made once
  let server = null; // the id of the server start this page signs for (app.py's `TokenGate.hello`)
  let port = null; // the port the first one listened on, as it said (not the browser's: ssh -L)
  window.addEventListener("hashchange", () => location.reload()); // the URL pasted into an open page: start over

  // el("div", {class: "x"}, "text", child...): strings become text nodes
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined || child === "") continue;
      node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
    }
    return node;
  }

  const word = (text) => String(text || "").replace(/[^a-z_-]/g, ""); // a state as a class name
  const jobHref = (id) => "/job/" + Number(id);

  function fill(node, children) {
    node.replaceChildren(...children);
  }

  function say(text, bad) {
    const box = $("message");
    box.textContent = text;
    box.className = bad ? "message bad" : "message";
    box.hidden = !text;
  }

  function live(ok, detail) {
    const node = $("live");
    node.textContent = ok ? "live " + new Date().toLocaleTimeString() : "offline: " + detail;
    node.className = ok ? "live" : "live bad";
  }

  async function hmacHex(text) {
    const enc = new TextEncoder();
    key = key || (await crypto.subtle.importKey("raw", enc.encode(token), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]));
    const mac = await crypto.subtle.sign("HMAC", key, enc.encode(text));
    return Array.from(new Uint8Array(mac), (b) => b.toString(16).padStart(2, "0")).join("");
  }

  // Which server start to sign for, taken only with a proof made with the token and only from a
  // server on the port the first one said it had: whoever holds this address after ours stopped
  // cannot pass off another `gpuq web` of the same token (on another port) as ours.
  async function hello() {
    const said = await (await fetch("/api/server", { credentials: "omit", cache: "no-store" })).json().catch(() => ({}));
    if (said.error || !said.proof) throw new Error(said.error || ELSEWHERE);
    if (said.proof !== (await hmacHex("server\n" + said.server + "\n" + said.port))) throw new Error(NO_TOKEN);
    if (port !== null && said.port !== port) throw new Error(ELSEWHERE);
    port = said.port;
    return said.server;
  }

  // Every request is signed, the token never sent: X-Gpuq-Auth is "TS.HEX", the HMAC-SHA256 of
  // "METHOD\nPATH?QUERY\nTS\nSERVER" keyed with it (app.py's `signature`), good for a minute for this
  // one request at this one server start: whoever takes the port after the server stopped learns
  // nothing from what this page sends it. Refused, it asks which server answers (it may have
  // restarted, with a new id) and tries once more.
  async function signed(url, method, again) {
    server = server || (await hello());
    const where = new URL(url, location.href);
    const target = where.pathname + where.search;
    const ts = Date.now(); // in milliseconds
    const hex = await hmacHex(method + "\n" + target + "\n" + ts + "\n" + server);
    const response = await fetch(target, { method, credentials: "omit", cache: "no-store", headers: { "X-Gpuq-Auth": ts + "." + hex } });
    if (response.status !== 403 || again) return response;
    server = null;
    return signed(url, method, true);
  }

  async function getJson(url) {
    const response = await signed(url, "GET");
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  function bar(fraction, label) {
    const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
    const fillNode = el("div", { class: "fill" });
    fillNode.style.width = pct.toFixed(1) + "%"; // through the CSSOM: the policy allows no style attribute
    return el("div", { class: "bar", role: "img", "aria-label": label + " " + Math.round(pct) + "%" }, fillNode);
  }

  // A small line chart: values 0..100 over their index (or [x, y] points), as an inline SVG.
  function spark(values, cls, points) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 100 30");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("class", "spark " + (cls || ""));
    const pts = points || values.map((v, i) => [i, v]);
    const known = pts.filter((p) => p[1] !== null && p[1] !== undefined);
    if (known.length) {
      const x0 = known[0][0];
      const span = Math.max(1e-9, known[known.length - 1][0] - x0);
      const line = document.createElementNS(ns, "polyline");
      const coords = known.map((p) => {
        const x = known.length === 1 ? 100 : ((p[0] - x0) / span) * 100;
        return x.toFixed(2) + "," + (30 - (Math.max(0, Math.min(100, p[1])) * 28) / 100 - 1).toFixed(2);
      });
      if (coords.length === 1) coords.unshift("0," + coords[0].split(",")[1]); // one look: a level line
      line.setAttribute("points", coords.join(" "));
      svg.append(line);
    }
    return svg;
  }

  // ---- the queue -------------------------------------------------------------------------------
  const openSweeps = new Set();
  let page = Number(new URLSearchParams(location.search).get("page")) || 0;

  function jobRow(job) {
    const head = el("div", { class: "head" },
      el("a", { class: "id", href: jobHref(job.id) }, "#" + job.id),
      el("span", { class: "state s-" + word(job.state) }, job.state),
      el("span", { class: "name" }, job.name || ""));
    const parts = [head];
    if (job.state === "running") {
      const line = el("div", { class: "progress" });
      if (job.progress !== null && job.progress !== undefined) line.append(bar(job.progress, "progress"));
      line.append(el("span", {}, job.progress_text || "progress unknown"));
      if (job.util !== null && job.util !== undefined) line.append(el("span", { class: "util" }, "GPU " + job.util + "%"));
      parts.push(line);
    } else if (job.progress_text) {
      parts.push(el("div", { class: "progress" }, job.progress_text));
    }
    if (job.script) parts.push(el("div", { class: "script muted" }, job.script + (job.ran ? "  ·  ran " + job.ran : "")));
    if (job.info) parts.push(el("div", { class: "info" }, job.info));
    return el("div", { class: "job s-" + word(job.state), "data-id": job.id }, ...parts);
  }

  function sweepRow(sweep) {
    const details = el("details", { class: "job sweep s-" + word(sweep.state), "data-sweep": sweep.sweep });
    details.open = openSweeps.has(sweep.sweep);
    details.addEventListener("toggle", () => {
      if (details.open) openSweeps.add(sweep.sweep);
      else openSweeps.delete(sweep.sweep);
    });
    details.append(
      el("summary", {},
        el("span", { class: "state s-" + word(sweep.state) }, sweep.state),
        el("span", { class: "name" }, sweep.name),
        el("span", { class: "info" }, sweep.info.replace(" (`gpuq status -a` lists them)", ""))),
      ...sweep.jobs.map((job) => jobRow(job)));
    return details;
  }

  function rows(list, empty) {
    if (!list.length) return [el("p", { class: "muted" }, empty)];
    return list.map((item) => (item.folded ? sweepRow(item) : jobRow(item)));
  }

  function gpuCard(gpu) {
    const gib = (mib) => (mib / 1024).toFixed(1);
    const frac = gpu.total_mib ? gpu.used_mib / gpu.total_mib : 0;
    return el("div", { class: "gpu" },
      el("div", { class: "head" },
        el("strong", {}, "GPU " + gpu.index),
        el("span", { class: "muted" }, gpu.name),
        el("span", { class: "util" }, gpu.util === null || gpu.util === undefined ? "util ?" : gpu.util + "%")),
      el("div", { class: "progress" }, bar(frac, "memory"),
        el("span", {}, gib(gpu.used_mib) + " / " + gib(gpu.total_mib) + " GiB")),
      el("div", { class: "sparks" },
        el("div", {}, el("span", { class: "muted small" }, "utilisation"), spark(gpu.utils, "util-line")),
        el("div", {}, el("span", { class: "muted small" }, "memory"), spark(gpu.mems, "mem-line"))),
      el("div", { class: "holders" }, gpu.holders.length ? gpu.holders.join(", ") : "free"));
  }

  function drawQueue(q) {
    $("worker").textContent = q.worker;
    fill($("warnings"), q.warnings.map((w) => el("li", {}, w)));
    const gpus = q.gpus;
    $("gpus-section").hidden = !gpus;
    if (gpus) {
      $("gpus-title").textContent = gpus.title;
      fill($("gpus"), gpus.gpus.map(gpuCard));
    }
    $("running-count").textContent = q.running.length ? String(q.running.length) : "";
    $("waiting-count").textContent = q.waiting.length ? String(q.waiting.length) : "";
    $("finished-count").textContent = q.finished_total ? String(q.finished_total) : "";
    fill($("running"), rows(q.running, "nothing running"));
    fill($("waiting"), rows(q.waiting, "nothing waiting"));
    fill($("finished"), rows(q.finished, "nothing finished yet"));
    page = q.page;
    const nav = [];
    if (q.page > 0) nav.push(el("a", { href: "/?page=" + (q.page - 1), rel: "prev" }, "← newer"));
    if (q.pages > 1) nav.push(el("span", { class: "muted" }, "page " + (q.page + 1) + " of " + q.pages));
    if (q.page + 1 < q.pages) nav.push(el("a", { href: "/?page=" + (q.page + 1), rel: "next" }, "older →"));
    fill($("pager"), nav);
  }

  async function pollQueue() {
    try {
      drawQueue(await getJson("/api/queue?page=" + page));
      live(true);
    } catch (err) {
      live(false, err.message);
    }
    setTimeout(pollQueue, POLL_MS);
  }

  // ---- a job's page ------------------------------------------------------------------------------
  const jobId = Number(location.pathname.split("/").pop());
  let job = null; // as the server last said
  let logOffset = null; // null: the log's tail, shown afresh
  let logLines = [""]; // the last one is being written (a progress bar's \r rewrites it)
  let logBusy = false;

  function drawJob(j) {
    job = j;
    document.title = "gpuq #" + j.id + " " + j.name;
    fill($("title"), [
      el("span", {}, "#" + j.id + " "),
      el("span", { class: "state s-" + word(j.state) }, j.state),
      el("span", { class: "name" }, " " + j.name),
    ]);
    fill($("card"), j.card.flatMap(([label, text]) => [el("dt", {}, label), el("dd", {}, text)]));
    const actions = j.read_only ? [] : j.actions.map((name) => {
      const button = el("button", { type: "button", class: j.confirm.includes(name) ? "danger" : "", "data-action": name }, name);
      button.addEventListener("click", () => act(name));
      return button;
    });
    if (j.read_only) actions.push(el("span", { class: "muted" }, "read-only"));
    fill($("actions"), actions);
    drawTriage(j.triage);
    drawChart(j.gpu_series);
  }

  function drawTriage(t) {
    const shown = t && (t.waiting_for || t.reason || (t.exit_code !== null && t.exit_code !== undefined) || t.fixes.length);
    $("triage-section").hidden = !shown;
    if (!shown) return;
    const facts = [
      [t.state, t.waiting_for],  // "pending: after #3", "pending: waiting for GPU 0": as status says it
      ["exit code", t.exit_code === null || t.exit_code === undefined ? null : String(t.exit_code) + (t.signal ? " (" + t.signal + ")" : "")],
      ["reason", t.reason],
      ["cause", t.cause],
      ["checkpoint", t.checkpoint && t.checkpoint.latest ? t.checkpoint.latest : null],
    ].filter(([, v]) => v);
    fill($("triage"), facts.flatMap(([label, text]) => [el("dt", {}, label), el("dd", {}, text)]));
    fill($("fixes"), t.fixes.map((fix) => el("li", {}, el("code", {}, fix.command), el("div", { class: "muted" }, fix.why))));
  }

  function drawChart(series) {
    $("chart-section").hidden = !series.length;
    fill($("chart"), series.map((s) => el("div", { class: "series" },
      el("span", { class: "muted" }, "GPU " + s.gpu + " · " + Math.round(s.points[s.points.length - 1][0]) + " s"),
      spark(null, "util-line big", s.points))));
  }

  async function act(name) {
    if (job.confirm.includes(name) && !window.confirm(name + " job #" + job.id + " (" + job.name + ")?")) return;
    say(name + "…");
    try {
      // a query the server ignores makes each click its own request: a signature seen twice is refused
      const once = "?n=" + Date.now() + Math.random().toString(16).slice(2);
      const response = await signed("/api/job/" + Number(job.id) + "/" + encodeURIComponent(name) + once, "POST");
      const body = await response.json();
      if (!response.ok) throw new Error(body.error || response.statusText);
      say(body.said);
    } catch (err) {
      say(err.message, true);
    }
    refreshJob();
  }

  // tqdm's \r rewrites the line being written; \n ends it
  function addLog(text) {
    const pieces = text.split("\n");
    pieces.forEach((piece, i) => {
      if (i > 0) logLines.push("");
      const over = piece.split("\r");
      let last = logLines.length - 1;
      if (over.length > 1) {
        const kept = over.filter((s) => s !== "");
        logLines[last] = kept.length ? kept[kept.length - 1] : logLines[last];
      } else {
        logLines[last] += piece;
      }
    });
    if (logLines.length > LOG_LINES_KEPT) logLines = logLines.slice(-LOG_LINES_KEPT);
  }

  function drawLog(answer, fresh) {
    const pre = $("log");
    const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40;
    fresh = fresh || answer.afresh;
    if (fresh || answer.skipped) logLines = [answer.skipped ? "[… " + answer.skipped + " bytes skipped …]" : ""];
    if (answer.skipped) logLines.push("");
    addLog(answer.text);
    logOffset = answer.offset;
    pre.textContent = logLines.join("\n");
    if (atEnd || fresh) pre.scrollTop = pre.scrollHeight;
    const state = answer.following ? "following" : answer.not_started ? answer.not_started : "";
    $("log-state").textContent = state;
  }

  async function pollLog() {
    if (!logBusy) {
      logBusy = true;
      try {
        const fresh = logOffset === null;
        drawLog(await getJson("/api/job/" + jobId + "/log" + (fresh ? "" : "?offset=" + logOffset)), fresh);
      } catch (err) {
        live(false, err.message);
      }
      logBusy = false;
    }
    const ended = job && ["done", "failed", "cancelled", "preempted", "interrupted"].includes(job.state);
    setTimeout(pollLog, ended ? POLL_MS * 5 : LOG_POLL_MS);
  }

  async function refreshJob() {
    try {
      drawJob(await getJson("/api/job/" + jobId));
      live(true);
    } catch (err) {
      live(false, err.message);
    }
  }

  async function pollJob() {
    await refreshJob();
    setTimeout(pollJob, POLL_MS);
  }

  if (!secure) {
    say("not a secure context here, so the page cannot sign its requests (it never sends the token): " +
      "open it as http://127.0.0.1:PORT or http://localhost:PORT (ssh -L from another machine)", true);
  } else if (!token) {
    say(NO_TOKEN, true);
  } else if (document.body.dataset.page === "queue") {
    pollQueue();
  } else {
    pollJob();
    pollLog();
  }
})();
