// Queen dashboard overview: one WebSocket for live events, JSON endpoints for the chart and
// the queues' rates; and the router that shows the other pages (pages.js, console.js).
// Plain browser JavaScript, no build step; charts by uPlot (charts.js).
(() => {
  "use strict";

  const Q = window.Queen;

  const WS_URL = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/dashboard`;
  const REFUSED = new Set([4401, 4403]); // the socket's close codes for 401 and 403
  const THROUGHPUT_URL = "/api/v1/analytics/throughput";
  const RATES_URL = "/api/v1/analytics/rates";
  const PING_EVERY_MS = 30000;
  const CHART_REFRESH_MS = 15000;
  const CHART_MINUTES = 60;
  const STALE_QUEUE_MS = 30000; // a queue missing from snapshots this long is removed
  const MAX_LOG = 200; // entries shown
  const KEPT_LOG = 1000; // entries kept, so that a filter finds older ones
  const LOG_FLUSH_MS = 250;

  const $ = (id) => document.getElementById(id);
  const fmt = new Intl.NumberFormat();
  const num = (n) => (n == null ? "–" : fmt.format(n));

  const state = {
    queues: new Map(), // name -> {data, seen: ms}
    rates: new Map(), // name -> the queue's entry of /analytics/rates
    sparks: new Map(), // name -> the element of its last-hour chart, kept across renders
    expanded: new Set(),
    chartQueue: null,
    paused: false,
    log: [], // newest last
    logChanged: true,
    eventTimes: [], // [ms, count] per batch or event, for the rate
    dropped: 0,
    renderQueued: false,
    loaded: false, // a snapshot arrived since the page (or its subscription) asked
  };

  // ---------------------------------------------------------------- token

  // With QUEEN_AUTH=on every data request needs a token: the page asks for one when the
  // server refuses, keeps it in the browser only, and sends it as a Bearer header (and as
  // ?token= on the socket, since browsers cannot set headers on a WebSocket).
  const token = Q.token;
  const authHeaders = Q.authHeaders;
  let signedOut = false;

  function askForToken(reason) {
    signedOut = true;
    Q.forgetToken();
    if (reason) $("login-reason").textContent = reason;
    document.body.dataset.session = "signed-out"; // only the sign-in form shows
    $("login").hidden = false;
    $("login-token").focus();
    $("sign-out").hidden = true;
    setStatus("closed", "sign in to continue");
  }

  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("login-token").value.trim();
    if (!value) return;
    Q.saveToken(value, $("login-remember").checked);
    $("login-token").value = "";
    start();
  });
  $("sign-out").addEventListener("click", () => {
    askForToken("Signed out.");
    if (socket) socket.close();
  });

  // ---------------------------------------------------------------- WebSocket

  let socket = null;
  let retryMs = 500;
  let pingTimer = null;

  function connect() {
    if (signedOut) return;
    setStatus("connecting", "connecting…");
    const query = token() ? `?token=${encodeURIComponent(token())}` : "";
    socket = new WebSocket(WS_URL + query);
    socket.onopen = () => {
      retryMs = 500;
      setStatus("open", "live");
      $("sign-out").hidden = !token();
      sendSubscription();
      pingTimer = setInterval(() => socket.readyState === 1 && socket.send("ping"), PING_EVERY_MS);
    };
    socket.onmessage = (msg) => {
      if (msg.data === "pong") return;
      let event;
      try {
        event = JSON.parse(msg.data);
      } catch (e) {
        return;
      }
      handle(event);
    };
    socket.onclose = (e) => {
      clearInterval(pingTimer);
      socket = null;
      if (REFUSED.has(e.code)) {
        askForToken(e.reason || "The server refused this token.");
        return;
      }
      if (signedOut) return;
      setStatus("closed", `reconnecting in ${Math.round(retryMs / 1000)}s`);
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }

  function setStatus(stateName, text) {
    $("status").dataset.state = stateName;
    $("status-text").textContent = text;
  }

  function sendSubscription() {
    if (!socket || socket.readyState !== 1) return;
    const queues = $("subscribe").value.split(/[\s,]+/).filter(Boolean);
    socket.send(JSON.stringify({ type: "subscribe", queues, batch: true }));
    state.queues.clear(); // the next snapshot (a few seconds) shows only what was asked for
    state.loaded = false;
    scheduleRender();
  }

  function handle(event, counted = false) {
    const { event: name, data, timestamp } = event;
    switch (name) {
      case "queue.depth":
        onDepth(data);
        break;
      case "system.stats":
        onStats(data);
        break;
      case "connected":
        log({ name: "connected", timestamp, where: "", detail: `connection ${data.connectionId}` });
        break;
      case "events.batch":
        onBatch(data);
        break;
      case "message.pushed":
      case "message.processing":
      case "message.completed":
      case "message.failed":
      case "queue.created":
        onMessageEvent(name, data, timestamp, counted);
        break;
      default:
        break; // partition.depth, client.*: the queue table already shows them
    }
  }

  // ---------------------------------------------------------------- stats and queues

  // One worker's events of the last flush period (a second by default): the sample shown in the log, and counts that
  // stay complete when the per-worker cap left events out of the sample.
  function onBatch(batch) {
    for (const event of batch.events) handle(event, true);
    const total = Object.values(batch.totals || {}).reduce((a, b) => a + b, 0);
    state.eventTimes.push([Date.now(), total]);
    if (batch.dropped) {
      state.dropped += batch.dropped;
      $("dropped").hidden = false;
      $("dropped").textContent = `${num(state.dropped)} events over the cap not listed (counted in the rate)`;
    }
  }

  function onStats(s) {
    state.loaded = true;
    for (const id of ["stat-pending", "stat-processing", "stat-created", "stat-completed", "stat-connections", "stat-queues"]) {
      $(id).classList.remove("loading");
      $(id).removeAttribute("aria-busy");
    }
    scheduleRender();
    $("stat-pending").textContent = num(s.pending);
    $("stat-processing").textContent = num(s.processing);
    $("stat-created").textContent = num(s.recentCreated);
    $("stat-completed").textContent = num(s.recentCompleted);
    $("stat-connections").textContent = num(s.connections);
    if (s.queues != null) $("stat-queues").textContent = num(s.queues);
  }

  function onDepth(d) {
    state.queues.set(d.queue, { data: d, seen: Date.now() });
    state.loaded = true;
    scheduleRender();
  }

  function scheduleRender() {
    if (state.renderQueued) return;
    state.renderQueued = true;
    requestAnimationFrame(() => {
      state.renderQueued = false;
      renderQueues();
    });
  }

  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  function numCell(value, alert) {
    return cell(num(value), `num${value === 0 ? " zero" : value > 0 && alert ? ` ${alert}` : ""}`);
  }

  function renderQueues() {
    const now = Date.now();
    for (const [name, q] of state.queues) {
      if (now - q.seen > STALE_QUEUE_MS) state.queues.delete(name);
    }
    const filter = $("queue-filter").value.trim().toLowerCase();
    const names = [...state.queues.keys()].filter((n) => n.toLowerCase().includes(filter)).sort();
    const body = $("queue-rows");
    const rows = [];
    for (const name of names) {
      const { data: d } = state.queues.get(name);
      const open = state.expanded.has(name);
      const tr = document.createElement("tr");
      tr.className = `queue${open ? " open" : ""}${state.chartQueue === name ? " selected" : ""}`;
      const first = document.createElement("td");
      first.className = "name";
      const caret = document.createElement("span");
      caret.className = "caret";
      caret.textContent = "▸";
      const open_ = Q.link(Q.queueHref(name), name, { class: "queue-link", title: "Open the queue's page" });
      open_.addEventListener("click", (e) => e.stopPropagation());
      first.append(caret, open_);
      const parts = Object.keys(d.partitions || {}).length;
      for (const label of [d.namespace, d.task, `${parts} partition${parts === 1 ? "" : "s"}`]) {
        if (!label) continue;
        const tag = document.createElement("span");
        tag.className = "tag";
        tag.textContent = label;
        first.append(tag);
      }
      tr.append(
        first,
        numCell(d.totalDepth),
        numCell(d.totalProcessing, "busy"),
        numCell(d.totalCompleted),
        numCell(d.totalFailed, "warn"),
        numCell(d.totalDeadLetter, "warn"),
      );
      const rate = state.rates.get(name);
      tr.append(
        rateCell(rate && rate.now.incomingPerSecond, rate && `${Q.rate(rate.lastHour.incomingPerSecond)}/s over the last hour`),
        rateCell(rate && rate.now.outgoingPerSecond, rate && `${Q.rate(rate.lastHour.outgoingPerSecond)}/s over the last hour`),
      );
      const trend = document.createElement("td");
      trend.className = "trend";
      if (!state.sparks.has(name)) state.sparks.set(name, document.createElement("div"));
      trend.append(state.sparks.get(name));
      tr.append(trend);
      tr.addEventListener("click", () => toggle(name));
      tr.title = "Click: show partitions and chart this queue";
      rows.push([tr, name]);
      if (open) {
        const partitions = Object.entries(d.partitions || {}).sort(([a], [b]) => a.localeCompare(b));
        for (const [pname, p] of partitions) {
          const pr = document.createElement("tr");
          pr.className = "partition";
          pr.append(
            cell(pname, "name"),
            numCell(p.depth),
            numCell(p.processing, "busy"),
            numCell(p.completed),
            numCell(p.failed, "warn"),
            numCell(p.deadLetter, "warn"),
            cell("", "num"),
            cell("", "num"),
            cell("", "trend"),
          );
          rows.push([pr, null]);
        }
      }
    }
    body.replaceChildren(...rows.map(([tr]) => tr));
    if (!rows.length) {
      const tr = document.createElement("tr");
      tr.className = state.loaded ? "empty" : "empty loading";
      const none = state.loaded ? "No queues yet." : "Loading queues…";
      tr.append(cell(state.queues.size ? "No queue matches the filter." : none, ""));
      tr.firstChild.colSpan = 9;
      body.append(tr);
    }
    for (const [, name] of rows) if (name) drawSpark(name);
    if (state.loaded) $("stat-queues").textContent = num(state.queues.size);
  }

  function toggle(name) {
    if (state.expanded.has(name)) state.expanded.delete(name);
    else state.expanded.add(name);
    state.chartQueue = name;
    $("chart-scope").textContent = `queue ${name}`;
    $("chart-reset").hidden = false;
    loadThroughput();
    renderQueues();
  }

  // ---------------------------------------------------------------- charts and rates

  const CHART_SERIES = [
    { key: "incoming", label: "incoming / min", color: "--incoming" },
    { key: "completed", label: "completed / min", color: "--completed" },
    { key: "failed", label: "failed / min", color: "--failed" },
  ];
  const SPARK_SERIES = [
    { key: "incoming", color: "--incoming" },
    { key: "outgoing", color: "--completed" },
  ];
  let chartData = [];

  function drawChart() {
    if ($("view-overview").hidden || document.body.dataset.session !== "open") return;
    Q.timeChart($("chart"), CHART_SERIES, chartData);
  }

  function drawSpark(name) {
    const rate = state.rates.get(name);
    if (!rate) return;
    const points = rate.minutes.map((m) => ({ t: Date.parse(m.timestamp), incoming: m.incoming, outgoing: m.outgoing }));
    Q.sparkChart(state.sparks.get(name), SPARK_SERIES, points);
  }

  function rateCell(perSecond, title) {
    const td = cell(perSecond == null ? "…" : Q.rate(perSecond), `num rate${perSecond ? "" : " zero"}`);
    if (title) td.title = title;
    return td;
  }

  async function loadRates() {
    try {
      const doc = await Q.api(RATES_URL);
      state.rates = new Map(doc.queues.map((q) => [q.queue, q]));
      for (const name of state.sparks.keys()) if (!state.rates.has(name)) state.sparks.delete(name);
      renderQueues();
    } catch (e) {
      // the server is restarting: the next refresh will catch up
    }
  }

  async function loadThroughput() {
    const params = new URLSearchParams();
    if (state.chartQueue) params.set("queue", state.chartQueue);
    try {
      const resp = await fetch(`${THROUGHPUT_URL}?${params}`, { headers: authHeaders() });
      if (resp.status === 401) askForToken("This server needs an API token.");
      if (!resp.ok) return;
      // Newest first, rates nested: chart oldest first, messages per minute.
      chartData = ((await resp.json()).throughput || []).slice(0, CHART_MINUTES).reverse()
        .map((p) => ({
          t: Date.parse(p.timestamp),
          incoming: p.incoming.messagesPerMinute,
          completed: p.completed.messagesPerMinute,
          failed: p.failed.messagesPerMinute,
        }));
      drawChart();
    } catch (e) {
      // the server is restarting: the next refresh will catch up
    }
  }

  // ---------------------------------------------------------------- event log

  const BADGES = {
    "message.pushed": ["pushed", "pushed"],
    "message.processing": ["processing", "processing"],
    "message.completed": ["completed", "completed"],
    "message.failed": ["failed", "failed"],
    "queue.created": ["queue created", "other"],
  };

  function onMessageEvent(name, data, timestamp, counted) {
    if (!counted) state.eventTimes.push([Date.now(), 1]);
    if (state.paused) return;
    const where = data.queue ? `${data.queue}${data.partition ? ` / ${data.partition}` : ""}` : "";
    const detail = [];
    if (data.transactionId) detail.push(data.transactionId);
    if (data.workerId) detail.push(`worker ${data.workerId}`);
    if (data.status && data.status !== "failed") detail.push(data.status.replace("_", " "));
    if (data.retryCount != null) detail.push(`retry ${data.retryCount}`);
    log({ name, timestamp, where, queue: data.queue, detail: detail.join(" · "), error: data.error });
  }

  function log(entry) {
    state.log.push(entry);
    if (state.log.length > KEPT_LOG) state.log.splice(0, state.log.length - KEPT_LOG);
    state.logChanged = true;
  }

  function shownEntries() {
    const kind = $("log-kind").value;
    const queue = $("log-queue").value.trim().toLowerCase();
    const shown = [];
    for (let i = state.log.length - 1; i >= 0 && shown.length < MAX_LOG; i--) {
      const e = state.log[i];
      if (kind && e.name !== kind) continue;
      if (queue && !(e.queue || "").toLowerCase().includes(queue)) continue;
      shown.push(e);
    }
    return shown;
  }

  function flushLog() {
    const list = $("events");
    if (state.logChanged) {
      state.logChanged = false;
      const items = shownEntries().map(renderEntry);
      if (!items.length) {
        const li = document.createElement("li");
        li.className = "note";
        li.textContent = state.log.length ? "No event matches the filter." : "No events yet. Push a message to see it here.";
        items.push(li);
      }
      list.replaceChildren(...items);
    }
    const cutoff = Date.now() - 10000;
    state.eventTimes = state.eventTimes.filter(([t]) => t >= cutoff);
    const rate = state.eventTimes.reduce((sum, [, n]) => sum + n, 0) / 10;
    $("event-rate").textContent = rate ? `${rate.toFixed(1)} events/s` : "";
  }

  function renderEntry(e) {
    const li = document.createElement("li");
    const time = document.createElement("span");
    time.className = "time";
    const t = new Date(e.timestamp);
    time.textContent = `${t.toTimeString().slice(0, 8)}.${String(t.getMilliseconds()).padStart(3, "0")}`;
    const [label, cls] = BADGES[e.name] || [e.name, "other"];
    const badge = document.createElement("span");
    badge.className = `badge ${cls}`;
    badge.textContent = label;
    const where = document.createElement("span");
    where.className = "where";
    where.textContent = e.where;
    const detail = document.createElement("span");
    detail.className = "detail";
    detail.textContent = e.detail;
    if (e.error) {
      const err = document.createElement("span");
      err.className = "error";
      err.textContent = ` ${e.error}`;
      detail.append(err);
    }
    li.dataset.kind = e.name;
    li.append(time, badge, where, detail);
    return li;
  }

  // ---------------------------------------------------------------- wiring

  $("queue-filter").addEventListener("input", renderQueues);
  $("subscribe").addEventListener("change", sendSubscription);
  $("pause").addEventListener("click", (ev) => {
    state.paused = !state.paused;
    ev.target.textContent = state.paused ? "Resume" : "Pause";
  });
  $("clear").addEventListener("click", () => {
    state.log = [];
    state.logChanged = true;
  });
  for (const id of ["log-kind", "log-queue"]) {
    for (const type of ["input", "change"]) {
      $(id).addEventListener(type, () => {
        state.logChanged = true;
        flushLog();
      });
    }
  }
  $("chart-reset").addEventListener("click", () => {
    state.chartQueue = null;
    $("chart-scope").textContent = "all queues";
    $("chart-reset").hidden = true;
    loadThroughput();
    renderQueues();
  });
  window.addEventListener("resize", () => {
    drawChart();
    renderQueues();
  });

  // ---------------------------------------------------------------- pages

  function showRole(me) {
    $("role").hidden = !me.auth;
    $("role").textContent = me.auth ? `${me.name || "token"} · ${me.role}` : "";
  }

  // #/ is the overview; #/<page>/<arg>?<query> renders pages.js's page into #view-page.
  function route() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [path, search] = hash.split("?");
    const [page, ...args] = path.split("/").filter(Boolean).map(decodeURIComponent);
    const render = page && Q.pages[page];
    $("view-overview").hidden = Boolean(render);
    $("view-page").hidden = !render;
    const tab = page === "queue" || page === "message" ? (page === "message" ? "messages" : "overview") : page || "overview";
    for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.page === tab);
    if (render) render($("view-page"), args, new URLSearchParams(search || ""));
    else {
      drawChart();
      renderQueues();
    }
  }

  Q.onUnauthorized = (reason) => askForToken(reason);
  window.addEventListener("hashchange", () => signedOut || route());

  // Learn first whether the server takes this browser's token (or needs none): a refused
  // one shows the sign-in form alone; an accepted one opens the page and its socket.
  async function start() {
    document.body.dataset.session = "checking";
    signedOut = false;
    try {
      const resp = await fetch("/api/v1/auth/me", { headers: authHeaders() });
      if (resp.status === 401) {
        askForToken(token() ? "The server refused this token." : null); // null: keep the hint
        return;
      }
    } catch (e) {
      // the server is restarting: the page opens and reconnects
    }
    $("login").hidden = true;
    document.body.dataset.session = "open";
    retryMs = 500;
    if (socket) socket.close();
    else connect();
    loadThroughput();
    loadRates();
    Q.loadMe().then(showRole).then(route).then(Q.loadAlerts);
  }

  setInterval(flushLog, LOG_FLUSH_MS);
  setInterval(() => signedOut || (loadThroughput(), loadRates(), Q.loadAlerts()), CHART_REFRESH_MS);
  start();
})();
