/*
 * What the dashboard's pages share (app.js uses it; index.html loads it first): the one
 * request helper and its errors, query strings, the formatting of figures, the chart's
 * time axis, paged lists and the confirmation before an action. Plain script, no build
 * step: Alpine.js and uPlot come from /static/vendor/ and are globals.
 *
 * Contracts kept here:
 * - every request goes through api(): same-origin credentials, JSON in and out, the
 *   login's CSRF token in X-CSRF-Token on anything but GET; a 401 shows the login page
 *   (and comes back to the page after logging in); an error answer {"error","message"}
 *   becomes an ApiError whose message is shown to the user in words (describe()), its
 *   type kept for a title attribute (errorType());
 * - a paged list follows the API's cursors: {"items", "next"}, next null on the last page.
 */
"use strict";

const API = "/api/v1";
const PAGE_SIZE = 50;

class ApiError extends Error {
  /** An answer that was not 2xx: its status, the router's error type and its message. */
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

/**
 * Turn an error into the one line shown to the user: the router's message as a sentence
 * ("No client 'x'."), never its exception type (errorType() gives that, for a title).
 */
function describe(err) {
  if (err instanceof ApiError) return sentence(err.message);
  return `The node did not answer (${err && err.message ? err.message : err}).`;
}

/** The router's error type of an answer ("ClientNotFoundError"); "" for any other error. */
function errorType(err) {
  return err instanceof ApiError ? err.kind : "";
}

/** A message as a sentence: a leading lowercase word capitalized (not a topic or an id
 * such as "dash/+"), a full stop added when it ends without one. */
function sentence(message) {
  let text = String(message || "").trim();
  if (!text) return "The request failed.";
  if (/^[a-z]+(\s|,|$)/.test(text)) text = text[0].toUpperCase() + text.slice(1);
  return /[.!?)]$/.test(text) ? text : `${text}.`;
}

/**
 * Call the API: method, path under /api/v1 (with its query), optional JSON body.
 * Resolves to the parsed answer (null for an empty one); rejects with an ApiError.
 * A 401 (but the login's own) forgets the session and shows the login page.
 */
async function api(method, path, body) {
  const session = Alpine.store("session");
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  const answer = await fetch(API + path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await answer.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch (_) { data = null; }
  }
  if (answer.status === 401 && path !== "/login") {
    session.forget();
    Alpine.store("route").toLogin();
  }
  if (!answer.ok) {
    const kind = (data && data.error) || `HTTP ${answer.status}`;
    const message = (data && data.message) || answer.statusText || "request failed";
    throw new ApiError(answer.status, kind, message);
  }
  return data;
}

/** "?a=1&b=2" from an object, leaving out empty values; "" when nothing is left. */
function query(params) {
  const pairs = Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined);
  return pairs.length ? "?" + new URLSearchParams(pairs).toString() : "";
}

/** Formatting of figures for the tables; every function accepts null/undefined ("-"). */
/** A node's state in words: alive, down since when (told by the cluster's events), dead. */
function nodeState(n) {
  if (n.alive) return "alive";
  if (n.retired) return "left: its sessions are being adopted";
  return n.down_since_ms ? `down since ${fmt.ms_time(n.down_since_ms)}` : "dead";
}

const fmt = {
  none: (v) => v === null || v === undefined || (typeof v === "number" && Number.isNaN(v)),
  int(v) { return fmt.none(v) ? "-" : Math.round(Number(v)).toLocaleString("en"); },
  num(v) {
    if (fmt.none(v)) return "-";
    const n = Number(v);
    return Math.abs(n) >= 100 ? Math.round(n).toLocaleString("en") : n.toFixed(1);
  },
  ms(v) { return fmt.none(v) ? "-" : `${fmt.num(v)} ms`; },
  kib(v) {
    if (fmt.none(v)) return "-";
    return v >= 1024 * 1024 ? `${(v / 1048576).toFixed(1)} GiB`
      : v >= 1024 ? `${(v / 1024).toFixed(1)} MiB` : `${Math.round(v)} KiB`;
  },
  duration(s) {
    if (fmt.none(s)) return "-";
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60);
    if (d) return `${d} d ${h} h`;
    if (h) return `${h} h ${m} min`;
    if (m) return `${m} min ${s % 60} s`;
    return `${s} s`;
  },
  /** A time given in Unix seconds (or an ISO string) in the browser's local time. */
  time(v) {
    if (fmt.none(v) || v === "") return "-";
    const date = typeof v === "number" ? new Date(v * 1000) : new Date(v);
    return Number.isNaN(date.getTime()) ? String(v) : date.toLocaleString();
  },
  /** A time given in Unix milliseconds, in the browser's local time. */
  ms_time(v) { return fmt.none(v) ? "-" : fmt.time(v / 1000); },
  list(v) {
    if (!Array.isArray(v)) return fmt.cell(v);
    return v.length ? v.map((item) => (typeof item === "string" ? item : fmt.cell(item))).join(", ") : "none";
  },
  /** A listener as the nodes answer it: a URL string, or an object of scheme/host/port. */
  listener(l) {
    if (typeof l === "string") return l;
    if (l && l.host !== undefined) return `${l.scheme || l.kind || "?"}://${l.host}:${l.port}`;
    return JSON.stringify(l);
  },
  cell(v) {
    if (fmt.none(v)) return "-";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  },
};

// Ticks of the chart's time axis: a sample is taken every 2 s, so never finer than that.
const TIME_STEPS = [2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];

/** uPlot's labels of the time axis: HH:MM:SS over 10 minutes or less, else HH:MM. */
function timeLabels(chart, ticks) {
  const span = chart.scales.x.max - chart.scales.x.min;
  const parts = span <= 600 ? { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false }
    : { hour: "2-digit", minute: "2-digit", hour12: false };
  return ticks.map((t) => new Date(t * 1000).toLocaleTimeString([], parts));
}

/** Show an error in the banner until dismissed or the next page; a 401 is not shown
 * (api() has already put the login page up). */
function report(err) {
  if (err instanceof ApiError && err.status === 401) return;
  const notice = Alpine.store("notice");
  notice.error = describe(err);
  notice.errorType = errorType(err);
}

/**
 * A paged list for Alpine: `path()` gives the path with its filters; `items`, `next`
 * (the cursor of the following page), `cursors` (those of the pages before, for Previous).
 */
function pagedList(extra) {
  return {
    items: [],
    next: null,
    cursor: null,
    cursors: [],
    loaded: false,
    init() { this.load(); },
    async load() {
      try {
        const base = this.path();
        const sep = base.includes("?") ? "&" : "?";
        const answer = await api("GET", `${base}${sep}limit=${PAGE_SIZE}` +
          (this.cursor ? `&cursor=${encodeURIComponent(this.cursor)}` : ""));
        this.items = answer.items || [];
        this.next = answer.next || null;
        this.loaded = true;
      } catch (err) {
        report(err);
      }
    },
    search() { this.cursor = null; this.cursors = []; return this.load(); },
    more() { this.cursors.push(this.cursor); this.cursor = this.next; return this.load(); },
    previous() { this.cursor = this.cursors.pop() ?? null; return this.load(); },
    ...extra,
  };
}

/** An admin's action behind the confirmation dialog: runs `action` if confirmed. */
async function confirmed(text, action) {
  if (!(await Alpine.store("confirm").ask(text))) return;
  try {
    await action();
  } catch (err) {
    report(err);
  }
}

