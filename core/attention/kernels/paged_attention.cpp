// rillet::paged_attention: attention of each row's queries over its paged K/V, read in place from
// the pool through the block table, for the compiled CPU decode and verify steps. Built at first
// use by core/attention/cpu_kernel.py; see there for why it exists.
//
//   q [B, Q, Hq, D], k_cache / v_cache [N, bs, Hkv, D], block_tables [B, W] int32, seq_lens [B]
//   int32, query_lens [B] int32 (1 for a decode row) -> out [B, Q, Hq, D] in q's dtype.
//
// Query i of row b sits at position p = seq_lens[b] - query_lens[b] + i and sees the keys at
// positions [max(0, p - window + 1), min(p + 1, seq_lens[b])) (window 0: from 0): causal among a
// verify row's queries, a padding query (i >= query_lens[b]) sees the row's whole context, as
// attention/paged_verify.py's mask. Softmax is computed online over chunks of at most 16 keys
// (one block's tokens at a time), in float32. A (row, query, head)'s arithmetic is the same
// sequence of operations whatever the batch, the query count or the thread split: its bits do not
// depend on what else is in the step.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int kChunk = 16;     // keys per online-softmax step
constexpr int64_t kMaxRows = 64;  // query rows (G x queries) an item holds (cpu_kernel.py MAX_GROUP)
constexpr int64_t kMaxD = 256;  // cpu_kernel.py MAX_HEAD_DIM
constexpr int kRowBlock = 4;  // rows whose sums share each key's and value's load

inline float as_float(float v) { return v; }
inline float as_float(c10::BFloat16 v) { return static_cast<float>(v); }

// 16 floats, one chunk of keys: GCC's vector extension, lowered to whatever the build's -m flags
// allow (one AVX-512 register, two AVX2 ones, four SSE ones), so one source serves every x86 CPU.
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // an unaligned load or store
typedef int32_t i16 __attribute__((vector_size(64)));

