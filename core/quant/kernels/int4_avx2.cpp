// rillet::int4_avx2_mm: x [M, K] float32 or bf16 @ an int4 weight [N, K]^T -> [M, N] bf16, for CPUs
// with AVX2 and FMA. Built at first use by core/quant/avx2_kernel.py; see there for why it exists.
//
// Each row's inputs are quantized per group of 32 to two int8 levels: xq = round(x / dx) with
// dx = max|x| / 127 (llama.cpp's q8_1), and the rest xr = round((x / dx - xq) * 254), so
// x ~ dx * (254 xq + xr) / 254 to within dx / 508 (int8 alone, within dx / 2, changed greedy
// answers of the default model: bench/RESULTS.md). The codes q in [0, 15] multiply both as
// integers: vpmaddubsw (unsigned codes x signed inputs, pairs summed to int16; a lane sums 16
// products of one level, under 2^15: 16 * 15 * 127) and vpmaddwd by ones to int32. Per group,
// w = (q - 8) * s + z gives
//   sum_k w x ~ s * dx / 254 * (sum q (254 xq + xr) - 8 sum (254 xq + xr)) + z * sum x
// where the integer part is exact (|.| < 2^24) and sum x is the float sum of the inputs themselves.
//
// Layout (core/quant/avx2_kernel.py `pack`): output columns in blocks of 8 (one fp32 vector), K in
// groups of 32, a group in 4 steps of 8 inputs.
//   packed [N/8, K/32, 4, 32] uint8: byte (b, g, p, 4c + j) holds the codes of column 8b + c at
//     input 32g + 8p + j (low nibble) and 32g + 8p + 4 + j (high nibble)
//   sz [N/8, K/32, 2, 8] bf16: the scales, then the zeros, of the block's 8 columns
// so one 32-byte load unpacks (and, shift) to two vectors of 8 columns x 4 inputs, each multiplied
// by a row's 4 inputs broadcast. The codes are unpacked once per pass of up to 8 rows.
// Compiled with -mavx2 -mfma -mf16c and -fopenmp (at::parallel_for is OpenMP pragmas in ATen's
// headers: serial without); loaded only where ATen's CPU capability is AVX2 or above.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;  // inputs per scale and zero
constexpr int64_t kBlock = 8;   // output columns per block (one fp32 vector)
constexpr int kMaxRows = 8;     // rows per pass over a block's unpacked codes
constexpr int64_t kMinBytes = 16384;  // codes a thread takes at least (fewer: the fork costs more)

inline __m256 widen_bf16(const uint16_t* p) {  // 8 bf16 -> 8 fp32
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return widen_bf16(p); }

inline float hsum(__m256 v) {  // a fixed order: a row's bits do not depend on its batch
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// Per row and group: the int8 inputs, their step dx, 8 * their sum (the codes' offset of 8 taken
// out in integers) and the float sum of the inputs themselves (for the zeros).
struct Quantized {
  std::vector<int8_t> xq, xr;  // [M, K]: the levels
  std::vector<float> dx, xsum;  // [M, G]
  std::vector<int32_t> corr;  // [M, G]
};

constexpr int32_t kLevels = 254;  // steps of the second level per step of the first

inline void store_bytes(const __m256i* i, int8_t* out) {  // 32 int32 in [-127, 127] -> 32 int8
  // packs work within 128-bit lanes: the permute puts the 32 bytes back in input order
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
}

template <typename T>
void quantize_group(const T* x, int8_t* q, int8_t* rest, float& dx, int32_t& corr, float& xsum) {
  const __m256 v[4] = {load8(x), load8(x + 8), load8(x + 16), load8(x + 24)};
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_andnot_ps(sign, v[0]);
  for (int i = 1; i < 4; ++i) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  const float m = hmax(amax);
  xsum = hsum(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
  dx = m / 127.0f;
  const __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f), levels = _mm256_set1_ps(float(kLevels));
  __m256i i[4], r[4];
  __m256i sum = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    const __m256 t = _mm256_mul_ps(v[j], inv);  // in [-127, 127]
    const __m256 rounded = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    i[j] = _mm256_cvtps_epi32(rounded);
    r[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(t, rounded), levels));  // t - rounded: exact
    sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_mullo_epi32(i[j], _mm256_set1_epi32(kLevels)), r[j]));
  }
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  corr = 8 * _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
  store_bytes(i, q);
  store_bytes(r, rest);
}

template <typename T>
void quantize(const T* x, int64_t M, int64_t K, Quantized& out) {
  const int64_t G = K / kGroup;
  out.xq.resize(M * K);
  out.xr.resize(M * K);
  out.dx.resize(M * G);
  out.xsum.resize(M * G);
  out.corr.resize(M * G);
  for (int64_t i = 0; i < M * G; ++i)  // row i / G, group i % G: contiguous in x
    quantize_group(x + i * kGroup, out.xq.data() + i * kGroup, out.xr.data() + i * kGroup, out.dx[i], out.corr[i],
                   out.xsum[i]);
}

struct Args {
  const Quantized* x;
  const uint8_t* packed;
  const uint16_t* sz;
  uint16_t* out;  // [M, N] bf16 bits
  int64_t K, G, N;
};

