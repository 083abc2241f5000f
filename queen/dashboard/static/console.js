// Queen dashboard console pages: consumers (live leases) and nodes (hosts, workers, the
// maintenance leader, database sessions). Each reads one API route and refreshes itself
// while shown. Plain browser JavaScript, no build step.
(() => {
  "use strict";

  const Q = window.Queen;
  const { el } = Q;
  const REFRESH_MS = 5000;
  const enc = encodeURIComponent;

  let timer = null; // the shown page's refresh; cleared when another page is shown
  window.addEventListener("hashchange", () => {
    clearInterval(timer);
    timer = null;
  });

  function table(headers, rows, cls, empty) {
    return el("table", { class: `grid ${cls}` },
      el("thead", {}, el("tr", {}, headers.map(([text, c]) => el("th", { class: c || "", text })))),
      el("tbody", {}, rows.length ? rows : el("tr", { class: "empty" }, el("td", { colspan: headers.length, text: empty }))));
  }

  function page(root, title, hint, load) {
    const box = el("div", { class: "notices" });
    const body = el("div", {}, el("p", { class: "hint loading", text: "Loading…" }));
    const stamp = el("span", { class: "muted updated" });
    root.replaceChildren(
      el("div", { class: "page-head" }, el("h2", {}, title, stamp)),
      el("p", { class: "hint", text: hint }), box, body);
    const refresh = async () => {
      try {
        body.replaceChildren(...(await load()));
        Q.notice(box, "", "");
        stamp.textContent = ` updated ${new Date().toTimeString().slice(0, 8)}`;
      } catch (e) {
        Q.notice(box, "error", e.message);
      }
    };
    clearInterval(timer);
    timer = setInterval(() => root.isConnected && !root.hidden && refresh(), REFRESH_MS);
    return refresh();
  }

  // -- consumers ----------------------------------------------------------------------

  async function consumersPage(root, args, query) {
    const queue = query.get("queue") || "";
    const path = `/api/v1/leases${queue ? `?queue=${enc(queue)}` : ""}`;
    await page(root, queue ? `Consumers of ${queue}` : "Consumers",
      "Live leases: which worker answered the pop that holds each partition, for which group, since when.",
      async () => {
        const doc = await Q.api(path);
        const rows = doc.leases.map((l) => el("tr", { "data-lease": l.leaseId, "data-queue": l.queue, "data-partition": l.partition },
          el("td", {}, Q.link(Q.queueHref(l.queue), l.queue), el("span", { class: "muted", text: ` / ${l.partition}` })),
          el("td", { text: l.consumerGroup || "queue mode" }),
          el("td", { class: "mono worker", text: l.workerId || "–" }),
          Q.numCell(l.messages),
          Q.numCell(l.acked),
          el("td", { class: "num since", title: l.leasedAt, text: Q.age(l.leasedAt) }),
          el("td", { class: "num", title: l.expiresAt, text: Q.duration((Date.parse(l.expiresAt) - Date.now()) / 1000) })));
        const out = [table([["Queue / partition"], ["Group"], ["Worker"], ["Messages", "num"], ["Acked", "num"],
          ["Held for", "num"], ["Expires in", "num"]], rows, "leases", "No lease is held now.")];
        if (doc.truncated) out.push(el("p", { class: "hint", text: `The ${doc.leases.length} oldest leases are shown.` }));
        return out;
      });
  }

  // -- nodes --------------------------------------------------------------------------

  const bytes = (n) => (n == null ? "–" : `${(n / 1048576).toFixed(1)} MiB`);

  function poolCell(pool) {
    if (!pool) return el("td", { class: "num", text: "–" });
    const inUse = pool.size - pool.idle;
    return el("td", { class: "num pool", title: `${pool.size} open of ${pool.max}, ${pool.idle} idle, ${pool.waiting} waiting`, text: `${inUse} / ${pool.size} (max ${pool.max})${pool.waiting ? `, ${pool.waiting} waiting` : ""}` });
  }

  async function nodesPage(root) {
    await page(root, "Nodes",
      "Every worker of every host, as it last described itself (every 5 s); the database's sessions per application.",
      async () => {
        const doc = await Q.api("/api/v1/system/nodes");
        const workers = doc.hosts.reduce((n, h) => n + h.workers.length, 0);
        const sessions = doc.database.sessions.reduce((n, s) => n + s.connections, 0);
        const cards = el("section", { class: "cards" },
          ...[["Hosts", Q.num(doc.hosts.length)], ["Workers", Q.num(workers)],
            ["Database sessions", `${Q.num(sessions)} / ${Q.num(doc.database.maxConnections)}`],
            ["Maintenance leader", doc.maintenanceLeader || "none"]]
            .map(([label, value]) => el("div", { class: "card" }, el("div", { class: "label", text: label }),
              el("div", { class: `value${label === "Maintenance leader" ? " small" : ""}`, "data-stat": label, text: value }))));
        const hosts = doc.hosts.map((h) => el("div", { class: "node", "data-host": h.host },
          el("h3", { text: h.host }),
          table([["Worker"], ["PID", "num"], ["Memory (RSS)", "num"], ["DB pool in use", "num"], ["Dashboards", "num"], ["Started"], ["Last note", "num"]],
            h.workers.map((w) => el("tr", { "data-worker": w.workerId },
              el("td", { class: "mono", text: w.workerId }),
              el("td", { class: "num", text: String(w.pid) }),
              el("td", { class: "num rss", text: bytes(w.rssBytes) }),
              poolCell(w.pool),
              Q.numCell(w.dashboardSockets),
              el("td", { title: w.startedAt, text: Q.time(w.startedAt) }),
              el("td", { class: "num", title: w.seenAt, text: `${Q.age(w.seenAt)} ago` }))), "workers", "")));
        const db = table([["Application"], ["Sessions", "num"], ["Busy", "num"]],
          doc.database.sessions.map((s) => el("tr", { "data-application": s.application },
            el("td", { class: "mono", text: s.application }), Q.numCell(s.connections), Q.numCell(s.busy, "busy"))),
          "sessions", "No session.");
        return [cards,
          el("section", { class: "panel" }, el("div", { class: "panel-head" }, el("h2", { text: "Hosts and workers" })),
            ...(hosts.length ? hosts : [el("p", { class: "hint", text: "No worker has described itself yet." })])),
          el("section", { class: "panel" }, el("div", { class: "panel-head" }, el("h2", { text: "Database sessions" })), db)];
      });
  }

  // -- alerts (on the overview) --------------------------------------------------------

  const KINDS = { depth: "pending messages", lag: "oldest pending, seconds", dead_letters: "dead letters in the window" };

  function alertForm(done) {
    const input = (name, attrs) => el("input", { name, "aria-label": name, ...attrs });
    const form = el("form", { class: "filters alert-form", id: "alert-form" },
      el("label", {}, "Name ", input("name", { required: true, placeholder: "orders-backlog" })),
      el("label", {}, "Queue ", input("queue", { required: true })),
      el("label", {}, "When ", el("select", { name: "kind", "aria-label": "kind" },
        Object.entries(KINDS).map(([v, text]) => el("option", { value: v, text })))),
      el("label", {}, "exceeds ", input("threshold", { type: "number", min: "0", step: "any", required: true, class: "short" })),
      el("label", {}, "window (min) ", input("windowMinutes", { type: "number", min: "1", max: "1440", value: "5", class: "short" })),
      el("button", { type: "submit", id: "add-alert" }, "Set alert"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const f = Object.fromEntries(new FormData(form).entries());
      const body = { queue: f.queue, kind: f.kind, threshold: Number(f.threshold), windowMinutes: Number(f.windowMinutes || 5) };
      done(Q.api(`/api/v1/alerts/${enc(f.name)}`, { method: "PUT", body }));
    });
    return form;
  }

  // The alerts table (GET /api/v1/alerts), firing ones first; admins set and remove them.
  Q.loadAlerts = async () => {
    const root = document.getElementById("alerts");
    if (!root || root.querySelector("#alert-form input:focus, #alert-form select:focus")) return;
    let doc;
    try {
      doc = await Q.api("/api/v1/alerts");
    } catch (e) {
      root.replaceChildren(el("p", { class: "notice error", text: `Alerts could not be loaded: ${e.message}` }));
      return;
    }
    const admin = Q.can("admin");
    const box = el("div", { class: "notices" });
    const act = (promise) => promise.then(() => Q.loadAlerts()).catch((e) => Q.notice(box, "error", e.message));
    const alerts = [...doc.alerts].sort((a, b) => (b.firing - a.firing) || a.name.localeCompare(b.name));
    const firing = alerts.filter((a) => a.firing).length;
    document.getElementById("alerts-firing").textContent = firing ? `${firing} firing` : "";
    const headers = [["Alert"], ["Queue"], ["When"], ["Threshold", "num"], ["Now", "num"], ["State"]];
    if (admin) headers.push(["", "actions"]);
    const rows = alerts.map((a) => el("tr", { "data-alert": a.name, class: a.firing ? "firing" : "" },
      el("td", { class: "name", text: a.name }),
      el("td", {}, Q.link(Q.queueHref(a.queue), a.queue)),
      el("td", { text: a.kind === "dead_letters" ? `dead letters in ${a.windowMinutes} min` : KINDS[a.kind] }),
      el("td", { class: "num", text: Q.num(a.threshold) }),
      el("td", { class: "num value", text: a.value == null ? "no such queue" : Q.num(Math.round(a.value * 10) / 10) }),
      el("td", {}, el("span", { class: `badge ${a.firing ? "failed" : "completed"}`, text: a.firing ? "firing" : "ok" })),
      admin ? el("td", { class: "actions" }, el("button", { type: "button", class: "danger delete-alert",
        onclick: () => act(Q.api(`/api/v1/alerts/${enc(a.name)}`, { method: "DELETE" })) }, "Remove")) : null));
    root.replaceChildren(box, table(headers, rows, "alerts", "No alert is set."),
      admin ? alertForm((promise) => act(promise)) : null);
  };

  Object.assign(Q.pages, { consumers: consumersPage, nodes: nodesPage });
})();
