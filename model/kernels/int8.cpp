// Int8 matrix products for inference on the CPU: y = x W^T + b, with W in int8 (one scale per output
// feature, symmetric) and x quantized row by row as it comes (by its own minimum and step, unsigned):
//
//   x[m, k] ~ lo_m + step_m * a[m, k]     a in [0, levels],  step_m = (max_k x[m, k] - lo_m) / levels
//   W[n, k] ~ scale_n * q[n, k]           q in [-127, 127]
//   y[m, n] = step_m * scale_n * sum_k a[m, k] q[n, k] + lo_m * qsum_n + b_n,   qsum_n = scale_n * sum_k q[n, k]
//
// The integer sum is exact (int32), so a row's result depends on that row alone, never on the rows it
// is batched with. Paths, chosen by what the CPU runs:
//   avx512_vnni  vpdpbusd: 64 byte products summed into 16 int32 per instruction; levels 255
//   avx2         vpmaddubsw + vpmaddwd on |q| and sign(q) * c, the activations centred as signed bytes
//                (c = a - 127 in -127 .. 127, lo moved up by 127 steps): levels 254
//   scalar       portable C++; levels 255
//
// Weight layout (model/cpu/weights.py, pack_int8): (N/16, K/4, 16, 4) int8, N and K padded with zeros:
// for each block of 16 output features and each group of 4 inputs, 64 bytes holding 4 consecutive
// weights of each of the 16 features. That is one 512-bit register, which vpdpbusd multiplies with 4
// bytes of an activation row broadcast to every lane.

#include "kernels.h"

#include <ATen/ops/empty.h>

#include <ATen/Parallel.h>

// the vector paths are x86 code; elsewhere (ARM) only the portable one is built
#if defined(__x86_64__) || defined(_M_X64)
#define NMT_X86 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace nmt {
namespace {

// what a tile writes: y = result (+ y when accumulating, a residual connection), then ReLU if asked
struct TileArgs {
  const uint8_t* a;        // MR rows of quantized activations, lda bytes apart
  int64_t lda;
  const float* step;       // their steps and minima (MR each)
  const float* lo;
  const int8_t* w;         // J blocks of 16 output features, w_stride bytes apart
  int64_t w_stride;
  int64_t K4;              // groups of 4 inputs
  const float* scale;      // scale, qsum, bias of the J * 16 features (bias may be null)
  const float* qsum;
  const float* bias;
  float* y;                // MR output rows, ldy floats apart, `cols` valid columns (<= J * 16)
  int64_t ldy;
  int64_t cols;
  Epilogue epilogue;
};

inline float finish(float acc, float step, float scale, float lo, float qsum, float bias, float before,
                    const Epilogue& e) {
  float v = std::fma(acc, step * scale, std::fma(lo, qsum, bias));
  if (e.accumulate) v += before;
  return e.relu ? std::max(v, 0.f) : v;
}

#ifdef NMT_X86
// ---- AVX-512 VNNI ----------------------------------------------------------------------------

template <int MR, int J>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"))) void tile_vnni(const TileArgs& t) {
  // every loop over rows and blocks unrolled, so that the accumulators live in registers (GCC 12
  // left them partly on the stack: 155 -> 190 GMAC/s at 128 rows)
  __m512i acc[MR][J];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) acc[m][j] = _mm512_setzero_si512();
  for (int64_t k = 0; k < t.K4; ++k) {
    __m512i w[J];
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) w[j] = _mm512_loadu_si512(t.w + j * t.w_stride + k * 64);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      int32_t four;  // a[m, 4k .. 4k + 3]
      std::memcpy(&four, t.a + m * t.lda + 4 * k, 4);
      const __m512i x = _mm512_set1_epi32(four);
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], x, w[j]);
    }
  }
  for (int j = 0; j < J; ++j) {
    const int64_t n = 16 * j;
    if (n >= t.cols) break;
    const __mmask16 mask = t.cols - n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (t.cols - n)) - 1);
    const __m512 scale = _mm512_maskz_loadu_ps(mask, t.scale + n), qsum = _mm512_maskz_loadu_ps(mask, t.qsum + n);
    const __m512 bias = t.bias ? _mm512_maskz_loadu_ps(mask, t.bias + n) : _mm512_setzero_ps();
    for (int m = 0; m < MR; ++m) {
      float* y = t.y + m * t.ldy + n;
      const __m512 offset = _mm512_fmadd_ps(_mm512_set1_ps(t.lo[m]), qsum, bias);
      __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m][j]), _mm512_mul_ps(_mm512_set1_ps(t.step[m]), scale), offset);
      if (t.epilogue.accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, y));
      if (t.epilogue.relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
      _mm512_mask_storeu_ps(y, mask, v);
    }
  }
}