inline __m128i to_bf16(__m256 v) {  // 8 fp32 -> 8 bf16, to nearest even (NaN stays NaN)
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
  const __m256i packed = _mm256_packus_epi32(r, r);  // lanes: 0-3 0-3 | 4-7 4-7
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// The 8 columns' sums over one group of one level of a row's inputs x (32 int8), as int32.
inline __m256i dot(const __m256i* w, const int8_t* x, __m256i ones) {
  __m256i d[8];
  for (int j = 0; j < 8; ++j) {
    int32_t four;
    std::memcpy(&four, x + 4 * j, 4);
    d[j] = _mm256_maddubs_epi16(w[j], _mm256_set1_epi32(four));
  }
  const __m256i lo = _mm256_add_epi16(_mm256_add_epi16(d[0], d[1]), _mm256_add_epi16(d[2], d[3]));
  const __m256i hi = _mm256_add_epi16(_mm256_add_epi16(d[4], d[5]), _mm256_add_epi16(d[6], d[7]));
  return _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones);
}

// Rows [m0, m0 + R) of column block b: a group's codes are unpacked once (8 registers) and each
// row's 8 products summed as a tree right after (few live registers: no spills). Every row takes
// the same operations in the same order whatever R is, so a row's bits do not depend on its batch.
template <int R>
void block(const Args& a, int64_t b, int64_t m0) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const uint8_t* pk = a.packed + b * a.G * 4 * 32;
  const uint16_t* sz = a.sz + b * a.G * 2 * kBlock;
  const int8_t* xq = a.x->xq.data() + m0 * a.K;
  const int8_t* xr = a.x->xr.data() + m0 * a.K;
  const __m256i levels = _mm256_set1_epi32(kLevels);
  const __m256 per_level = _mm256_set1_ps(1.0f / float(kLevels));
  __m256 y[R];
  for (int r = 0; r < R; ++r) y[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < a.G; ++g) {
    __m256i w[8];  // w[j]: the 8 columns' codes at inputs 4j .. 4j + 3 of the group
    for (int p = 0; p < 4; ++p) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pk + (g * 4 + p) * 32));
      w[2 * p] = _mm256_and_si256(c, low);
      w[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(c, 4), low);
    }
    const __m256 s = widen_bf16(sz + g * 2 * kBlock), z = widen_bf16(sz + g * 2 * kBlock + kBlock);
    for (int r = 0; r < R; ++r) {
      const int64_t at = r * a.K + g * kGroup;
      const __m256i first = dot(w, xq + at, ones), second = dot(w, xr + at, ones);
      const int64_t i = (m0 + r) * a.G + g;
      const __m256i sum = _mm256_add_epi32(_mm256_mullo_epi32(first, levels), second);
      const __m256i q = _mm256_sub_epi32(sum, _mm256_set1_epi32(a.x->corr[i]));
      const __m256 sd = _mm256_mul_ps(s, _mm256_mul_ps(_mm256_set1_ps(a.x->dx[i]), per_level));
      y[r] = _mm256_fmadd_ps(z, _mm256_set1_ps(a.x->xsum[i]), _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(q), y[r]));
    }
  }
  uint16_t* out = a.out + m0 * a.N + b * kBlock;
  for (int r = 0; r < R; ++r) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + r * a.N), to_bf16(y[r]));
}

using BlockFn = void (*)(const Args&, int64_t, int64_t);
constexpr BlockFn kBlockFns[kMaxRows + 1] = {nullptr,  block<1>, block<2>, block<3>, block<4>,
                                             block<5>, block<6>, block<7>, block<8>};

at::Tensor int4_avx2_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t n) {
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "rillet::int4_avx2_mm needs AVX2 and FMA");
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "x must be [M, K] float32 or bfloat16");
  TORCH_CHECK(packed.scalar_type() == at::kByte && sz.scalar_type() == at::kBFloat16, "packed uint8, sz bfloat16");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), G = K / kGroup;
  TORCH_CHECK(K % kGroup == 0 && n % kBlock == 0, "K must be a multiple of 32 and N of 8");
  TORCH_CHECK(packed.numel() == n * K / 2 && sz.numel() == n * G * 2, "packed or sz does not fit [N, K]");
  TORCH_CHECK(packed.is_contiguous() && sz.is_contiguous(), "packed and sz must be contiguous");
  at::Tensor out = at::empty({M, n}, xc.options().dtype(at::kBFloat16));
  if (M == 0) return out;
  Quantized q;
  if (xc.scalar_type() == at::kFloat)
    quantize(xc.data_ptr<float>(), M, K, q);
  else
    quantize(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, K, q);
  const Args a{&q, packed.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(sz.data_ptr()),
               reinterpret_cast<uint16_t*>(out.data_ptr()), K, G, n};
  const int64_t grain = std::max<int64_t>(1, kMinBytes / (kBlock * K / 2));
  at::parallel_for(0, n / kBlock, grain, [&](int64_t b0, int64_t b1) {
    // a block's codes (4 KB at K = 2048) stay in L1 through its passes: read once from memory
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) kBlockFns[std::min<int64_t>(kMaxRows, M - m0)](a, b, m0);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rillet, m) { m.def("int4_avx2_mm(Tensor x, Tensor packed, Tensor sz, int n) -> Tensor"); }

TORCH_LIBRARY_IMPL(rillet, CPU, m) { m.impl("int4_avx2_mm", &int4_avx2_mm); }
