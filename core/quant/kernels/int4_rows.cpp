// rillet::int4_rows_mm: x [M, K] bf16 @ an int4 weight [N, K]^T -> [M, N] bf16, for CPUs with
// AVX512-BF16. Built at first use by core/quant/rows_kernel.py; see there for why it exists.
//
// Layout (core/quant/rows_kernel.py `pack`): the weight's columns go in tile pairs of 32 output
// columns; K in groups of 32 (one scale and zero each), a group in 16 pairs of inputs (k, k + 1).
//   packed [N/32, K/32, 16, 32] uint8: byte (t, g, p, c) holds the codes of output column 32t + c
//     at inputs 32g + 2p (low nibble) and 32g + 2p + 1 (high nibble)
//   sz [N/32, K/32, 2, 32] bf16: the scales, then the zeros, of the tile pair's 32 columns
// w = (q - 8) * scale + zero, so sum_k w x = scale * sum_k (q - 8) x + zero * sum_k x per group:
// each weight is unpacked once per pass of up to 12 rows and used by each (torch's kernel unpacks it for
// each block of 4 rows), and (q - 8) and x are exact bf16 pairs for vdpbf16ps (fp32 sums). Where
// the CPU has AMX tiles, rows go through tile multiplies instead (below): the same unpacking, one
// instruction for what 16 x R vdpbf16ps do (a pair's two products are added in the other order, so
// a last bit may differ from the AVX512 path; on one CPU every row takes the one path).
// Compiled with -fopenmp: at::parallel_for is OpenMP pragmas in ATen's headers (serial without).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#define RILLET_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define RILLET_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

namespace {

constexpr int64_t kGroup = 32;  // inputs per scale and zero
constexpr int64_t kTile = 32;   // output columns per tile pair (two 16-lane fp32 vectors)
constexpr int kMaxRows = 12;    // rows per pass over a tile pair: 2 accumulators a row stay in registers

RILLET_TARGET inline __m512 widen_bf16(const uint16_t* p) {  // 16 bf16 -> 16 fp32
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

// 16 bytes (16 columns x one input pair) -> 32 bf16 lanes (column j at lanes 2j, 2j + 1 = inputs
// k, k + 1), each the exact value q - 8 looked up from `lut`.
RILLET_TARGET inline __m512bh unpack_pairs(const uint8_t* p, __m512i lut) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i lo = _mm512_and_si512(b, _mm512_set1_epi32(0xF));
  const __m512i hi = _mm512_and_si512(_mm512_slli_epi32(b, 12), _mm512_set1_epi32(0xF0000));
  return reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(_mm512_or_si512(lo, hi), lut));
}

struct Args {
  const uint16_t* x;   // [M, K] bf16 bits
  const float* xsum;   // [M, G]: each row's sum over each group
  const uint8_t* packed;
  const uint16_t* sz;
  const uint16_t* lut;  // 32 bf16: q - 8 for q = 0..15, twice
  uint16_t* out;        // [M, N] bf16 bits
  int64_t K, G, N;
};

// Rows [m0, m0 + R) of tile pair t. Every output sums its products in the same order whatever R
// is, so a row's bits do not depend on its batch.
template <int R>
RILLET_TARGET void tile_pair(const Args& a, int64_t t, int64_t m0) {
  const __m512i lut = _mm512_loadu_si512(a.lut);
  const uint8_t* pk = a.packed + t * a.G * 16 * kTile;
  const uint16_t* sz = a.sz + t * a.G * 2 * kTile;
  const uint16_t* x = a.x + m0 * a.K;
  __m512 y[R][2];
  for (int r = 0; r < R; ++r) y[r][0] = y[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < a.G; ++g) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const uint8_t* pg = pk + g * 16 * kTile;
    for (int p = 0; p < 16; ++p) {
      const __m512bh w0 = unpack_pairs(pg + p * kTile, lut);
      const __m512bh w1 = unpack_pairs(pg + p * kTile + 16, lut);
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, x + r * a.K + g * kGroup + 2 * p, sizeof(pair));
        const __m512bh xb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, xb);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, xb);
      }
    }
    const uint16_t* s = sz + g * 2 * kTile;
    const __m512 s0 = widen_bf16(s), s1 = widen_bf16(s + 16);
    const __m512 z0 = widen_bf16(s + 32), z1 = widen_bf16(s + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 xs = _mm512_set1_ps(a.xsum[(m0 + r) * a.G + g]);
      y[r][0] = _mm512_fmadd_ps(z0, xs, _mm512_fmadd_ps(s0, acc[r][0], y[r][0]));
      y[r][1] = _mm512_fmadd_ps(z1, xs, _mm512_fmadd_ps(s1, acc[r][1], y[r][1]));
    }
  }
  uint16_t* out = a.out + m0 * a.N + t * kTile;
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * a.N), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(y[r][0])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * a.N + 16), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(y[r][1])));
  }
}