// ---- AVX2 ------------------------------------------------------------------------------------

// one block of 16 features (two 256-bit halves of 8) for MR rows.
//
// vpmaddubsw multiplies unsigned bytes by signed ones and sums each pair into a saturating int16:
// a * q (a up to 254, |q| up to 127) could reach 2 * 254 * 127 there. So on this path the rows hold
// their activations centred, c = a - 127 in -127 .. 127 (quantize_rows), multiplied as
// |q| * (sign(q) * c): a pair is then at most 2 * 127 * 127, which fits.
template <int MR, int J>
__attribute__((target("avx2,fma"))) void tile_avx2(const TileArgs& t) {
  static_assert(J == 1, "AVX2 tiles are one block wide");
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[MR][2];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
  for (int64_t k = 0; k < t.K4; ++k) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.w + k * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.w + k * 64 + 32));
    const __m256i size0 = _mm256_abs_epi8(w0), size1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      int32_t four;  // c[m, 4k .. 4k + 3], signed bytes
      std::memcpy(&four, t.a + m * t.lda + 4 * k, 4);
      const __m256i c = _mm256_set1_epi32(four);
      // |q| * sign(q) c, byte pairs -> int16 (at most 2 * 127 * 127), int16 pairs -> int32
      acc[m][0] = _mm256_add_epi32(acc[m][0], _mm256_madd_epi16(_mm256_maddubs_epi16(size0, _mm256_sign_epi8(c, w0)), ones));
      acc[m][1] = _mm256_add_epi32(acc[m][1], _mm256_madd_epi16(_mm256_maddubs_epi16(size1, _mm256_sign_epi8(c, w1)), ones));
    }
  }
  // finish() eight features at a time, the same operations in the same order
  for (int half = 0; half < 2; ++half) {
    const int64_t n = 8 * half;
    if (n >= t.cols) break;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(8, t.cols - n))),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 scale = _mm256_maskload_ps(t.scale + n, mask), qsum = _mm256_maskload_ps(t.qsum + n, mask);
    const __m256 bias = t.bias ? _mm256_maskload_ps(t.bias + n, mask) : _mm256_setzero_ps();
    for (int m = 0; m < MR; ++m) {
      float* y = t.y + m * t.ldy + n;
      const __m256 offset = _mm256_fmadd_ps(_mm256_set1_ps(t.lo[m]), qsum, bias);
      __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][half]), _mm256_mul_ps(_mm256_set1_ps(t.step[m]), scale), offset);
      if (t.epilogue.accumulate) v = _mm256_add_ps(v, _mm256_maskload_ps(y, mask));
      if (t.epilogue.relu) v = _mm256_max_ps(v, _mm256_setzero_ps());
      _mm256_maskstore_ps(y, mask, v);
    }
  }
}

#endif  // NMT_X86

// ---- portable ----------------------------------------------------------------------------------

template <int MR, int J>
void tile_scalar(const TileArgs& t) {
  static_assert(J == 1, "portable tiles are one block wide");
  for (int m = 0; m < MR; ++m) {
    int32_t acc[16] = {0};
    for (int64_t k = 0; k < t.K4; ++k) {
      const uint8_t* a = t.a + m * t.lda + 4 * k;
      const int8_t* w = t.w + k * 64;
      for (int n = 0; n < 16; ++n)
        for (int i = 0; i < 4; ++i) acc[n] += static_cast<int32_t>(a[i]) * w[4 * n + i];
    }
    float* y = t.y + m * t.ldy;
    for (int64_t n = 0; n < std::min<int64_t>(t.cols, 16); ++n)
      y[n] = finish(static_cast<float>(acc[n]), t.step[m], t.scale[n], t.lo[m], t.qsum[n], t.bias ? t.bias[n] : 0.f,
                    y[n], t.epilogue);
  }
}

// ---- the driver ------------------------------------------------------------------------------