inline v16 load16(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline void store16(float* p, v16 v) { *reinterpret_cast<v16u*>(p) = v; }
inline v16 splat(float x) { return v16{} + x; }

// lanes l ^ s of x (s = 8, 4, 2, 1: a butterfly step), for reductions over the 16 lanes
template <int S>
inline v16 swapped(v16 x) {
  constexpr i16 m = {0 ^ S, 1 ^ S, 2 ^ S, 3 ^ S, 4 ^ S, 5 ^ S, 6 ^ S, 7 ^ S,
                     8 ^ S, 9 ^ S, 10 ^ S, 11 ^ S, 12 ^ S, 13 ^ S, 14 ^ S, 15 ^ S};
  return __builtin_shuffle(x, m);
}
inline float hmax(v16 x) {
  x = x > swapped<8>(x) ? x : swapped<8>(x);
  x = x > swapped<4>(x) ? x : swapped<4>(x);
  x = x > swapped<2>(x) ? x : swapped<2>(x);
  x = x > swapped<1>(x) ? x : swapped<1>(x);
  return x[0];
}
inline float hsum(v16 x) {
  x += swapped<8>(x);
  x += swapped<4>(x);
  x += swapped<2>(x);
  x += swapped<1>(x);
  return x[0];
}

// One step of a 16 x 16 transpose: rows a = i and b = i + S (i & S == 0) trade their off-diagonal
// S x S sub-blocks. Four steps (S = 8, 4, 2, 1) transpose the whole tile.
template <int S>
inline void trade(v16& a, v16& b) {
  constexpr i16 ma = {(0 & S) ? 16 + 0 - S : 0, (1 & S) ? 16 + 1 - S : 1, (2 & S) ? 16 + 2 - S : 2,
                      (3 & S) ? 16 + 3 - S : 3, (4 & S) ? 16 + 4 - S : 4, (5 & S) ? 16 + 5 - S : 5,
                      (6 & S) ? 16 + 6 - S : 6, (7 & S) ? 16 + 7 - S : 7, (8 & S) ? 16 + 8 - S : 8,
                      (9 & S) ? 16 + 9 - S : 9, (10 & S) ? 16 + 10 - S : 10, (11 & S) ? 16 + 11 - S : 11,
                      (12 & S) ? 16 + 12 - S : 12, (13 & S) ? 16 + 13 - S : 13, (14 & S) ? 16 + 14 - S : 14,
                      (15 & S) ? 16 + 15 - S : 15};
  constexpr i16 mb = {(0 & S) ? 16 + 0 : 0 + S, (1 & S) ? 16 + 1 : 1 + S, (2 & S) ? 16 + 2 : 2 + S,
                      (3 & S) ? 16 + 3 : 3 + S, (4 & S) ? 16 + 4 : 4 + S, (5 & S) ? 16 + 5 : 5 + S,
                      (6 & S) ? 16 + 6 : 6 + S, (7 & S) ? 16 + 7 : 7 + S, (8 & S) ? 16 + 8 : 8 + S,
                      (9 & S) ? 16 + 9 : 9 + S, (10 & S) ? 16 + 10 : 10 + S, (11 & S) ? 16 + 11 : 11 + S,
                      (12 & S) ? 16 + 12 : 12 + S, (13 & S) ? 16 + 13 : 13 + S, (14 & S) ? 16 + 14 : 14 + S,
                      (15 & S) ? 16 + 15 : 15 + S};
  const v16 na = __builtin_shuffle(a, b, ma), nb = __builtin_shuffle(a, b, mb);
  a = na;
  b = nb;
}

template <int S>
inline void trade_all(v16* t) {
  for (int i = 0; i < kChunk; ++i)
    if ((i & S) == 0) trade<S>(t[i], t[i + S]);
}

inline void transpose16(v16* t) {
  trade_all<8>(t);
  trade_all<4>(t);
  trade_all<2>(t);
  trade_all<1>(t);
}

template <typename CT>
inline v16 load_row(const CT* p) {
  if constexpr (std::is_same_v<CT, float>) {
    return load16(p);
  } else {
    v16 x;
    for (int i = 0; i < kChunk; ++i) x[i] = as_float(p[i]);
    return x;
  }
}

// exp(x) for x <= 0 (scores minus their running max), lane by lane, within ~2 ulp of expf:
// x = n ln2 + r with |r| <= ln2 / 2 (n rounded by the 1.5 * 2^23 trick), a degree-6 polynomial for
// exp(r), then n added to the exponent. Clamped at -87 (exp(-87) ~ 1.6e-38, still normal).
inline v16 exp_neg(v16 x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  const v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  v16 r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  v16 y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const i16 bits = reinterpret_cast<i16>(y) + (__builtin_convertvector(n, i16) << 23);
  return reinterpret_cast<v16>(bits);
}

struct Shape {
  int64_t B, Q, Hq, Hkv, D, bs, W;
  int64_t window;
  float scale;
};

// One item: row b, kv head h, queries [i0, i1) of each of the head's G query heads. Rows r = g *
// nq + j; each keeps a running max m, sum l and output acc over the keys seen so far.
template <typename QT, typename CT>
void attend_item(const Shape& s, const QT* q, const CT* kc, const CT* vc, const int32_t* table, int64_t seq_len,
                 int64_t query_len, int64_t b, int64_t h, int64_t i0, int64_t i1, QT* out, float* work) {
  const int64_t G = s.Hq / s.Hkv, D = s.D, nq = i1 - i0, R = G * nq;
  const float ninf = -std::numeric_limits<float>::infinity();
  float* qf = work;             // [R, D] scaled queries
  const int64_t Rmax = kMaxRows + kRowBlock;
  float* acc = qf + Rmax * D;   // [R, D]
  float* kt = acc + Rmax * D;   // [D, kChunk] the chunk's keys, transposed
  float* vf = kt + D * kChunk;  // [kChunk, D]
  float m[kMaxRows], l[kMaxRows];
  int64_t lo[kMaxRows], hi[kMaxRows];
  int64_t key_lo = seq_len, key_hi = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t j = 0; j < nq; ++j) {
      const int64_t r = g * nq + j, i = i0 + j;
      const QT* src = q + ((b * s.Q + i) * s.Hq + h * G + g) * D;
      for (int64_t d = 0; d < D; ++d) qf[r * D + d] = as_float(src[d]) * s.scale;
      const int64_t p = seq_len - query_len + i;
      hi[r] = std::min(p + 1, seq_len);
      lo[r] = s.window > 0 ? std::max<int64_t>(0, p - s.window + 1) : 0;
      m[r] = ninf;
      l[r] = 0.0f;
      key_lo = std::min(key_lo, lo[r]);
      key_hi = std::max(key_hi, hi[r]);
    }
  }
  const int64_t Rp = (R + kRowBlock - 1) / kRowBlock * kRowBlock;  // rows past R: zeros, unused
  std::fill(qf + R * D, qf + Rp * D, 0.0f);
  std::fill(acc, acc + Rp * D, 0.0f);
  v16 iota;
  for (int j = 0; j < kChunk; ++j) iota[j] = float(j);
  for (int64_t t0 = key_lo; t0 < key_hi;) {
    const int64_t blk = table[t0 / s.bs], off = t0 % s.bs;
    const int64_t n = std::min<int64_t>({kChunk, s.bs - off, key_hi - t0});
    // the chunk's keys transposed to kt [D, kChunk] (16 x 16 tiles; lanes past n zero), its values
    // as float rows: in place for a float32 pool, converted into vf otherwise
    const int64_t slot0 = ((blk * s.bs + off) * s.Hkv + h) * D, stride = s.Hkv * D;
    for (int64_t d0 = 0; d0 < D; d0 += kChunk) {
      v16 tile[kChunk];
      for (int64_t j = 0; j < kChunk; ++j) tile[j] = j < n ? load_row(kc + slot0 + j * stride + d0) : v16{};
      transpose16(tile);
      for (int i = 0; i < kChunk; ++i) store16(kt + (d0 + i) * kChunk, tile[i]);
    }
    const float* vrow[kChunk];
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (std::is_same_v<CT, float>) {
        vrow[j] = vc + slot0 + j * stride;
      } else {
        for (int64_t d = 0; d < D; ++d) vf[j * D + d] = as_float(vc[slot0 + j * stride + d]);
        vrow[j] = vf + j * D;
      }
    }
    for (int64_t r0 = 0; r0 < R; r0 += kRowBlock) {
      // the block's scores: kRowBlock x 2 independent sums (even and odd d), so the FMAs pipeline
      v16 sc[kRowBlock][2] = {};
      for (int64_t d = 0; d < D; d += 2) {
        const v16 k0 = load16(kt + d * kChunk), k1 = load16(kt + (d + 1) * kChunk);
        for (int k = 0; k < kRowBlock; ++k) {
          sc[k][0] += qf[(r0 + k) * D + d] * k0;
          sc[k][1] += qf[(r0 + k) * D + d + 1] * k1;
        }
      }
      v16 p[kRowBlock];
      float alpha[kRowBlock];
      for (int k = 0; k < kRowBlock; ++k) {
        const int64_t r = r0 + k;
        p[k] = v16{};
        alpha[k] = 1.0f;
        if (r >= R) continue;
        // lanes j whose key t0 + j row r sees: lo <= t0 + j < min(hi, t0 + n)
        const float first = float(lo[r] - t0), stop = float(std::min(hi[r], t0 + n) - t0);
        if (stop <= 0.0f || first >= stop) continue;
        const auto vis = (iota >= first) & (iota < stop);
        const v16 sk = vis ? sc[k][0] + sc[k][1] : splat(ninf);
        const float m_new = std::max(m[r], hmax(sk));
        alpha[k] = m[r] == ninf ? 0.0f : exp_neg(splat(m[r] - m_new))[0];
        p[k] = vis ? exp_neg(sk - m_new) : v16{};
        l[r] = l[r] * alpha[k] + hsum(p[k]);
        m[r] = m_new;
      }
      // acc = acc * alpha + p V, the rows' sums independent of each other
      for (int64_t d0 = 0; d0 < D; d0 += kChunk) {
        v16 a[kRowBlock];
        for (int k = 0; k < kRowBlock; ++k) a[k] = load16(acc + (r0 + k) * D + d0) * alpha[k];
        for (int64_t j = 0; j < n; ++j) {
          const v16 v = load16(vrow[j] + d0);
          for (int k = 0; k < kRowBlock; ++k) a[k] += p[k][j] * v;
        }
        for (int k = 0; k < kRowBlock; ++k) store16(acc + (r0 + k) * D + d0, a[k]);
      }
    }
    t0 += n;
  }
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t j = 0; j < nq; ++j) {
      const int64_t r = g * nq + j;
      const float inv = 1.0f / l[r];
      QT* dst = out + ((b * s.Q + i0 + j) * s.Hq + h * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<QT>(acc[r * D + d] * inv);
    }
  }
}