using TileFn = void (*)(const Args&, int64_t, int64_t);
constexpr TileFn kTileFns[kMaxRows + 1] = {nullptr,       tile_pair<1>,  tile_pair<2>,  tile_pair<3>, tile_pair<4>,
                                           tile_pair<5>,  tile_pair<6>,  tile_pair<7>,  tile_pair<8>, tile_pair<9>,
                                           tile_pair<10>, tile_pair<11>, tile_pair<12>};

// Each row's sum over each group of 32 inputs: xsum [M, G] (for the zeros' share of the product).
RILLET_TARGET void group_sums(const uint16_t* x, int64_t M, int64_t K, float* xsum) {
  for (int64_t i = 0; i < M * (K / kGroup); ++i) {
    const uint16_t* p = x + i * kGroup;  // row m = i / G, group g = i % G: contiguous in x
    xsum[i] = _mm512_reduce_add_ps(_mm512_add_ps(widen_bf16(p), widen_bf16(p + 16)));
  }
}

// ---- AMX: the same layout and sums through tile multiplies --------------------------------------
// A group's 16 input pairs x 16 columns, unpacked as above, are one B tile in AMX's pair layout
// (row p, lanes 2j and 2j + 1: column j at inputs 2p and 2p + 1); the rows' inputs over that group
// are the A tile. One tile multiply then does what 16 x R vdpbf16ps do, so past one row the cost
// is the unpacking alone. The group's sums go out of the tile (C) to be scaled, as above.
constexpr int kAmxRows = 16;  // rows per pass: a tile's rows
constexpr int64_t kAhead = 2;  // groups prefetched ahead (a pass is latency-bound on cold codes)

struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tile 0: R rows of x over one group [R, 32 bf16]; 1, 2: (q - 8) of columns 0-15 / 16-31
// [16 pairs, 32 bf16]; 3, 4: their fp32 sums [R, 16]
RILLET_AMX void amx_config(int rows) {
  TileConfig c;
  for (int i = 0; i < 5; ++i) {
    c.colsb[i] = 64;
    c.rows[i] = (i == 1 || i == 2) ? 16 : rows;
  }
  _tile_loadconfig(&c);
}

RILLET_AMX void amx_tile_pair(const Args& a, int64_t t, int64_t m0, int R) {
  const __m512i lut = _mm512_loadu_si512(a.lut);
  const uint8_t* pk = a.packed + t * a.G * 16 * kTile;
  const uint16_t* sz = a.sz + t * a.G * 2 * kTile;
  const uint16_t* x = a.x + m0 * a.K;
  alignas(64) uint16_t b[2][16][32];
  alignas(64) float c[2][kAmxRows][16];
  alignas(64) float y[kAmxRows][kTile];
  std::memset(y, 0, sizeof(float) * R * kTile);
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* pg = pk + g * 16 * kTile;
    if (g + kAhead < a.G) {  // the codes of a group kAhead on: its 512 bytes, 8 lines
      for (int l = 0; l < 8; ++l) _mm_prefetch(reinterpret_cast<const char*>(pg + (kAhead * 16 + 2 * l) * kTile), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(sz + (g + kAhead) * 2 * kTile), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(sz + (g + kAhead) * 2 * kTile + 32), _MM_HINT_T0);
    }
    for (int p = 0; p < 16; ++p) {
      _mm512_store_si512(b[0][p], reinterpret_cast<__m512i>(unpack_pairs(pg + p * kTile, lut)));
      _mm512_store_si512(b[1][p], reinterpret_cast<__m512i>(unpack_pairs(pg + p * kTile + 16, lut)));
    }
    _tile_zero(3);
    _tile_zero(4);
    _tile_loadd(0, x + g * kGroup, a.K * 2);
    _tile_loadd(1, b[0], 64);
    _tile_loadd(2, b[1], 64);
    _tile_dpbf16ps(3, 0, 1);
    _tile_dpbf16ps(4, 0, 2);
    _tile_stored(3, c[0], 64);
    _tile_stored(4, c[1], 64);
    const uint16_t* s = sz + g * 2 * kTile;
    const __m512 s0 = widen_bf16(s), s1 = widen_bf16(s + 16);
    const __m512 z0 = widen_bf16(s + 32), z1 = widen_bf16(s + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 xs = _mm512_set1_ps(a.xsum[(m0 + r) * a.G + g]);
      const __m512 c0 = _mm512_load_ps(c[0][r]), c1 = _mm512_load_ps(c[1][r]);
      _mm512_store_ps(y[r], _mm512_fmadd_ps(z0, xs, _mm512_fmadd_ps(s0, c0, _mm512_load_ps(y[r]))));
      _mm512_store_ps(y[r] + 16, _mm512_fmadd_ps(z1, xs, _mm512_fmadd_ps(s1, c1, _mm512_load_ps(y[r] + 16))));
    }
  }
  uint16_t* out = a.out + m0 * a.N + t * kTile;
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * a.N), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_load_ps(y[r]))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * a.N + 16), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_load_ps(y[r] + 16))));
  }
}