#ifdef NMT_X86
template <int MR, int J>
struct VnniTile {
  static void run(const TileArgs& t) { tile_vnni<MR, J>(t); }
};
template <int MR, int J>
struct Avx2Tile {
  static void run(const TileArgs& t) { tile_avx2<MR, J>(t); }
};
#endif
template <int MR, int J>
struct ScalarTile {
  static void run(const TileArgs& t) { tile_scalar<MR, J>(t); }
};

// a tile of `rows` (< MR) rows: the template for that row count
template <int MR, int J, template <int, int> class Tile>
void run_rows(int64_t rows, const TileArgs& t) {
  if constexpr (MR > 1) {
    if (rows < MR) return run_rows<MR - 1, J, Tile>(rows, t);
  }
  Tile<MR, J>::run(t);
}

// Rows in tiles of MR (the last one smaller), features in groups of J blocks of 16. A group of
// blocks is the outer loop: its weights (J * 16 * K bytes) stay in cache while every row tile
// passes them.
template <int MR, int J, template <int, int> class Tile>
void gemm_blocks(const QuantizedRows& x, int64_t M, const Int8Weight& w, float* y, int64_t ldy, const Epilogue& e,
                 int64_t block_begin, int64_t block_end) {
  const int64_t w_stride = w.K4 * 64;
  for (int64_t b = block_begin; b < block_end; b += J) {
    const int64_t blocks = std::min<int64_t>(J, block_end - b), n = 16 * b;
    TileArgs t{nullptr, x.row_bytes, nullptr, nullptr, w.q + b * w_stride, w_stride, w.K4, w.scale + n, w.qsum + n,
               w.bias ? w.bias + n : nullptr, nullptr, ldy, std::min<int64_t>(16 * blocks, w.N - n), e};
    for (int64_t m = 0; m < M; m += MR) {
      t.a = x.a.data() + m * x.row_bytes;
      t.step = x.step.data() + m;
      t.lo = x.lo.data() + m;
      t.y = y + m * ldy + n;
      const int64_t rows = std::min<int64_t>(MR, M - m);
      if (blocks == J) {
        run_rows<MR, J, Tile>(rows, t);
      } else if constexpr (J > 1) {  // the last, narrower group: one block at a time
        for (int64_t i = 0; i < blocks; ++i) {
          TileArgs one = t;
          one.w += i * w_stride, one.scale += 16 * i, one.qsum += 16 * i, one.y += 16 * i;
          one.bias = t.bias ? t.bias + 16 * i : nullptr;
          one.cols = std::min<int64_t>(16, w.N - n - 16 * i);
          run_rows<MR, 1, Tile>(rows, one);
        }
      }
    }
  }
}

void gemm(const QuantizedRows& x, int64_t M, const Int8Weight& w, float* y, int64_t ldy, const Epilogue& e,
          int64_t block_begin, int64_t block_end) {
  switch (x.path) {
#ifdef NMT_X86
    case Int8Path::kAvx512Vnni: return gemm_blocks<4, 4, VnniTile>(x, M, w, y, ldy, e, block_begin, block_end);
    case Int8Path::kAvx2: return gemm_blocks<4, 1, Avx2Tile>(x, M, w, y, ldy, e, block_begin, block_end);
#endif
    default: return gemm_blocks<2, 1, ScalarTile>(x, M, w, y, ldy, e, block_begin, block_end);
  }
}

}  // namespace

std::vector<Int8Path> runnable_int8_paths() {
  std::vector<Int8Path> paths;
#ifdef NMT_X86
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    paths.push_back(Int8Path::kAvx512Vnni);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) paths.push_back(Int8Path::kAvx2);
#endif
  paths.push_back(Int8Path::kScalar);
  return paths;
}

Int8Path best_int8_path() {
  // NMT_INT8_PATH names another path this CPU runs (measuring the AVX2 path on an AVX-512 CPU, say)
  static const Int8Path best = [] {
    const char* forced = std::getenv("NMT_INT8_PATH");
    return forced && *forced ? int8_path_named(forced) : runnable_int8_paths().front();
  }();
  return best;
}

int int8_levels(Int8Path path) { return path == Int8Path::kAvx2 ? 254 : 255; }  // AVX2: a - 127 is a signed byte

