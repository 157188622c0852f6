// Prometheus text exposition (what /metrics serves): samples, counter rates, histogram quantiles.

// "name{a="x",b="y"} 1.5" -> Map name -> [{labels, value}]
export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const lm of (m[2] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[lm[1]] = lm[2];
    }
    const value = Number(m[3]); // "+Inf", "NaN" parse too
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value });
  }
  return out;
}

// Sum of a metric's samples (over all labels); null when the metric is absent.
export function total(metrics, name) {
  const samples = metrics.get(name);
  if (!samples) return null;
  return samples.reduce((acc, s) => acc + s.value, 0);
}

// A histogram's cumulative buckets, sorted by bound: [[le, count], ...] (le of +Inf is Infinity).
export function buckets(metrics, name) {
  const samples = metrics.get(`${name}_bucket`) || [];
  return samples
    .map((s) => [s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), s.value])
    .sort((a, b) => a[0] - b[0]);
}

// Observations between two scrapes of the same histogram: now[i] - before[i] per bucket.
export function bucketDelta(now, before) {
  if (!before || before.length !== now.length) return now;
  return now.map(([le, c], i) => [le, c - before[i][1]]);
}

// Like PromQL's histogram_quantile: linear within the bucket that holds the q-th observation;
// the highest finite bound when it falls in +Inf. null with no observations.
export function quantile(q, cumulative) {
  if (!cumulative.length) return null;
  const count = cumulative[cumulative.length - 1][1];
  if (!(count > 0)) return null;
  const rank = q * count;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, c] of cumulative) {
    if (c >= rank) {
      if (le === Infinity) return prevLe;
      if (c === prevCount) return le;
      return prevLe + ((le - prevLe) * (rank - prevCount)) / (c - prevCount);
    }
    prevLe = le;
    prevCount = c;
  }
  return prevLe;
}
