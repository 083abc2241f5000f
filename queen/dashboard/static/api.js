// Queen dashboard: what every page shares (HTTP calls with the token, the token's role,
// DOM helpers, formatting, a confirmation dialog). Plain browser JavaScript, no build step.
(() => {
  "use strict";

  const TOKEN_KEY = "queen.token"; // sessionStorage, or localStorage when remembered
  const fmt = new Intl.NumberFormat();

  const Q = {
    me: { auth: false, role: "admin", permissions: ["admin", "consume", "push", "read"] },
    onUnauthorized: null, // set by app.js: shows the sign-in form
  };

  Q.token = () => sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY);
  Q.saveToken = (value, remember) => (remember ? localStorage : sessionStorage).setItem(TOKEN_KEY, value);
  Q.forgetToken = () => {
    sessionStorage.removeItem(TOKEN_KEY);
    localStorage.removeItem(TOKEN_KEY);
  };
  Q.authHeaders = () => (Q.token() ? { Authorization: `Bearer ${Q.token()}` } : {});

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }
  Q.ApiError = ApiError;

  // Call the API; resolve with the JSON body (null for 204), reject with ApiError carrying
  // the server's {"error": ...} message.
  Q.api = async (path, { method = "GET", body } = {}) => {
    const headers = { ...Q.authHeaders() };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    if (resp.status === 204) return null;
    let doc = null;
    try {
      doc = await resp.json();
    } catch (e) {
      doc = null;
    }
    if (resp.status === 401 && Q.onUnauthorized) Q.onUnauthorized((doc && doc.error) || "This server needs an API token.");
    if (!resp.ok) throw new ApiError(resp.status, (doc && doc.error) || `${resp.status} ${resp.statusText}`);
    return doc;
  };

  // Learn what the token may do, so pages show only the actions it can take.
  Q.loadMe = async () => {
    try {
      Q.me = await Q.api("/api/v1/auth/me");
    } catch (e) {
      // keep the last answer; a refused token is handled by onUnauthorized
    }
    document.body.dataset.role = Q.me.role;
    return Q.me;
  };
  Q.can = (permission) => (Q.me.permissions || []).includes(permission);

  // -- DOM ----------------------------------------------------------------------------

  // el("td", {class: "num", text: "3"}, child, ...): attributes, then children.
  Q.el = (tag, attrs = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child == null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  };

  Q.num = (n) => (n == null ? "–" : fmt.format(n));
  // Messages per second: small rates keep three significant digits instead of showing 0.
  Q.rate = (perSecond) =>
    perSecond < 1 ? perSecond.toLocaleString(undefined, { maximumSignificantDigits: 3 }) : perSecond.toLocaleString(undefined, { maximumFractionDigits: 2 });
  Q.numCell = (value, alert) =>
    Q.el("td", { class: `num${value === 0 ? " zero" : value > 0 && alert ? ` ${alert}` : ""}`, text: Q.num(value) });

  Q.time = (iso) => {
    if (!iso) return "–";
    const t = new Date(iso);
    return `${t.toLocaleDateString()} ${t.toTimeString().slice(0, 8)}`;
  };

  Q.duration = (seconds) => {
    if (seconds == null) return "–";
    const s = Math.max(0, seconds);
    if (s < 60) return `${Math.round(s)}s`;
    if (s < 3600) return `${Math.round(s / 60)}m`;
    if (s < 86400) return `${(s / 3600).toFixed(1)}h`;
    return `${(s / 86400).toFixed(1)}d`;
  };

  Q.age = (iso) => (iso ? Q.duration((Date.now() - new Date(iso).getTime()) / 1000) : "–");

  Q.pretty = (value) => {
    if (typeof value === "string") {
      try {
        return JSON.stringify(JSON.parse(value), null, 2);
      } catch (e) {
        return value;
      }
    }
    return JSON.stringify(value, null, 2);
  };

  Q.link = (href, text, attrs = {}) => Q.el("a", { href, text, ...attrs });
  Q.queueHref = (name) => `#/queue/${encodeURIComponent(name)}`;

  // A notice line at the top of a page: kind "error" | "ok" | "info".
  Q.notice = (target, kind, text) => {
    target.replaceChildren(text ? Q.el("p", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status", text }) : "");
  };

  // Ask before a destructive action; resolve true when confirmed.
  Q.confirm = (question, action = "Confirm") =>
    new Promise((resolve) => {
      const dialog = document.getElementById("confirm");
      document.getElementById("confirm-text").textContent = question;
      const yes = document.getElementById("confirm-yes");
      yes.textContent = action;
      const done = (answer) => {
        dialog.close();
        yes.onclick = null;
        document.getElementById("confirm-no").onclick = null;
        resolve(answer);
      };
      yes.onclick = () => done(true);
      document.getElementById("confirm-no").onclick = () => done(false);
      dialog.showModal();
    });

  window.Queen = Q;
})();