const char* int8_path_name(Int8Path path) {
  switch (path) {
    case Int8Path::kAvx512Vnni: return "avx512_vnni";
    case Int8Path::kAvx2: return "avx2";
    default: return "scalar";
  }
}

Int8Path int8_path_named(const std::string& name) {
  std::string runnable;
  for (Int8Path path : runnable_int8_paths()) {
    if (name == int8_path_name(path)) return path;
    runnable += std::string(runnable.empty() ? "" : ", ") + int8_path_name(path);
  }
  TORCH_CHECK(false, "int8 path ", name, " does not run on this CPU; it runs ", runnable);
}

void quantize_rows(const float* x, int64_t M, int64_t K, int64_t ldx, Int8Path path, QuantizedRows& out) {
  out.path = path;
  out.row_bytes = (K + 3) / 4 * 4;
  out.a.resize(M * out.row_bytes);  // a reused buffer keeps its memory: no allocation per product
  out.step.resize(M);
  out.lo.resize(M);
  const float levels = static_cast<float>(int8_levels(path));
  // AVX2 keeps c = a - 127 as a signed byte (tile_avx2), so x ~ (lo + 127 step) + step c
  const int centre = path == Int8Path::kAvx2 ? 127 : 0;
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * ldx;
    const auto [lo, hi] = min_max(row, K);
    const float span = hi - lo;
    const float inv = span > 0 ? levels / span : 0.f;
    uint8_t* a = out.a.data() + m * out.row_bytes;
    for (int64_t k = 0; k < K; ++k) {  // round half up: every value here is >= 0
      a[k] = static_cast<uint8_t>(static_cast<int>(std::min(levels, (row[k] - lo) * inv + 0.5f)) - centre);
    }
    std::fill(a + K, a + out.row_bytes, 0);  // padding inputs are 0 (their weights are 0 too)
    out.step[m] = span / levels;
    out.lo[m] = std::fma(static_cast<float>(centre), out.step[m], lo);  // one rounding in every build (-mfma or not)
  }
}

void int8_matmul(const QuantizedRows& x, int64_t M, const Int8Weight& w, float* y, int64_t ldy, const Epilogue& e) {
  TORCH_CHECK(x.row_bytes == w.K4 * 4, "activations have ", x.row_bytes, " inputs a row, the weight ", w.K4 * 4);
  const int64_t blocks = (w.N + 15) / 16;
  // at least ~256k multiply-adds per task, else threads cost more than they save
  const int64_t grain = std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(1, M * w.K4 * 64));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) { gemm(x, M, w, y, ldy, e, begin, end); });
}

Int8Weight int8_weight(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& qsum,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 16 && q.size(3) == 4 && q.scalar_type() == at::kChar && q.is_contiguous(),
              "q must be packed int8 (N/16, K/4, 16, 4)");
  const int64_t N = scale.numel();
  TORCH_CHECK(scale.scalar_type() == at::kFloat && qsum.scalar_type() == at::kFloat && qsum.numel() == N &&
                  scale.is_contiguous() && qsum.is_contiguous() && (N + 15) / 16 == q.size(0),
              "scale and qsum must be float32 with one value per output feature");
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == at::kFloat && bias->numel() == N && bias->is_contiguous()),
              "bias must be float32 with one value per output feature");
  return Int8Weight{q.data_ptr<int8_t>(), scale.data_ptr<float>(), qsum.data_ptr<float>(),
                    bias.has_value() ? bias->data_ptr<float>() : nullptr, N, q.size(1)};
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& qsum,
                       const c10::optional<at::Tensor>& bias, bool relu, const std::string& path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1 && x.device().is_cpu(),
              "x must be a (M, K) float32 CPU tensor with contiguous rows");
  const Int8Weight w = int8_weight(q, scale, qsum, bias);
  TORCH_CHECK((x.size(1) + 3) / 4 == w.K4, "x has ", x.size(1), " inputs a row; the weight takes ", w.K4 * 4);
  thread_local QuantizedRows rows;  // reused call after call (each thread its own)
  quantize_rows(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), path.empty() ? best_int8_path() : int8_path_named(path),
                rows);
  at::Tensor y = at::empty({x.size(0), w.N}, x.options());
  int8_matmul(rows, x.size(0), w, y.data_ptr<float>(), w.N, Epilogue{relu, false});
  return y;
}

}  // namespace nmt
