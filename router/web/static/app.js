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
// Where a node takes its users and rules from, as its telemetry says (the Users & ACL page).
const AUTH_WORDS = {
  redis: "Redis", files: "password or ACL file", emqx: "EMQX's records", jwt: "JWT only",
  none: "no users or rules",
};
// The Users & ACL page's lists carry who enforces them; null for an answer without.
function enforcementOf(answer) {
  if (!answer || !Array.isArray(answer.enforced_by)) return null;
  return {
    enforced_by: answer.enforced_by,
    not_enforced_by: answer.not_enforced_by || [],
    unknown: answer.unknown || [],
  };
}

/** The overview's drop reasons (the nodes' counters) in words. */
const DROP_REASONS = {
  queue_drops: "A connected client's queue in memory was full",
  session_queue_drops: "An away session's queue in Redis was full",
  offline_qos0_skipped: "QoS 0 for an away session (not kept)",
  expired_dropped: "Expired in an away session's queue",
  mqtt_expired_dropped: "Expired before its client took it",
  mqtt_oversized_dropped: "Larger than its client's Maximum Packet Size",
  undeliverable: "A share group with no member left",
  unrouted: "Published where no one subscribes (not in Dropped /s)",
  acl_denied_deliveries: "Kept from a subscriber by the ACL (not in Dropped /s)",
};

/** A client's drop reasons (GET /clients/ID figures.drops) in words. */
const CLIENT_DROPS = {
  queue_full: "its queue in memory was full",
  expired: "expired before it took them",
  oversized: "larger than its Maximum Packet Size",
  session_queue_full: "its Redis queue was full while away",
  offline_qos0: "QoS 0 while away (not kept)",
};

/** Bytes in words: "512 B", "1.5 KiB", "3.2 MiB". */
function bytesText(n) {
  if (n === null || n === undefined) return "-";
  if (n >= 1048576) return `${(n / 1048576).toFixed(1)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${n} B`;
}