RILLET_AMX void amx_tile_pairs(const Args& a, int64_t t0, int64_t t1, int64_t M) {
  for (int64_t m0 = 0; m0 < M; m0 += kAmxRows) {
    const int R = int(std::min<int64_t>(kAmxRows, M - m0));
    amx_config(R);
    for (int64_t t = t0; t < t1; ++t) amx_tile_pair(a, t, m0, R);
  }
  _tile_release();
}

// Whether this CPU has AMX-BF16 tiles and Linux lets this process use them (asked once).
bool amx_usable() {
  static const bool ok = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!((edx >> 22) & 1) || !((edx >> 24) & 1)) return false;  // AMX-BF16, AMX-TILE
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ok;
}

uint16_t bf16_bits(float f) {  // exact for the small integers it is given
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return uint16_t(b >> 16);
}

bool supported() { return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw"); }

at::Tensor rows_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t n, bool amx) {
  TORCH_CHECK(supported(), "rillet::int4_rows_mm needs a CPU with AVX512-BF16");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "x must be [M, K] bfloat16");
  TORCH_CHECK(packed.scalar_type() == at::kByte && sz.scalar_type() == at::kBFloat16, "packed uint8, sz bfloat16");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), G = K / kGroup;
  TORCH_CHECK(K % kGroup == 0 && n % kTile == 0, "K and N must be multiples of 32");
  TORCH_CHECK(packed.numel() == n * K / 2 && sz.numel() == n * G * 2, "packed or sz does not fit [N, K]");
  at::Tensor out = at::empty({M, n}, xc.options());
  if (M == 0) return out;
  const uint16_t* xb = reinterpret_cast<const uint16_t*>(xc.data_ptr());
  std::vector<float> xsum(M * G);
  group_sums(xb, M, K, xsum.data());
  uint16_t lut[32];
  for (int q = 0; q < 32; ++q) lut[q] = bf16_bits(float((q & 15) - 8));
  const Args a{xb, xsum.data(), packed.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(sz.data_ptr()), lut,
               reinterpret_cast<uint16_t*>(out.data_ptr()), K, G, n};
  at::parallel_for(0, n / kTile, 1, [&](int64_t t0, int64_t t1) {
    if (amx) return amx_tile_pairs(a, t0, t1, M);
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) kTileFns[std::min<int64_t>(kMaxRows, M - m0)](a, t, m0);
  });
  return out;
}

// Through tiles wherever they may run, one row included: inside a compiled step a row through them
// cost less than through vdpbf16ps (bench/RESULTS.md, 2026-12-04), and a row's bits then do not
// depend on its batch (one path for every row count).
at::Tensor int4_rows_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t n) {
  return rows_mm(x, packed, sz, n, amx_usable());
}

// One path named (tests and benchmarks): AMX tiles or AVX512-BF16 alone.
at::Tensor int4_rows_mm_with(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t n, bool amx) {
  TORCH_CHECK(!amx || amx_usable(), "rillet::int4_rows_mm_with: this CPU (or Linux) lets this process use no AMX tiles");
  return rows_mm(x, packed, sz, n, amx);
}

}  // namespace

TORCH_LIBRARY(rillet, m) {
  m.def("int4_rows_mm(Tensor x, Tensor packed, Tensor sz, int n) -> Tensor");
  m.def("int4_rows_mm_with(Tensor x, Tensor packed, Tensor sz, int n, bool amx) -> Tensor");
}

TORCH_LIBRARY_IMPL(rillet, CPU, m) {
  m.impl("int4_rows_mm", &int4_rows_mm);
  m.impl("int4_rows_mm_with", &int4_rows_mm_with);
}
