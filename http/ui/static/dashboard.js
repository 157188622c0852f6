// The dashboard tab: /metrics polled every second, the last 1, 5 or 15 minutes charted. Rates, hit rate,
// draft acceptance and latency percentiles come from counter and histogram increases between scrapes, like
// PromQL's rate() and histogram_quantile() would compute them.

import { api } from "./api.js";
import { LineChart } from "./chart.js";
import { $ } from "./dom.js";
import { bucketDelta, buckets, parseMetrics, quantile, total } from "./prom.js";

const POLL_MS = 1000;
const KEEP_S = 900; // history kept: the longest window the charts offer
const WINDOW_S = 10; // hit rate and percentiles: over the last 10 s, like rate(x[10s])

const fmtInt = (v) => String(Math.round(v));
const fmtRate = (v) => (v >= 100 || v === 0 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
const fmtPct = (v) => `${(v * 100).toFixed(v > 0 && v < 0.1 ? 1 : 0)}%`;
const fmtSec = (v) => (v >= 1 ? `${v.toFixed(2)} s` : `${(v * 1000).toFixed(v > 0 && v < 0.01 ? 1 : 0)} ms`);

export class Dashboard {
  constructor() {
    const root = $("charts");
    const pct = ["p50", "p99"].map((name, i) => ({ name, color: `--s${i + 1}` }));
    this.charts = {
      tokps: new LineChart(root, {
        id: "chart-tokps",
        title: "Generated tokens / s",
        series: [{ name: "tok/s", color: "--s1" }],
        format: fmtRate,
      }),
      requests: new LineChart(root, {
        id: "chart-requests",
        title: "Requests in the engine",
        series: [
          { name: "running", color: "--s1" },
          { name: "waiting", color: "--s2" },
        ],
        format: fmtInt,
        counts: true,
      }),
      kv: new LineChart(root, {
        id: "chart-kv",
        title: "KV cache blocks",
        series: [
          { name: "used", color: "--s1" },
          { name: "total", color: "--s3" },
        ],
        format: fmtInt,
      }),
      hit: new LineChart(root, {
        id: "chart-hit",
        title: `Prefix-cache hit rate (last ${WINDOW_S} s)`,
        series: [{ name: "hit rate", color: "--s1" }],
        format: fmtPct,
        yMax: 1,
      }),
      spec: new LineChart(root, {
        id: "chart-spec",
        title: `Speculative decoding: drafts accepted (last ${WINDOW_S} s)`,
        series: [{ name: "acceptance", color: "--s1" }],
        format: fmtPct,
        yMax: 1,
      }),
      ttft: new LineChart(root, {
        id: "chart-ttft",
        title: `Time to first token (last ${WINDOW_S} s)`,
        series: pct,
        format: fmtSec,
      }),
      itl: new LineChart(root, {
        id: "chart-itl",
        title: `Inter-token latency (last ${WINDOW_S} s)`,
        series: pct,
        format: fmtSec,
      }),
    };
    this.points = Object.fromEntries(Object.keys(this.charts).map((k) => [k, []]));
    this.scrapes = [];
    this.kvTotal = null;
    this.status = $("dash-status");
    this.span = $("span");
    this.span.addEventListener("change", () => this.render());
    window.addEventListener("resize", () => this.render());
  }

  start() {
    const tick = async () => {
      if (document.visibilityState === "visible") await this.poll();
      setTimeout(tick, POLL_MS);
    };
    tick();
  }

  async poll() {
    let text;
    try {
      text = await (await api("metrics")).text();
    } catch (err) {
      this.status.dataset.state = "error";
      this.status.textContent = `cannot read /metrics: ${err.message}`;
      return;
    }
    this.add(Date.now() / 1000, parseMetrics(text));
    this.status.dataset.state = "ok";
    this.status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    this.render();
  }

  add(t, m) {
    const s = {
      t,
      gen: total(m, "rillet_generation_tokens_total"),
      hits: total(m, "rillet_prefix_cache_hits_total"),
      queries: total(m, "rillet_prefix_cache_queries_total"),
      drafted: total(m, "rillet_spec_draft_tokens_total"),
      accepted: total(m, "rillet_spec_accepted_tokens_total"),
      ttft: buckets(m, "rillet_time_to_first_token_seconds"),
      itl: buckets(m, "rillet_inter_token_latency_seconds"),
    };
    const prev = this.scrapes.at(-1);
    // the newest scrape at least WINDOW_S old (else the oldest): the window's start
    const base = this.scrapes.findLast((p) => p.t <= t - WINDOW_S) ?? this.scrapes[0];
    this.scrapes.push(s);
    this.scrapes = this.scrapes.filter((p) => p.t >= t - WINDOW_S - 5);
    const restarted = prev && s.gen < prev.gen; // counters went back: a new server process
    const rate = prev && !restarted ? Math.max(0, (s.gen - prev.gen) / (t - prev.t)) : null;
    const dq = base && !restarted ? s.queries - base.queries : 0;
    const hit = dq > 0 ? (s.hits - base.hits) / dq : null;
    const dd = base && !restarted ? s.drafted - base.drafted : 0; // no drafts (speculation off): no point
    const acceptance = dd > 0 ? (s.accepted - base.accepted) / dd : null;
    const pcts = (now, before) => {
      const d = bucketDelta(now, restarted ? null : before);
      return [quantile(0.5, d), quantile(0.99, d)];
    };
    this.kvTotal = total(m, "rillet_kv_blocks_total");
    this.push("tokps", t, [rate]);
    this.push("requests", t, [total(m, "rillet_num_requests_running"), total(m, "rillet_num_requests_waiting")]);
    this.push("kv", t, [total(m, "rillet_kv_blocks_used"), this.kvTotal]);
    this.push("hit", t, [hit]);
    this.push("spec", t, [acceptance]);
    this.push("ttft", t, pcts(s.ttft, base?.ttft));
    this.push("itl", t, pcts(s.itl, base?.itl));
  }

  push(chart, t, v) {
    const points = this.points[chart];
    points.push({ t, v });
    while (points.length && points[0].t < t - KEEP_S) points.shift();
  }

  render() {
    const now = Date.now() / 1000;
    const span = Number(this.span.value);
    for (const [name, chart] of Object.entries(this.charts)) {
      chart.draw(this.points[name], now, span, name === "kv" ? this.kvTotal : undefined);
    }
  }
}