document.addEventListener("alpine:init", () => {
  Alpine.store("session", {
    known: false, user: null, role: null, csrf: null,
    set(me) { this.known = true; this.user = me.user; this.role = me.role; this.csrf = me.csrf; },
    forget() { this.known = false; this.user = null; this.role = null; this.csrf = null; },
  });

  Alpine.store("notice", { error: "", errorType: "", info: "" });

  Alpine.store("route", {
    page: "loading",
    arg: null,
    after: null,   // where to go back to after logging in
    pages: ["overview", "nodes", "clients", "subscriptions", "retained", "bans", "users", "publish", "traces"],
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
      { page: "traces", label: "Traces" },
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
      slow: null,
      busiest: [],
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
          const [overview, nodes, events, slow, busiest] = await Promise.all([
            api("GET", "/overview"), api("GET", "/nodes"), api("GET", "/events?limit=10"),
            api("GET", "/slow-subscribers?limit=10"), api("GET", "/busiest-filters?limit=10"),
          ]);
          if (!shown) return;
          this.data = overview;
          this.nodes = nodes.items || [];
          this.events = events.items || [];
          this.slow = slow;
          this.busiest = busiest.items || [];
          this.draw(overview.history);
        } catch (err) {
          report(err);
        }
      },
      rate(name) { return this.data && this.data.rates ? fmt.num(this.data.rates[name]) : "-"; },
      /** The drop reasons that dropped anything, in words, busiest now first. */
      dropRows() {
        const drops = (this.data && this.data.drops) || {};
        return Object.entries(drops)
          .filter(([, d]) => d.total > 0 || d.per_s > 0)
          .map(([reason, d]) => ({ reason, label: DROP_REASONS[reason] || reason, ...d }))
          .sort((a, b) => b.per_s - a.per_s || b.total - a.total);
      },
      /** The clients with most queued, then those that dropped most, each once. */
      slowRows() {
        const s = this.slow || {};
        const rows = new Map();
        for (const c of [...(s.by_queue || []), ...(s.by_drops || [])]) rows.set(c.client_id, c);
        return [...rows.values()];
      },
      clientHref(id) { return `#/clients/${encodeURIComponent(id)}`; },
      bytesText(n) { return bytesText(n); },
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
    /** The session in words: one state, one user, one "queued", times in local time. */
    sessionPairs() {
      const d = this.detail;
      if (!d) return [];
      const node = d.node_alive ? d.node : `${d.node} (not alive)`;
      const since = d.state === "connected" ? "Connected since" : "Away since";
      const expiry = d.expiry === 0 ? "ends with its connection"
        : d.expires_in === "never" ? "never expires"
        : d.expires_in === null ? `${fmt.duration(d.expiry)} after it leaves`
        : `ends in ${fmt.duration(d.expires_in)}`;
      return [
        ["State", `${d.state} on node ${node}`],
        ["User", d.username ?? d.user ?? "none"],
        ["Protocol", d.protocol === "api" ? "embedding API" : `MQTT ${d.protocol}`],
        [since, fmt.ms_time(d.since_ms)],
        ["Keep alive", d.keepalive ? `${d.keepalive} s` : "none"],
        ["Subscriptions", fmt.int(d.subscriptions)],
        ["Queued", this.queuedText()],
        ["Session", expiry],
      ];
    },
    /** "12 messages (10 in memory on n1, 2 in its Redis queue)". */
    queuedText() {
      const d = this.detail;
      const memory = d.queued_memory === null || d.queued_memory === undefined
        ? "memory unknown" : `${fmt.int(d.queued_memory)} in memory on ${d.node}`;
      return `${fmt.int(d.queued)} messages (${memory}, ${fmt.int(d.queued_redis)} in its Redis queue)`;
    },
    /** The client's figures as rows of words. */
    figurePairs() {
      const f = this.detail && this.detail.figures;
      if (!f) return [];
      const rows = [
        ["Messages in (published by it)", `${fmt.int(f.messages_in)} (${bytesText(f.bytes_in)})`],
        ["Messages out (delivered to it)", `${fmt.int(f.messages_out)} (${bytesText(f.bytes_out)})`],
        ["Queued in memory", `${fmt.int(f.queued_memory)} (${bytesText(f.queued_memory_bytes)})`],
        ["In flight (not acknowledged)", fmt.int(f.inflight)],
        ["Dropped", fmt.int(f.dropped)],
      ];
      for (const [reason, n] of Object.entries(f.drops || {})) {
        if (n > 0) rows.push([`  dropped: ${CLIENT_DROPS[reason] || reason}`, fmt.int(n)]);
      }
      rows.push(["Takeovers of its id", fmt.int(f.takeovers)]);
      rows.push(["Last activity", f.last_activity_ms ? fmt.ms_time(f.last_activity_ms) : "never"]);
      return rows;
    },
    retainHandling(n) {
      return ["sent", "sent if new", "not sent"][n] ?? String(n);
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
    topic: "", matched: null, matchError: "", matchErrorType: "",
    path() { return `/subscriptions${query(this.filters)}`; },
    /** A share group's members by node ("n1: 2, n2: 1"); nothing for a plain filter. */
    membersText(route) {
      if (!route.members) return "";
      return Object.entries(route.members).map(([node, n]) => `${node}: ${n}`).join(", ");
    },
    /** A node's matching plain filters (its share groups are shown as groups). */
    plainFilters(node) {
      const filters = (this.matched && this.matched.filters && this.matched.filters[node]) || [];
      return filters.filter((f) => !f.startsWith("$share/"));
    },
    /** A node's subscribers that get every message: "id (QoS 1)", "id (QoS 0, away)". */
    receiversText(node) {
      const m = this.matched;
      const found = (m && m.receivers && m.receivers[node]) || [];
      if (!found.length) return "none";
      const words = found.map((r) => `${r.client_id} (QoS ${r.qos}${r.connected ? "" : ", away"})`);
      const more = ((m.receiver_counts && m.receiver_counts[node]) || 0) - found.length;
      return words.join(", ") + (more > 0 ? ` and ${more} more` : "");
    },
    /** How a share group delivers: one of its members for each message. */
    groupText(g) {
      const n = g.member_count;
      return n === 1 ? "each message goes to its one member"
        : `each message goes to one of its ${n} members (which one is chosen as it is published)`;
    },
    /** A group's members on one node: "c1, c2"; or their number when none was read. */
    membersOf(g, node) {
      const ids = (g.members && g.members[node]) || [];
      const count = g.nodes[node] || 0;
      const label = `${count} member${count === 1 ? "" : "s"}`;
      if (!ids.length) return label;
      const more = count - ids.length;
      return `${label}: ${ids.join(", ")}${more > 0 ? ` and ${more} more` : ""}`;
    },
    async match() {
      this.matchError = "";
      this.matchErrorType = "";
      try {
        this.matched = await api("GET", `/match${query({ topic: this.topic })}`);
      } catch (err) {
        this.matched = null;
        this.matchError = describe(err);
        this.matchErrorType = errorType(err);
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

  /** Traces: start one, pick one, read what the nodes saw as it comes (polled). */
  Alpine.data("tracesPage", () => {
    let timer = null;
    return {
      form: { kind: "client", value: "", seconds: 60 },
      traces: [], chosen: null, records: [],
      init() {
        this.load();
        timer = setInterval(() => { if (!document.hidden) this.poll(); }, POLL_MS);
      },
      destroy() { clearInterval(timer); },
      async load() {
        try {
          this.traces = (await api("GET", "/traces")).items || [];
        } catch (err) {
          report(err);
        }
      },
      async start() {
        try {
          const body = { kind: this.form.kind, value: this.form.value, seconds: Number(this.form.seconds) };
          const spec = await api("POST", "/traces", body);
          this.form.value = "";
          await this.load();
          await this.show(spec.id);
        } catch (err) {
          report(err);
        }
      },
      async show(id) {
        this.chosen = id;
        this.records = [];
        await this.poll();
      },
      async poll() {
        if (!this.chosen) return;
        try {
          const last = this.records.length ? this.records[this.records.length - 1].id : "";
          const query = last ? `?after=${encodeURIComponent(last)}` : "";
          const found = await api("GET", `/traces/${encodeURIComponent(this.chosen)}${query}`);
          this.records = this.records.concat(found.items || []).slice(-2000);
        } catch (err) {
          report(err);
        }
      },
      stop(spec) {
        return confirmed(`Stop the trace of ${spec.kind} ${spec.value}?`, async () => {
          await api("DELETE", `/traces/${encodeURIComponent(spec.id)}`);
          await this.load();
        });
      },
    };
  });

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
    enforcement: null,  // {enforced_by, not_enforced_by, unknown} of the last list read
    init() { this.load(); this.loadRules(); },
    path() { return "/users"; },
    async load() {
      try {
        const answer = await api("GET", "/users");
        this.items = answer.items || [];
        this.next = answer.next || null;
        this.enforcement = enforcementOf(answer);
        this.loaded = true;
      } catch (err) {
        report(err);
      }
    },
    async loadRules() {
      try {
        const answer = await api("GET", "/acl");
        this.rules = answer.rules || [];
        this.enforcement = enforcementOf(answer) || this.enforcement;
      } catch (err) {
        report(err);
      }
    },
    /** No live node says it enforces these users and rules. */
    unenforced() {
      const e = this.enforcement;
      return Boolean(e && e.enforced_by.length === 0);
    },
    /** The nodes that do not enforce them, in words: "n1 (no source), n2 (files)". */
    notEnforcedText() {
      const e = this.enforcement;
      if (!e) return "";
      const named = e.not_enforced_by.map((n) => `${n.node_id} (${AUTH_WORDS[n.auth] || n.auth})`);
      return fmt.list([...named, ...e.unknown.map((id) => `${id} (did not say)`)]);
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
    busy: false, result: "", error: "", errorType: "",
    async send() {
      this.busy = true;
      this.result = "";
      this.error = "";
      this.errorType = "";
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
        this.errorType = errorType(err);
      } finally {
        this.busy = false;
      }
    },
  }));
});
