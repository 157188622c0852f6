// A small line chart on a <canvas>: time on x (the last `span` seconds), auto-scaled y, gaps where
// a value is null. Title, legend and current values are DOM text beside the canvas.

import { el } from "./dom.js";

const PAD = { left: 48, right: 8, top: 8, bottom: 18 };

export class LineChart {
  // series: [{name, color}] (color: a CSS variable name); format(v) -> text; yMax: fixed top or
  // null (auto); counts: whole numbers only (the top is a multiple of 4, so are the grid lines)
  constructor(parent, { id, title, series, format, yMax = null, counts = false }) {
    this.series = series;
    this.format = format;
    this.yMax = yMax;
    this.counts = counts;
    this.card = el("figure", "card");
    this.card.id = id;
    const head = el("figcaption", "", title);
    this.legend = el("div", "legend");
    this.values = series.map((s) => {
      const item = el("span", "item");
      const swatch = el("i", "swatch");
      swatch.style.background = `var(${s.color})`;
      const value = el("b", "value", "–");
      value.dataset.series = s.name;
      item.append(swatch, `${s.name} `, value);
      this.legend.append(item);
      return value;
    });
    this.canvas = el("canvas");
    this.card.append(head, this.legend, this.canvas);
    parent.append(this.card);
  }

  // points: [{t (s), v: [value or null per series]}], oldest first; now (s); span (s)
  draw(points, now, span, yMax = this.yMax) {
    const latest = points.length ? points[points.length - 1].v : [];
    this.values.forEach((node, i) => {
      const v = latest[i];
      node.textContent = v === null || v === undefined ? "–" : this.format(v);
      node.dataset.value = v === null || v === undefined ? "" : String(v);
    });
    const { ctx, w, h } = this.surface();
    if (!ctx) return;
    const shown = points.filter((p) => p.t >= now - span);
    const values = shown.flatMap((p) => p.v).filter((v) => v !== null && Number.isFinite(v));
    const high = Math.max(0, ...values);
    const top = yMax > 0 ? yMax : this.counts ? Math.max(4, Math.ceil(high / 4) * 4) : niceCeil(high);
    const x = (t) => PAD.left + ((t - (now - span)) / span) * (w - PAD.left - PAD.right);
    const y = (v) => h - PAD.bottom - (v / top) * (h - PAD.top - PAD.bottom);
    this.grid(ctx, w, h, top, y, span, yMax > 0 || this.counts ? 4 : divisions(top));
    this.series.forEach((s, i) => {
      ctx.strokeStyle = ctx.fillStyle = cssVar(s.color);
      ctx.lineWidth = 1.6;
      ctx.beginPath();
      let run = []; // the current stretch of values without a gap
      const flush = () => {
        if (run.length === 1) ctx.fillRect(run[0][0] - 1.5, run[0][1] - 1.5, 3, 3); // a lone value: a dot
        run = [];
      };
      for (const p of shown) {
        const v = p.v[i];
        if (v === null || v === undefined || !Number.isFinite(v)) {
          flush();
          continue;
        }
        const pt = [x(p.t), y(Math.min(v, top))];
        if (run.length) ctx.lineTo(...pt);
        else ctx.moveTo(...pt);
        run.push(pt);
      }
      flush();
      ctx.stroke();
    });
  }

  surface() {
    const dpr = window.devicePixelRatio || 1;
    const w = this.canvas.clientWidth;
    const h = this.canvas.clientHeight;
    if (!w || !h) return { ctx: null, w, h }; // tab hidden: nothing to draw on
    if (this.canvas.width !== Math.round(w * dpr)) this.canvas.width = Math.round(w * dpr);
    if (this.canvas.height !== Math.round(h * dpr)) this.canvas.height = Math.round(h * dpr);
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    return { ctx, w, h };
  }

  grid(ctx, w, h, top, y, span, steps) {
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = cssVar("--muted");
    ctx.strokeStyle = cssVar("--grid");
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= steps; i++) {
      const v = (top * i) / steps;
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(PAD.left, yy);
      ctx.lineTo(w - PAD.right, yy);
      ctx.stroke();
      ctx.fillText(this.format(v), PAD.left - 4, yy);
    }
    ctx.textBaseline = "alphabetic";
    ctx.textAlign = "left";
    ctx.fillText(`-${Math.round(span / 60)} min`, PAD.left, h - 4);
    ctx.textAlign = "right";
    ctx.fillText("now", w - PAD.right, h - 4);
  }
}

// 1, 2, 2.5, 5 x 10^k at or above v (so grid lines fall on round numbers).
function niceCeil(v) {
  if (!(v > 0)) return 1;
  const base = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * base >= v * 0.999999) return m * base;
  return 10 * base;
}

// Grid steps that land on round values: 2 -> 4 x 0.5; 1, 2.5, 5 -> 5 x 0.2, 0.5, 1 (x 10^k).
function divisions(top) {
  const mantissa = Math.round(top / 10 ** Math.floor(Math.log10(top)) * 10) / 10;
  return mantissa === 2 ? 4 : 5;
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}
