// Queen dashboard pages beyond the overview: queue detail, message browser and detail,
// dead letters, consumer groups. Each page is a function (root, args, query) that renders
// into root from the HTTP API; app.js routes #/<page>/<arg>?<query> to it.
(() => {
  "use strict";

  const Q = window.Queen;
  const { el } = Q;
  const PAGE_SIZE = 50;
  const FETCH_WAIT_MS = 2000; // a test fetch waits this long for a message
  const PARTITIONS_SHOWN = 200; // a queue's busiest partitions listed; the rest are summed
  const STATUSES = ["", "pending", "processing", "completed", "failed", "dead_letter"];

  const api = (path, options) => Q.api(path, options);
  const enc = encodeURIComponent;
  const qs = (params) => {
    const search = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== "" && v != null) search.set(k, v);
    return search.toString();
  };

  function panel(title, ...body) {
    return el("section", { class: "panel" }, el("div", { class: "panel-head" }, title), ...body);
  }

  function heading(text, ...extra) {
    return el("h2", {}, text, ...extra);
  }

  function statusBadge(status) {
    return el("span", { class: `badge status-${status}`, text: (status || "").replace("_", " ") });
  }

  function table(headers, rows, cls = "") {
    return el("table", { class: `grid ${cls}` },
      el("thead", {}, el("tr", {}, headers.map(([text, c]) => el("th", { class: c || "", text })))),
      el("tbody", {}, rows.length ? rows : el("tr", { class: "empty" }, el("td", { colspan: headers.length, text: "Nothing here." }))));
  }

  function button(text, onclick, attrs = {}) {
    return el("button", { type: "button", onclick, ...attrs }, text);
  }

  // Run an action, then show its outcome in `box`; refresh the page when it worked.
  async function act(box, work, done, refresh) {
    try {
      await work();
      Q.notice(box, "ok", done);
      if (refresh) await refresh();
    } catch (e) {
      Q.notice(box, "error", e.message);
    }
  }

  const THROUGHPUT_SERIES = [
    { key: "incoming", label: "incoming / min", color: "--incoming" },
    { key: "completed", label: "completed / min", color: "--completed" },
    { key: "failed", label: "failed / min", color: "--failed" },
  ];

  async function throughputOf(queue) {
    const doc = await api(`/api/v1/analytics/throughput?${qs({ queue })}`);
    return (doc.throughput || []).slice(0, 60).reverse().map((p) => ({
      t: Date.parse(p.timestamp),
      incoming: p.incoming.messagesPerMinute,
      completed: p.completed.messagesPerMinute,
      failed: p.failed.messagesPerMinute,
    }));
  }

  // Consumer groups come from /api/v1/consumer-groups (an error answer is shown as is).
  async function consumerGroups(queue) {
    const doc = await api(`/api/v1/consumer-groups${queue ? `?${qs({ queue })}` : ""}`);
    const groups = (doc && doc.consumerGroups) || [];
    return queue ? groups.filter((g) => g.queue === queue) : groups;
  }

  // A failed listing is shown with the server's error.
  function unavailable(error) {
    return el("p", { class: "notice error groups-unavailable", role: "alert", text: `Consumer groups could not be loaded: ${error.message}` });
  }

  // Pending is counted up to a cap per partition: past it the number is a lower bound.
  function pendingCell(g) {
    const td = Q.numCell(g.pending, "busy");
    if (g.pendingCapped) {
      td.textContent = `${Q.num(g.pending)}+`;
      td.title = "Counted up to a cap: at least this many.";
    }
    return td;
  }

  // Where the group started reading: subscriptionMode all | new | from (new keeps its join time).
  function subscription(g) {
    if (g.subscriptionMode === "new") return "new messages";
    if (g.subscriptionMode === "from") return `since ${Q.time(g.subscriptionFrom)}`;
    return "all messages";
  }

  function field(node, name) {
    node.dataset.field = name;
    return node;
  }

  function groupsTable(groups, box, refresh) {
    const acts = Q.can("consume"); // every role that may act on a group may seek it
    const headers = [["Group"], ["Queue"], ["Reads"], ["Partitions", "num"], ["Leased", "num"],
      ["Pending", "num"], ["Lag", "num"], ["Joined"]];
    if (acts) headers.push(["Actions", "actions"]);
    const rows = groups.map((g) => {
      const tr = el("tr", { "data-group": g.name, "data-queue": g.queue },
        el("td", { class: "name" }, g.name, g.queueMode ? el("span", { class: "tag", text: "queue mode" }) : null),
        el("td", {}, Q.link(Q.queueHref(g.queue), g.queue)),
        field(el("td", { title: g.subscriptionFrom || "", text: subscription(g) }), "reads"),
        field(Q.numCell(g.partitions), "partitions"),
        field(Q.numCell(g.leasedPartitions, "busy"), "leased"),
        field(pendingCell(g), "pending"),
        field(el("td", { class: "num", title: `${g.lagSeconds}s`, text: Q.duration(g.lagSeconds) }), "lag"),
        field(el("td", { title: g.createdAt || "", text: Q.time(g.createdAt) }), "joined"));
      if (acts) tr.append(el("td", { class: "actions" }, groupActions(g, box, refresh)));
      return tr;
    });
    return table(headers, rows, "groups");
  }

  // Seeking needs the consume right, deleting admin; queue mode cannot be deleted.
  function groupActions(group, box, refresh) {
    const path = `/api/v1/consumer-groups/${enc(group.name)}`;
    const out = Q.can("consume") ? seekControls(group, path, box, refresh) : [];
    if (Q.can("admin") && !group.queueMode) {
      out.push(button("Delete", async () => {
        if (!(await Q.confirm(`Delete group ${group.name} on queue ${group.queue}? It starts over on its next pop.`, "Delete group"))) return;
        act(box, () => api(`${path}?${qs({ queue: group.queue })}`, { method: "DELETE" }),
          `Group ${group.name} deleted from ${group.queue}.`, refresh);
      }, { class: "danger delete-group" }));
    }
    return out;
  }

  function seekControls(group, path, box, refresh) {
    const where = el("select", { class: "seek-to", "aria-label": "Seek to" },
      el("option", { value: "beginning", text: "beginning" }),
      el("option", { value: "end", text: "end" }),
      el("option", { value: "time", text: "a time…" }));
    const when = el("input", { type: "datetime-local", step: "1", class: "seek-time", hidden: true, "aria-label": "Seek time" });
    where.addEventListener("change", () => (when.hidden = where.value !== "time"));
    const seek = button("Seek", () => {
      const at = new Date(when.value); // datetime-local is the browser's local time
      if (where.value === "time" && Number.isNaN(at.getTime())) {
        Q.notice(box, "error", `Pick the time to seek group ${group.name} to.`);
        return;
      }
      const to = where.value === "time" ? at.toISOString() : where.value;
      act(box, () => api(`${path}/seek`, { method: "POST", body: { queue: group.queue, to } }),
        `Group ${group.name} on ${group.queue} moved to ${where.value === "time" ? Q.time(to) : to}.`, refresh);
    }, { class: "seek" });
    return [where, when, seek];
  }

  // -- queue detail -------------------------------------------------------------------

  const OPTION_HELP = {
    leaseTime: "seconds", retryLimit: "retries", priority: "", maxSize: "0: no limit", ttl: "seconds, 0: none",
    delayedProcessing: "seconds", windowBuffer: "seconds", retentionSeconds: "seconds",
    completedRetentionSeconds: "seconds", maxWaitTimeSeconds: "seconds, 0: none", retryDelay: "ms",
  };

  async function queuePage(root, [name]) {
    const box = el("div", { class: "notices" });
    const body = el("div", {});
    root.replaceChildren(
      el("nav", { class: "crumbs" }, Q.link("#/", "Overview"), " / ", el("span", { text: name })),
      box, body);
    const refresh = async () => {
      let queue;
      try {
        queue = await api(`/api/v1/resources/queues/${enc(name)}`);
      } catch (e) {
        Q.notice(box, "error", e.message);
        return;
      }
      body.replaceChildren(...queueSections(queue, box, refresh));
      const chart = body.querySelector(".chart.throughput");
      throughputOf(name).then((points) => Q.timeChart(chart, THROUGHPUT_SERIES, points, { height: 140 })).catch(() => {});
      const rates = body.querySelector(".queue-rates");
      api(`/api/v1/analytics/rates?${qs({ queue: name })}`)
        .then((doc) => rates.replaceChildren(...rateCards(doc.queues[0])))
        .catch(() => {});
      const groupsBox = body.querySelector(".groups-box");
      consumerGroups(name)
        .then((groups) => groupsBox.replaceChildren(groupsTable(groups, box, refresh)))
        .catch((e) => groupsBox.replaceChildren(unavailable(e)));
    };
    await refresh();
  }

  function queueSections(queue, box, refresh) {
    const t = queue.totals || {};
    const labels = [queue.namespace && `namespace ${queue.namespace}`, queue.task && `task ${queue.task}`].filter(Boolean);
    const cards = el("section", { class: "cards queue-cards" },
      ...[["Pending", t.pending], ["Processing", t.processing], ["Completed", t.completed],
        ["Failed", t.failed], ["Dead letter", t.deadLetter], ["Partitions", (queue.partitions || []).length]]
        .map(([label, value]) => el("div", { class: "card" }, el("div", { class: "label", text: label }),
          el("div", { class: "value", "data-stat": label, text: Q.num(value) }))));
    const actions = Q.can("admin")
      ? el("div", { class: "controls" },
        Q.link(`#/messages?${qs({ queue: queue.name })}`, "Browse messages", { class: "button" }),
        Q.link(`#/dead-letters?${qs({ queue: queue.name })}`, "Dead letters", { class: "button" }),
        button("Clear queue…", () => clearQueue(queue.name, box, refresh), { class: "danger", id: "clear-queue" }),
        button("Delete queue…", () => deleteQueue(queue.name, box), { class: "danger", id: "delete-queue" }))
      : el("div", { class: "controls" },
        Q.link(`#/messages?${qs({ queue: queue.name })}`, "Browse messages", { class: "button" }),
        Q.link(`#/dead-letters?${qs({ queue: queue.name })}`, "Dead letters", { class: "button" }));
    return [
      el("div", { class: "page-head" }, heading(`Queue ${queue.name}`, ...labels.map((l) => el("span", { class: "tag", text: l }))), actions),
      cards,
      el("section", { class: "cards queue-rates" }, ...rateCards(null)),
      panel(heading("Throughput", el("span", { class: "muted", text: " messages per minute, last hour" })),
        el("div", { class: "chart throughput" })),
      Q.can("push") || Q.can("consume") ? panel(heading("Test message"), testMessage(queue.name, box, refresh)) : null,
      panel(heading("Partitions"), partitionsTable(queue.name, queue.partitions || [])),
      panel(heading("Consumer groups"), el("div", { class: "groups-box" }, el("p", { class: "hint", text: "Loading…" }))),
      panel(heading("Options"), optionsForm(queue, box, refresh)),
    ];
  }

  // In and out per second now (last minute) and over the hour, from /analytics/rates.
  function rateCards(rate) {
    const value = (v) => (rate ? `${Q.rate(v)}/s` : "…");
    return [["In now", (r) => r.now.incomingPerSecond], ["Out now", (r) => r.now.outgoingPerSecond],
      ["In, last hour", (r) => r.lastHour.incomingPerSecond], ["Out, last hour", (r) => r.lastHour.outgoingPerSecond]]
      .map(([label, pick]) => el("div", { class: "card" }, el("div", { class: "label", text: label }),
        el("div", { class: `value${rate ? "" : " loading"}`, "data-rate": label, text: value(rate ? pick(rate) : 0) })));
  }

  // Publish a message to the queue, or fetch (pop, then complete) the next one: the same
  // POST /push, GET /pop and POST /ack a client makes.
  function testMessage(queueName, box, refresh) {
    const payload = el("textarea", { id: "test-payload", "aria-label": "Payload (JSON)", text: '{"test": true}' });
    const partition = el("input", { id: "test-partition", placeholder: "Default", "aria-label": "Partition" });
    const shown = el("div", { class: "fetched-box" });
    const publish = button("Publish", () => act(box, async () => {
      let value;
      try {
        value = JSON.parse(payload.value);
      } catch (e) {
        throw new Error(`The payload is not JSON: ${e.message}`);
      }
      const item = { queue: queueName, payload: value };
      if (partition.value.trim()) item.partition = partition.value.trim();
      const doc = await api("/api/v1/push", { method: "POST", body: { items: [item] } });
      const txid = doc.messages && doc.messages[0] && doc.messages[0].transactionId;
      shown.replaceChildren(el("p", { class: "hint" }, "Published ", txid ? Q.link(`#/message/${enc(txid)}`, txid, { class: "mono published" }) : ""));
    }, "Message published.", null), { id: "publish-test" });
    const fetchOne = button("Fetch one", () => act(box, async () => {
      const where = partition.value.trim() ? `/partition/${enc(partition.value.trim())}` : "";
      const doc = await api(`/api/v1/pop/queue/${enc(queueName)}${where}?${qs({ batch: 1, wait: "true", timeout: FETCH_WAIT_MS })}`);
      const m = doc && doc.messages && doc.messages[0];
      if (!m) {
        shown.replaceChildren(el("p", { class: "hint fetched-none", text: "No message is waiting." }));
        return;
      }
      const ack = { transactionId: m.transactionId, status: "completed" };
      if (m.leaseId) ack.leaseId = m.leaseId;
      await api("/api/v1/ack", { method: "POST", body: ack });
      shown.replaceChildren(
        el("p", { class: "hint" }, "Fetched and completed ", Q.link(`#/message/${enc(m.transactionId)}`, m.transactionId, { class: "mono fetched-id" })),
        el("pre", { class: "payload fetched", text: Q.pretty(m.data) }));
    }, "Fetched one message.", null), { id: "fetch-test" });
    return el("div", { class: "test-message" },
      el("label", {}, "Payload (JSON)", payload),
      el("div", { class: "controls" },
        el("label", {}, "Partition ", partition),
        Q.can("push") ? publish : null,
        Q.can("consume") ? fetchOne : null),
      el("p", { class: "hint", text: "Fetch pops the next message in queue mode (waiting up to 2 s) and completes it at once." }),
      shown);
  }

  function partitionsTable(queueName, partitions) {
    const sorted = [...partitions].sort((a, b) => (b.stats.pending - a.stats.pending) || a.name.localeCompare(b.name));
    const shown = sorted.slice(0, PARTITIONS_SHOWN);
    const rows = shown.map((p) => el("tr", { "data-partition": p.name },
      el("td", { class: "name" }, Q.link(`#/messages?${qs({ queue: queueName, partition: p.name })}`, p.name)),
      Q.numCell(p.stats.pending), Q.numCell(p.stats.processing, "busy"), Q.numCell(p.stats.completed),
      Q.numCell(p.stats.failed, "warn"), Q.numCell(p.stats.deadLetter, "warn"),
      el("td", { class: "num oldest-pending", title: p.oldestPending || "", text: Q.age(p.oldestPending) })));
    const out = [table([["Partition"], ["Pending", "num"], ["Processing", "num"], ["Completed", "num"],
      ["Failed", "num"], ["Dead letter", "num"], ["Oldest pending", "num"]], rows, "partitions")];
    if (sorted.length > shown.length) {
      out.push(el("p", { class: "hint", text: `The ${shown.length} partitions with most pending messages of ${Q.num(sorted.length)}.` }));
    }
    return out;
  }

  function optionsForm(queue, box, refresh) {
    const options = queue.options || {};
    const admin = Q.can("admin");
    const fields = Object.entries(options).map(([key, value]) => {
      const input = typeof value === "boolean"
        ? el("input", { type: "checkbox", name: key, checked: value, disabled: !admin })
        : el("input", { type: "number", name: key, value: String(value), min: "0", disabled: !admin });
      return el("label", { class: "option" }, el("span", { class: "option-name", text: key }), input,
        el("span", { class: "muted", text: OPTION_HELP[key] || "" }));
    });
    const form = el("form", { class: "options", id: "options-form" }, ...fields);
    if (admin) {
      form.append(el("div", { class: "form-actions" }, el("button", { type: "submit", id: "save-options" }, "Save options")));
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const changed = {};
        for (const input of form.querySelectorAll("input")) {
          changed[input.name] = input.type === "checkbox" ? input.checked : Number(input.value);
        }
        const body = { queue: queue.name, options: changed };
        if (queue.namespace) body.namespace = queue.namespace;
        if (queue.task) body.task = queue.task;
        act(box, () => api("/api/v1/configure", { method: "POST", body }), `Options of ${queue.name} saved.`, refresh);
      });
    }
    return form;
  }

  async function clearQueue(name, box, refresh) {
    if (!(await Q.confirm(`Delete every message of queue ${name}? This cannot be undone.`, "Clear queue"))) return;
    let count = 0;
    await act(box, async () => {
      count = (await api(`/api/v1/queues/${enc(name)}/clear`, { method: "DELETE" })).count;
    }, "", refresh);
    if (!box.querySelector(".error")) Q.notice(box, "ok", `Cleared ${Q.num(count)} messages from ${name}.`);
  }

  async function deleteQueue(name, box) {
    const question = `Delete queue ${name} with all its messages, partitions and consumer groups? This cannot be undone.`;
    if (!(await Q.confirm(question, "Delete queue"))) return;
    let deleted = false;
    await act(box, async () => {
      await api(`/api/v1/resources/queues/${enc(name)}`, { method: "DELETE" });
      deleted = true;
    }, "", null);
    if (deleted) location.hash = "#/"; // (the queue's page has nothing left to show)
  }

  // -- message browser ----------------------------------------------------------------

  async function queueNames() {
    try {
      const doc = await api("/api/v1/resources/queues");
      return (doc.queues || []).map((q) => q.name).sort();
    } catch (e) {
      return [];
    }
  }

  function filterBar(query, fields, onApply) {
    const form = el("form", { class: "filters", id: "filters" });
    for (const field of fields) form.append(field);
    form.append(el("button", { type: "submit" }, "Apply"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      onApply(Object.fromEntries(new FormData(form).entries()));
    });
    return form;
  }

  function select(name, values, current, label) {
    return el("label", {}, label,
      el("select", { name, "aria-label": label },
        values.map((v) => el("option", { value: v, text: v === "" ? "any" : v.replace("_", " "), selected: v === current }))));
  }

  function pager(offset, hasMore, go) {
    return el("div", { class: "pager" },
      button("← Newer", () => go(Math.max(0, offset - PAGE_SIZE)), { disabled: offset === 0, class: "prev" }),
      el("span", { class: "muted", text: ` ${Q.num(offset + 1)}… ` }),
      button("Older →", () => go(offset + PAGE_SIZE), { disabled: !hasMore, class: "next" }));
  }

  async function messagesPage(root, args, query) {
    const queue = query.get("queue") || "";
    const partition = query.get("partition") || "";
    const status = query.get("status") || "";
    const offset = Number(query.get("offset") || 0);
    const box = el("div", { class: "notices" });
    const list = el("div", {}, el("p", { class: "hint", text: "Loading…" }));
    const names = await queueNames();
    const go = (params) => (location.hash = `#/messages?${qs(params)}`);
    const filters = filterBar(query, [
      select("queue", ["", ...names], queue, "Queue "),
      el("label", {}, "Partition ", el("input", { name: "partition", value: partition, placeholder: "any", "aria-label": "Partition" })),
      select("status", STATUSES, status, "Status "),
    ], (f) => go({ ...f, offset: 0 }));
    root.replaceChildren(el("div", { class: "page-head" }, heading("Messages")), filters, box, list);
    let doc;
    try {
      doc = await api(`/api/v1/messages?${qs({ queue, partition, status, limit: PAGE_SIZE, offset })}`);
    } catch (e) {
      Q.notice(box, "error", e.message);
      list.replaceChildren();
      return;
    }
    const rows = (doc.messages || []).map((m) => el("tr", { "data-txid": m.transactionId },
      el("td", { class: "mono" }, Q.link(`#/message/${enc(m.transactionId)}`, m.transactionId)),
      el("td", {}, Q.link(Q.queueHref(m.queue), m.queue), el("span", { class: "muted", text: ` / ${m.partition}` })),
      el("td", {}, statusBadge(m.status)),
      Q.numCell(m.retryCount, "warn"),
      el("td", { text: Q.time(m.createdAt) }),
      el("td", { class: "error-text", text: m.errorMessage || "" })));
    list.replaceChildren(
      table([["Transaction"], ["Queue / partition"], ["Status"], ["Retries", "num"], ["Created"], ["Error"]], rows, "messages"),
      pager(offset, doc.hasMore, (o) => go({ queue, partition, status, offset: o })));
  }

  // -- message detail -----------------------------------------------------------------

  async function messagePage(root, [txid]) {
    const box = el("div", { class: "notices" });
    const body = el("div", {});
    root.replaceChildren(el("nav", { class: "crumbs" }, Q.link("#/messages", "Messages"), " / ", el("span", { class: "mono", text: txid })), box, body);
    const refresh = async () => {
      let m;
      try {
        m = await api(`/api/v1/messages/${enc(txid)}`);
      } catch (e) {
        Q.notice(box, "error", e.message);
        body.replaceChildren();
        return;
      }
      const facts = [
        ["Status", statusBadge(m.status)],
        ["Queue", Q.link(Q.queueHref(m.queue), m.queue)],
        ["Partition", m.partition],
        ["Retries", Q.num(m.retryCount)],
        ["Error", m.errorMessage || "–"],
        ["Created", Q.time(m.createdAt)],
        ["Locked", Q.time(m.lockedAt)],
        ["Lease expires", Q.time(m.leaseExpiresAt)],
        ["Completed", Q.time(m.completedAt)],
        ["Failed", Q.time(m.failedAt)],
        ["Worker", m.workerId || "–"],
        ["Producer", m.producer || "–"],
      ];
      const list = el("dl", { class: "facts" }, facts.map(([k, v]) => [el("dt", { text: k }), el("dd", { "data-fact": k }, v)]));
      body.replaceChildren(
        el("div", { class: "page-head" }, heading("Message"), messageActions(m, box, refresh)),
        panel(heading("Details"), list),
        panel(heading("Payload"), el("pre", { class: "payload", id: "payload", text: Q.pretty(m.payload) })));
    };
    await refresh();
  }

  function messageActions(m, box, refresh) {
    if (!Q.can("admin")) return el("div", { class: "controls" });
    const path = `/api/v1/messages/${enc(m.transactionId)}`;
    const controls = el("div", { class: "controls" });
    if (m.status === "failed" || m.status === "dead_letter") {
      controls.append(button("Retry", () => act(box, () => api(`${path}/retry`, { method: "POST" }), "Message queued again.", refresh), { id: "retry-message" }));
    }
    if (m.status !== "dead_letter") {
      controls.append(button("Move to dead letters", () => act(box, () => api(`${path}/dlq`, { method: "POST" }), "Message moved to the dead letters.", refresh), { id: "dlq-message" }));
    }
    controls.append(button("Delete…", async () => {
      if (!(await Q.confirm("Delete this message for good?", "Delete"))) return;
      act(box, () => api(path, { method: "DELETE" }), "Message deleted.", null);
    }, { class: "danger", id: "delete-message" }));
    return controls;
  }

  // -- dead letters -------------------------------------------------------------------

  async function deadLettersPage(root, args, query) {
    const queue = query.get("queue") || "";
    const offset = Number(query.get("offset") || 0);
    const box = el("div", { class: "notices" });
    const list = el("div", {}, el("p", { class: "hint", text: "Loading…" }));
    const names = await queueNames();
    const go = (params) => (location.hash = `#/dead-letters?${qs(params)}`);
    root.replaceChildren(
      el("div", { class: "page-head" }, heading("Dead letters")),
      filterBar(query, [select("queue", ["", ...names], queue, "Queue ")], (f) => go({ ...f, offset: 0 })),
      box, list);
    const refresh = async () => {
      let doc;
      try {
        doc = await api(`/api/v1/messages?${qs({ queue, status: "dead_letter", limit: PAGE_SIZE, offset })}`);
      } catch (e) {
        Q.notice(box, "error", e.message);
        return;
      }
      const messages = doc.messages || [];
      const admin = Q.can("admin");
      const retry = (m) => api(`/api/v1/messages/${enc(m.transactionId)}/retry`, { method: "POST" });
      const rows = messages.map((m) => {
        const tr = el("tr", { "data-txid": m.transactionId },
          el("td", { class: "mono" }, Q.link(`#/message/${enc(m.transactionId)}`, m.transactionId)),
          el("td", {}, Q.link(Q.queueHref(m.queue), m.queue), el("span", { class: "muted", text: ` / ${m.partition}` })),
          Q.numCell(m.retryCount, "warn"),
          el("td", { class: "error-text", text: m.errorMessage || "" }),
          el("td", { text: Q.time(m.failedAt || m.createdAt) }));
        if (admin) {
          tr.append(el("td", { class: "actions" },
            button("Retry", () => act(box, () => retry(m), `${m.transactionId} queued again.`, refresh), { class: "retry" }),
            button("Delete", async () => {
              if (!(await Q.confirm(`Delete dead letter ${m.transactionId}?`, "Delete"))) return;
              act(box, () => api(`/api/v1/messages/${enc(m.transactionId)}`, { method: "DELETE" }), `${m.transactionId} deleted.`, refresh);
            }, { class: "danger delete" })));
        }
        return tr;
      });
      const headers = [["Transaction"], ["Queue / partition"], ["Retries", "num"], ["Error"], ["Failed"]];
      if (admin) headers.push(["Actions", "actions"]);
      const bulk = admin && messages.length
        ? button(`Retry all ${messages.length} shown`, async () => {
          if (!(await Q.confirm(`Queue all ${messages.length} dead letters shown here again?`, "Retry all"))) return;
          act(box, async () => {
            const results = await Promise.allSettled(messages.map(retry));
            const failed = results.filter((r) => r.status === "rejected");
            if (!failed.length) return;
            await refresh(); // the others were retried: the list shown is no longer the server's
            throw new Error(`${failed.length} of ${messages.length} could not be retried: ${failed[0].reason.message}`);
          }, `${messages.length} dead letters queued again.`, refresh);
        }, { id: "retry-all" })
        : null;
      list.replaceChildren(
        el("div", { class: "controls" }, bulk),
        table(headers, rows, "dead-letters"),
        pager(offset, doc.hasMore, (o) => go({ queue, offset: o })));
    };
    await refresh();
  }

  // -- consumer groups ----------------------------------------------------------------

  // Counts are those of the last load: Refresh asks again (the table is not redrawn by
  // itself, which would lose a seek time being typed).
  async function groupsPage(root) {
    const box = el("div", { class: "notices" });
    const list = el("div", {}, el("p", { class: "hint", text: "Loading…" }));
    const again = button("Refresh", () => refresh(), { id: "refresh-groups" });
    root.replaceChildren(el("div", { class: "page-head" }, heading("Consumer groups"), el("div", { class: "controls" }, again)), box, list);
    const refresh = async () => {
      try {
        list.replaceChildren(groupsTable(await consumerGroups(null), box, refresh));
      } catch (e) {
        list.replaceChildren(unavailable(e));
      }
    };
    await refresh();
  }

  Q.pages = {
    queue: queuePage,
    messages: messagesPage,
    message: messagePage,
    "dead-letters": deadLettersPage,
    groups: groupsPage,
  };
})();
