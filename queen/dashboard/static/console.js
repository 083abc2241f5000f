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

  Object.assign(Q.pages, { consumers: consumersPage, nodes: nodesPage });
})();
