/*
 * The dashboard's pages: the stores (session, route, notices, the confirmation dialog),
 * the hash router and one Alpine component per page (index.html draws them; lib.js
 * holds what they share).
 *
 * - routes are "#/<page>" and "#/clients/<url-encoded client id>"; an unknown one is the
 *   overview, and any page before logging in is the login page;
 * - a page polls only while shown (its component's destroy() stops the timer).
 */
"use strict";

const POLL_MS = 2000;        // the overview (the docs promise a 2 s refresh)
const NODES_POLL_MS = 5000;  // the nodes page
// Headings of the parts of a client's detail (GET /clients/{id}); others show their key.
const SECTION_TITLES = {
  filters: "Subscriptions",
  connection: "Connection (on this node)",
  awaiting_release: "QoS 2 packets awaiting PUBREL",
};

document.addEventListener("alpine:init", () => {
  Alpine.store("session", {
    known: false, user: null, role: null, csrf: null,
    set(me) { this.known = true; this.user = me.user; this.role = me.role; this.csrf = me.csrf; },
    forget() { this.known = false; this.user = null; this.role = null; this.csrf = null; },
  });

  Alpine.store("notice", { error: "", info: "" });

  Alpine.store("route", {
    page: "loading",
    arg: null,
    after: null,   // where to go back to after logging in
    pages: ["overview", "nodes", "clients", "subscriptions", "retained", "bans", "users", "publish"],
    /** Read location.hash into page/arg; a new page starts without the last one's error. */
    read() {
      const [, name, ...rest] = (location.hash || "#/overview").split("/");
      let page = this.pages.includes(name) || name === "login" ? name : "overview";
      let arg = null;
      if (name === "clients" && rest.length && rest[0] !== "") {
        page = "client";
        arg = decodeURIComponent(rest.join("/"));
      }
      if (page !== this.page || arg !== this.arg) Alpine.store("notice").error = "";
      this.page = page;
      this.arg = arg;
    },
    toLogin() {
      if (this.page !== "login") this.after = location.hash;
      if (location.hash !== "#/login") location.hash = "#/login";
      this.page = "login";
    },
  });

  Alpine.store("confirm", {
    open: false, text: "", resolve: null,
    /** Show the dialog; resolves to true (Confirm) or false (Cancel, Escape). */
    ask(text) {
      this.text = text;
      this.open = true;
      return new Promise((resolve) => { this.resolve = resolve; });
    },
    answer(yes) {
      if (!this.open) return;
      this.open = false;
      const resolve = this.resolve;
      this.resolve = null;
      if (resolve) resolve(yes);
    },
  });

  Alpine.data("shell", () => ({
    navOpen: false,
    links: [
      { page: "overview", label: "Overview" }, { page: "nodes", label: "Nodes" },
      { page: "clients", label: "Clients" }, { page: "subscriptions", label: "Subscriptions" },
      { page: "retained", label: "Retained" }, { page: "bans", label: "Bans" },
      { page: "users", label: "Users & ACL" }, { page: "publish", label: "Publish" },
    ],
    async init() {
      const route = Alpine.store("route");
      window.addEventListener("hashchange", () => {
        if (location.hash !== "#/login" && !Alpine.store("session").known) {
          route.toLogin();
        } else {
          route.read();
        }
      });
      try {
        Alpine.store("session").set(await api("GET", "/me"));
        route.read();
        if (route.page === "login") location.hash = "#/overview";
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 401)) {
          report(err);
          route.toLogin();
        }
      }
    },
    isActive(page) {
      const current = Alpine.store("route").page;
      return current === page || (page === "clients" && current === "client");
    },
    whoText() {
      const s = Alpine.store("session");
      return s.user ? `${s.user} (${s.role})` : `${s.role} (no accounts yet: loopback access)`;
    },
    async logout() {
      try {
        await api("POST", "/logout");
      } catch (err) {
        report(err);
      }
      Alpine.store("session").forget();
      Alpine.store("route").toLogin();
    },
  }));

  Alpine.data("loginPage", () => ({
    user: "", password: "", error: "", busy: false,
    async submit() {
      this.busy = true;
      this.error = "";
      try {
        Alpine.store("session").set(await api("POST", "/login", { user: this.user, password: this.password }));
        this.password = "";
        const route = Alpine.store("route");
        const back = route.after && route.after !== "#/login" ? route.after : "#/overview";
        route.after = null;
        location.hash = back;
        route.read();
      } catch (err) {
        this.error = err instanceof ApiError ? err.message : describe(err);
      } finally {
        this.busy = false;
      }
    },
  }));

  Alpine.data("overviewPage", () => {
    let chart = null;       // the uPlot instance: kept out of Alpine's reactive proxies
    let timer = null;
    let resize = null;
    let shown = true;       // false once the page is left (an answer may still arrive)
    return {
      data: null,
      nodes: [],
      events: [],
      counts: [
        ["connections", "Connections"], ["sessions", "Sessions"], ["subscriptions", "Subscriptions"],
        ["routes", "Routes"], ["topics", "Topics"], ["retained", "Retained"],
      ],
      init() {
        this.refresh();
        timer = setInterval(() => { if (!document.hidden) this.refresh(); }, POLL_MS);
        resize = () => { if (chart) chart.setSize(this.chartSize()); };
        window.addEventListener("resize", resize);
      },
      destroy() {
        shown = false;
        clearInterval(timer);
        window.removeEventListener("resize", resize);
        if (chart) chart.destroy();
        chart = null;
      },
      async refresh() {
        try {
          const [overview, nodes, events] = await Promise.all([
            api("GET", "/overview"), api("GET", "/nodes"), api("GET", "/events?limit=10"),
          ]);
          if (!shown) return;
          this.data = overview;
          this.nodes = nodes.items || [];
          this.events = events.items || [];
          this.draw(overview.history);
        } catch (err) {
          report(err);
        }
      },
      rate(name) { return this.data && this.data.rates ? fmt.num(this.data.rates[name]) : "-"; },
      count(name) { return this.data ? fmt.int(this.data[name]) : "-"; },
      nodesText() {
        const n = this.data && this.data.nodes;
        return n ? `${n.alive} / ${n.total}` : "-";
      },
      hasHistory() {
        const h = this.data && this.data.history;
        return Boolean(h && h.t && h.t.length > 1);
      },
      chartSize() {
        return { width: Math.max(240, this.$refs.chart.clientWidth), height: 220 };
      },
      /** Draw the last hour: t in Unix seconds (uPlot's unit for time scales). */
      draw(history) {
        if (!history || !history.t || history.t.length < 2) return;
        const data = [history.t, history.in, history.out, history.dropped];
        if (chart) { chart.setData(data); return; }
        chart = new uPlot({
          ...this.chartSize(),
          series: [
            {},
            { label: "in /s", stroke: "#2a9d8f", width: 2 },
            { label: "out /s", stroke: "#3a6ea5", width: 2 },
            { label: "dropped /s", stroke: "#d1495b", width: 2 },
          ],
          axes: [{ incrs: TIME_STEPS, values: timeLabels }, { size: 60 }],
          scales: { x: { time: true } },
        }, data, this.$refs.chart);
      },
    };
  });

  Alpine.data("nodesPage", () => {
    let timer = null;
    return {
      items: [],
      init() {
        this.load();
        timer = setInterval(() => { if (!document.hidden) this.load(); }, NODES_POLL_MS);
      },
      destroy() { clearInterval(timer); },
      async load() {
        try {
          this.items = (await api("GET", "/nodes")).items || [];
        } catch (err) {
          report(err);
        }
      },
    };
  });

  Alpine.data("clientsPage", () => pagedList({
    filters: { prefix: "", user: "", node: "", state: "", protocol: "" },
    nodeIds: [],
    init() {
      this.load();
      api("GET", "/nodes").then((answer) => {
        this.nodeIds = (answer.items || []).map((n) => n.node_id);
      }, () => {});
    },
    path() { return `/clients${query(this.filters)}`; },
    clientHref(id) { return `#/clients/${encodeURIComponent(id)}`; },
    open(client) { location.hash = this.clientHref(client.client_id); },
  }));

  Alpine.data("clientPage", () => ({
    id: "", detail: null, missing: false, result: "",
    init() {
      this.show(Alpine.store("route").arg);
      this.$watch("$store.route.arg", (id) => { if (id !== null) this.show(id); });
    },
    show(id) {
      this.id = id;
      this.result = "";
      return this.load();
    },
    async load() {
      try {
        this.detail = await api("GET", `/clients/${encodeURIComponent(this.id)}`);
        this.missing = false;
      } catch (err) {
        this.detail = null;
        if (err instanceof ApiError && err.status === 404) this.missing = true;
        else report(err);
      }
    },
    /** The detail's plain fields (strings, numbers, booleans, null). */
    scalars(detail) {
      return Object.entries(detail).filter(([k, v]) => k !== "connection" && (v === null || typeof v !== "object"));
    },
    /** The detail's lists and objects, each drawn as a card of its own. */
    sections(detail) {
      return Object.entries(detail).filter(([, v]) => v !== null && typeof v === "object");
    },
    title(name) { return SECTION_TITLES[name] || name; },
    /** Connected to another node: its connection's figures are that node's to show. */
    elsewhere() {
      const d = this.detail;
      return Boolean(d && d.state === "connected" && !d.connection);
    },
    /** The columns of a list: the keys of its objects, or "value" for plain items. */
    columns(rows) {
      const keys = new Set();
      for (const row of rows) {
        if (row !== null && typeof row === "object" && !Array.isArray(row)) {
          Object.keys(row).forEach((k) => keys.add(k));
        } else {
          keys.add("value");
        }
      }
      return [...keys];
    },
    cellOf(row, col) {
      return row !== null && typeof row === "object" && !Array.isArray(row) ? row[col] : row;
    },
    kick() {
      return confirmed(`Disconnect client ${this.id}?`, async () => {
        const answer = await api("POST", `/clients/${encodeURIComponent(this.id)}/kick`);
        this.result = answer.kicked ? `Kicked from node ${answer.node}.` : "It was not connected.";
        await this.load();
      });
    },
    clearSession() {
      return confirmed(`Clear the session of ${this.id} (its subscriptions and queued messages)?`, async () => {
        const answer = await api("DELETE", `/clients/${encodeURIComponent(this.id)}/session`);
        this.result = answer.cleared ? "Session cleared." : "There was no session to clear.";
        await this.load();
      });
    },
  }));

  Alpine.data("subscriptionsPage", () => pagedList({
    filters: { filter: "", node: "" },
    topic: "", matched: null, matchError: "",
    path() { return `/subscriptions${query(this.filters)}`; },
    /** A share group's members by node ("n1: 2, n2: 1"); nothing for a plain filter. */
    membersText(route) {
      if (!route.members) return "";
      return Object.entries(route.members).map(([node, n]) => `${node}: ${n}`).join(", ");
    },
    /** The matched clients as [node, ids] pairs (the API answers them by node). */
    clientsByNode() {
      const clients = this.matched && this.matched.clients;
      if (Array.isArray(clients)) return [["clients", clients]];
      return Object.entries(clients || {});
    },
    async match() {
      this.matchError = "";
      try {
        this.matched = await api("GET", `/match${query({ topic: this.topic })}`);
      } catch (err) {
        this.matched = null;
        this.matchError = describe(err);
      }
    },
  }));

  Alpine.data("retainedPage", () => pagedList({
    filters: { filter: "#" },
    path() { return `/retained${query(this.filters)}`; },
    payloadText(m) { return m.encoding === "base64" ? `base64: ${m.payload}` : m.payload; },
    remove(topic) {
      return confirmed(`Delete the retained message of ${topic}?`, async () => {
        await api("DELETE", `/retained${query({ filter: topic })}`);
        await this.load();
      });
    },
    removeMatching() {
      const filter = this.filters.filter;
      return confirmed(`Delete every retained message matching ${filter}?`, async () => {
        const answer = await api("DELETE", `/retained${query({ filter })}`);
        Alpine.store("notice").info = `Deleted ${answer.deleted} retained message(s).`;
        await this.search();
      });
    },
  }));

  Alpine.data("bansPage", () => pagedList({
    form: { kind: "client", value: "", seconds: "", reason: "" },
    path() { return "/bans"; },
    /** When a ban ends: `until` in Unix seconds, 0 or null for never. */
    banEnd(ban) {
      const until = ban.until ?? ban.expires_at;
      return until ? fmt.time(until) : "never";
    },
    async add() {
      const body = { kind: this.form.kind, value: this.form.value, reason: this.form.reason };
      if (this.form.seconds !== "" && this.form.seconds !== null) body.seconds = Number(this.form.seconds);
      try {
        await api("POST", "/bans", body);
        this.form.value = "";
        this.form.reason = "";
        await this.search();
      } catch (err) {
        report(err);
      }
    },
    remove(ban) {
      return confirmed(`Lift the ban of ${ban.kind} ${ban.value}?`, async () => {
        const path = `/bans/${encodeURIComponent(ban.kind)}/${encodeURIComponent(ban.value)}`;
        await api("DELETE", path);
        await this.load();
      });
    },
  }));

  Alpine.data("usersPage", () => pagedList({
    form: { name: "", password: "", superuser: false },
    passwordFor: null, newPassword: "",
    rules: [], rule: "", position: "",
    init() { this.load(); this.loadRules(); },
    path() { return "/users"; },
    async loadRules() {
      try {
        this.rules = (await api("GET", "/acl")).rules || [];
      } catch (err) {
        report(err);
      }
    },
    async add() {
      try {
        await api("POST", "/users", { ...this.form });
        this.form = { name: "", password: "", superuser: false };
        await this.search();
      } catch (err) {
        report(err);
      }
    },
    async setPassword(name) {
      try {
        await api("PUT", `/users/${encodeURIComponent(name)}/password`, { password: this.newPassword });
        Alpine.store("notice").info = `The password of ${name} is changed.`;
        this.passwordFor = null;
        this.newPassword = "";
      } catch (err) {
        report(err);
      }
    },
    remove(name) {
      return confirmed(`Remove the MQTT user ${name}?`, async () => {
        await api("DELETE", `/users/${encodeURIComponent(name)}`);
        await this.load();
      });
    },
    async addRule() {
      const body = { rule: this.rule };
      if (this.position !== "" && this.position !== null) body.position = Number(this.position);
      try {
        await api("POST", "/acl", body);
        this.rule = "";
        this.position = "";
        await this.loadRules();
      } catch (err) {
        report(err);
      }
    },
    removeRule(rule) {
      return confirmed(`Remove the rule "${rule}"?`, async () => {
        await api("DELETE", "/acl", { rule });
        await this.loadRules();
      });
    },
  }));

  Alpine.data("publishPage", () => ({
    topic: "", payload: "", encoding: "utf-8", qos: 0, retain: false,
    busy: false, result: "", error: "",
    async send() {
      this.busy = true;
      this.result = "";
      this.error = "";
      try {
        const answer = await api("POST", "/publish", {
          topic: this.topic, payload: this.payload, encoding: this.encoding,
          qos: Number(this.qos), retain: this.retain,
        });
        const nodes = answer.nodes || [];
        this.result = nodes.length ? `Published (id ${answer.id}) to ${fmt.list(nodes)}.`
          : `Published (id ${answer.id}); no node has a subscriber for it.`;
      } catch (err) {
        this.error = describe(err);
      } finally {
        this.busy = false;
      }
    },
  }));
});