template <typename QT, typename CT>
void run(const Shape& s, const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& tables,
         const at::Tensor& seq_lens, const at::Tensor& query_lens, at::Tensor& out) {
  const int64_t G = s.Hq / s.Hkv;
  // queries per item: as many as the accumulators hold, fewer when that leaves threads idle
  int64_t per = std::max<int64_t>(1, std::min(s.Q, kMaxRows / G));
  const int64_t want = 2 * at::get_num_threads();
  while (per > 1 && s.B * s.Hkv * ((s.Q + per - 1) / per) < want) per = (per + 1) / 2;
  const int64_t chunks = (s.Q + per - 1) / per, items = s.B * s.Hkv * chunks;
  const QT* qp = q.data_ptr<QT>();
  const CT* kp = kc.data_ptr<CT>();
  const CT* vp = vc.data_ptr<CT>();
  const int32_t* tp = tables.data_ptr<int32_t>();
  const int32_t* lp = seq_lens.data_ptr<int32_t>();
  const int32_t* qlp = query_lens.data_ptr<int32_t>();
  QT* op = out.data_ptr<QT>();
  at::parallel_for(0, items, 1, [&](int64_t a, int64_t z) {
    std::vector<float> work(2 * (kMaxRows + kRowBlock) * s.D + 2 * kChunk * s.D);
    for (int64_t it = a; it < z; ++it) {
      const int64_t c = it % chunks, h = (it / chunks) % s.Hkv, b = it / (chunks * s.Hkv);
      const int64_t i0 = c * per, i1 = std::min(s.Q, i0 + per);
      attend_item<QT, CT>(s, qp, kp, vp, tp + b * s.W, lp[b], qlp[b], b, h, i0, i1, op, work.data());
    }
  });
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           const at::Tensor& query_lens, double scale, int64_t window) {
  TORCH_CHECK(q.dim() == 4 && k_cache.dim() == 4, "q must be [B, Q, Hq, D] and the caches [N, bs, Hkv, D]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == v_cache.scalar_type(),
              "k_cache and v_cache must match");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt,
              "block_tables and seq_lens must be int32");
  const at::Tensor qc = q.contiguous(), kc = k_cache.contiguous(), vc = v_cache.contiguous();
  const at::Tensor tc = block_tables.contiguous(), lc = seq_lens.contiguous();
  Shape s{qc.size(0), qc.size(1), qc.size(2), kc.size(2), qc.size(3), kc.size(1), tc.size(1), window,
          static_cast<float>(scale)};
  TORCH_CHECK(s.Hq % s.Hkv == 0 && kc.size(3) == s.D && s.D <= kMaxD && s.D % kChunk == 0,
              "head counts or head size (a multiple of 16, at most 256) do not fit");
  TORCH_CHECK(s.Hq / s.Hkv <= kMaxRows, "too many query heads per kv head");
  const at::Tensor ql = query_lens.contiguous();
  TORCH_CHECK(ql.scalar_type() == at::kInt && ql.numel() == s.B && lc.numel() == s.B,
              "seq_lens and query_lens must be int32, one per row");
  // every key a row reads lies in its table and every block in the pool: checked here, once, so the
  // loops below never read outside them
  const int32_t* tp = tc.data_ptr<int32_t>();
  const int32_t* lp = lc.data_ptr<int32_t>();
  for (int64_t b = 0; b < s.B; ++b)
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= s.W * s.bs, "seq_lens[", b, "] = ", lp[b], " is outside its block table");
  for (int64_t i = 0; i < s.B * s.W; ++i)
    TORCH_CHECK(tp[i] >= 0 && tp[i] < kc.size(0), "block table entry ", tp[i], " is outside the pool");
  at::Tensor out = at::empty(qc.sizes(), qc.options());
  if (qc.numel() == 0) return out;
  const auto qt = qc.scalar_type(), ct = kc.scalar_type();
  if (qt == at::kFloat && ct == at::kFloat) {
    run<float, float>(s, qc, kc, vc, tc, lc, ql, out);
  } else if (qt == at::kBFloat16 && ct == at::kBFloat16) {
    run<c10::BFloat16, c10::BFloat16>(s, qc, kc, vc, tc, lc, ql, out);
  } else if (qt == at::kFloat && ct == at::kBFloat16) {
    run<float, c10::BFloat16>(s, qc, kc, vc, tc, lc, ql, out);
  } else if (qt == at::kBFloat16 && ct == at::kFloat) {
    run<c10::BFloat16, float>(s, qc, kc, vc, tc, lc, ql, out);
  } else {
    TORCH_CHECK(false, "rillet::paged_attention takes float32 or bfloat16 queries and caches");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rillet, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
      "Tensor query_lens, float scale, int window) -> Tensor");
}

TORCH_LIBRARY_IMPL(rillet, CPU, m) { m.impl("paged_attention", &paged_attention); }
