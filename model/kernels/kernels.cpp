// CPU kernels for the two parts of a decoder step that PyTorch's own CPU ops run far below
// memory speed at these shapes (see model/kernels/__init__.py for the numbers):
//
//   attention  softmax(q k^T / sqrt(Dh) + bias) v for a few queries per (batch, head): the
//              decoder's self-attention over its cache (1 query) and its encoder-decoder
//              attention (the beams of a sentence as queries of one source); and an
//              encoder's self-attention over packed sentences, each token attending to its own
//              sentence only (packed_self_attention: no work for padding).
//   row_top    the m best log-probabilities of each row of logits, and their tokens: a running
//              top m over the row, then the sum of exp for the normalisation (log_softmax is
//              never written out).
//
// The int8 products are in int8.cpp, a beam search step in search.cpp, an int8 model's
// encoder and decoder step as single calls in fused.cpp; this file defines the module of all four.
//
// Arithmetic is float32 whatever the storage type (float, bfloat16, half); exp is ATen's
// vectorised one. Shapes: B batch, H heads, Tq queries, Tk keys, Dh head size, N rows, V vocab.

#include "kernels.h"

#include <torch/extension.h>  // the module

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace nmt {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Vec::size() values of a row, as floats
template <typename T>
inline Vec load_float(const T* p) {
  Vec out;
  at::vec::load_to_float<T>(p, out);
  return out;
}
template <>
inline Vec load_float<float>(const float* p) {
  return Vec::loadu(p);
}

inline float sum_lanes(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, v);
}

// out[i] = sum of the lanes of v[i], for i < kBlock. With AVX-512 a transpose-and-add tree (45
// instructions for 16 sums instead of 8 per sum): scores come 16 keys at a time.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kBlock = 16;
inline void sum_lanes_block(const Vec* v, float* out) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [v2i, v2i+1, v2i, v2i+1] partial sums
    const __m512 x = v[2 * i], y = v[2 * i + 1];
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: [v4i, v4i+1, v4i+2, v4i+3]
    const __m512 x = a[2 * i], y = a[2 * i + 1];
    b[i] = _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 2; ++i) {  // 128-bit lanes of b2i, b2i+1 added in pairs
    const __m512 x = b[2 * i], y = b[2 * i + 1];
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 d = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  _mm512_storeu_ps(out, d);
}
#else
constexpr int64_t kBlock = 1;
inline void sum_lanes_block(const Vec* v, float* out) {
  out[0] = sum_lanes(v[0]);
}
#endif

inline float max_lanes(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }, v);
}

float max_of(const float* x, int64_t n) {
  int64_t i = 0;
  float m = kNegInf;
  if (n >= Vec::size()) {
    Vec vm = Vec::loadu(x);
    for (i = Vec::size(); i + Vec::size() <= n; i += Vec::size()) vm = at::vec::maximum(vm, Vec::loadu(x + i));
    m = max_lanes(vm);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

inline int64_t padded_size(int64_t n) {
  return (n + Vec::size() - 1) / Vec::size() * Vec::size();
}

// sum of exp(x[i] - shift) for i < n; with `out`, also stores each term there
float exp_shifted_sum(const float* x, int64_t n, float shift, float* out) {
  const Vec vshift(shift);
  Vec vsum(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec e = (Vec::loadu(x + i) - vshift).exp_u20();
    if (out) e.store(out + i);
    vsum = vsum + e;
  }
  float sum = sum_lanes(vsum);
  for (; i < n; ++i) {
    const float e = std::exp(x[i] - shift);
    if (out) out[i] = e;
    sum += e;
  }
  return sum;
}

// One head's attention for one query: q (C vectors, already scaled) against keys k + k_off[j] and
// values v + v_off[j] (each Dh = C * Vec::size() values); bias (Tk,) or null.
// s: scratch for Tk floats rounded up to whole vectors (the padding is -inf, so that max and exp
// run on whole vectors), left holding the weights. Writes out[0 .. Dh).
template <int C, typename scalar_t>
void attend_head(const Vec* q, const scalar_t* k, const int64_t* k_off, const scalar_t* v, const int64_t* v_off,
                 const float* bias, int64_t Tk, float* s, float* out) {
  auto dot = [&](int64_t j) {  // the lanes of q . k_j
    const scalar_t* kj = k + k_off[j];
    Vec d = q[0] * load_float(kj);
    for (int c = 1; c < C; ++c) d = at::vec::fmadd(q[c], load_float(kj + c * Vec::size()), d);
    return d;
  };
  int64_t j = 0;
  Vec dots[kBlock];
  for (; j + kBlock <= Tk; j += kBlock) {  // scores: q . k_j / sqrt(Dh)
    for (int64_t u = 0; u < kBlock; ++u) dots[u] = dot(j + u);
    sum_lanes_block(dots, s + j);
  }
  for (; j < Tk; ++j) s[j] = sum_lanes(dot(j));
  if (bias) {
    for (j = 0; j < Tk; ++j) s[j] += bias[j];
  }
  const int64_t padded = padded_size(Tk);
  std::fill(s + Tk, s + padded, kNegInf);
  const float inv = 1.f / exp_shifted_sum(s, padded, max_of(s, padded), s);
  Vec acc[C];
  for (int c = 0; c < C; ++c) acc[c] = Vec(0.f);
  for (j = 0; j < Tk; ++j) {  // out: sum_j w_j v_j
    s[j] *= inv;
    const Vec w(s[j]);
    const scalar_t* vj = v + v_off[j];
    for (int c = 0; c < C; ++c) acc[c] = at::vec::fmadd(w, load_float(vj + c * Vec::size()), acc[c]);
  }
  for (int c = 0; c < C; ++c) acc[c].store(out + c * Vec::size());
}

// q (B, H, Tq, Dh), k and v (B or slots, H, Tk, Dh): any strides, but Dh contiguous and C = Dh /
// Vec::size() a whole number. rows: null, or (B, Tk): key j of entry b is k[rows[b, j], :, j]
// (a decoder cache read through its slot table). bias: undefined or float (B, Tk), added to every
// head's and query's scores (0 or -inf: source padding, or the columns before a row's start). Writes out (B, H, Tq, Dh) and, if not
// null, weights (B, H, Tq, Tk).
template <int C, typename scalar_t>
void attention_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const int64_t* rows,
                    const at::Tensor& bias, at::Tensor& out, float* weights) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Dh = q.size(3), Tk = k.size(2);
  const Vec scale(1.f / std::sqrt(static_cast<float>(Dh)));
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = k.data_ptr<scalar_t>();
  const scalar_t* vp = v.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides();
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(padded_size(Tk));
    std::vector<int64_t> k_off(Tk), v_off(Tk);  // where key / value j of this entry starts
    float o[C * Vec::size()];
    Vec qv[C];
    for (int64_t b = begin; b < end; ++b) {
      // keys masked at the start (-inf: the columns before a running batch's row began) or at the
      // end (source padding) are skipped, not computed: their weight is 0, and the entry's own keys
      // then sum in the order they would alone, unpadded
      int64_t first = 0, last = Tk;
      while (bp && first + 1 < last && bp[b * Tk + first] == kNegInf) ++first;
      while (bp && last - 1 > first && bp[b * Tk + last - 1] == kNegInf) --last;
      const int64_t n = last - first;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = rows ? rows[b * Tk + first + j] : b;
        TORCH_CHECK(0 <= row && row < k.size(0), "rows must index the ", k.size(0), " slots of k and v, got ", row);
        k_off[j] = row * ks[0] + (first + j) * ks[2];
        v_off[j] = row * vs[0] + (first + j) * vs[2];
      }
      // head by head: reading all heads of a position together was slower (128 rows x 30 positions)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < Tq; ++i) {
          const scalar_t* qi = qp + b * qs[0] + h * qs[1] + i * qs[2];
          for (int c = 0; c < C; ++c) qv[c] = load_float(qi + c * Vec::size()) * scale;
          attend_head<C>(qv, kp + h * ks[1], k_off.data(), vp + h * vs[1], v_off.data(),
                         bp ? bp + b * Tk + first : nullptr, n, s.data(), o);
          scalar_t* oi = op + ((b * H + h) * Tq + i) * Dh;
          for (int64_t d = 0; d < Dh; ++d) oi[d] = static_cast<scalar_t>(o[d]);
          if (weights) {
            float* wi = weights + ((b * H + h) * Tq + i) * Tk;
            std::fill(wi, wi + Tk, 0.f);
            std::copy(s.begin(), s.begin() + n, wi + first);
          }
        }
      }
    }
  });
}

// An encoder's self-attention over packed sentences: qkv (T, 3 * D) rows, each a token's q, k, v
// (heads of Dh side by side within each); sentence b holds rows starts[b] .. starts[b + 1].
// Each query attends to its own sentence's keys only, so no padding is computed. Writes out (T, D).
template <int C>
void packed_attention_impl(const float* qkv, const int64_t* starts, int64_t B, int64_t H, int64_t Dh, float* out) {
  const int64_t D = H * Dh, stride = 3 * D;
  const Vec scale(1.f / std::sqrt(static_cast<float>(Dh)));
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s;
    std::vector<int64_t> off;
    Vec qv[C];
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, first = starts[b], n = starts[b + 1] - starts[b];
      s.resize(padded_size(n));
      off.resize(n);
      for (int64_t j = 0; j < n; ++j) off[j] = (first + j) * stride;
      const float* head = qkv + h * Dh;
      for (int64_t i = 0; i < n; ++i) {
        const float* qi = head + (first + i) * stride;
        for (int c = 0; c < C; ++c) qv[c] = Vec::loadu(qi + c * Vec::size()) * scale;
        attend_head<C>(qv, head + D, off.data(), head + 2 * D, off.data(), nullptr, n, s.data(),
                       out + (first + i) * D + h * Dh);
      }
    }
  });
}

#define DISPATCH_STORAGE_TYPES(TYPE, NAME, ...)                                                          \
  switch (TYPE) {                                                                                        \
    case at::kFloat: { using scalar_t = float; __VA_ARGS__(); break; }                                   \
    case at::kBFloat16: { using scalar_t = c10::BFloat16; __VA_ARGS__(); break; }                        \
    case at::kHalf: { using scalar_t = c10::Half; __VA_ARGS__(); break; }                                \
    default: TORCH_CHECK(false, NAME ": float32, bfloat16 or float16 only, got ", TYPE);               \
  }

}  // namespace

std::pair<float, float> min_max(const float* x, int64_t n) {
  float low = x[0], high = x[0];
  int64_t j = 0;
  if (n >= Vec::size()) {
    Vec vlow = Vec::loadu(x), vhigh = vlow;
    for (j = Vec::size(); j + Vec::size() <= n; j += Vec::size()) {
      const Vec v = Vec::loadu(x + j);
      vlow = at::vec::minimum(vlow, v);
      vhigh = at::vec::maximum(vhigh, v);
    }
    low = at::vec::vec_reduce_all([](Vec a, Vec b) { return at::vec::minimum(a, b); }, vlow);
    high = at::vec::vec_reduce_all([](Vec a, Vec b) { return at::vec::maximum(a, b); }, vhigh);
  }
  for (; j < n; ++j) {
    low = std::min(low, x[j]);
    high = std::max(high, x[j]);
  }
  return {low, high};
}

at::Tensor packed_self_attention(const at::Tensor& qkv, const at::Tensor& starts, int64_t n_heads) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && qkv.scalar_type() == at::kFloat && qkv.size(1) % (3 * n_heads) == 0,
              "qkv must be a contiguous float32 (T, 3 * D)");
  TORCH_CHECK(starts.dim() == 1 && starts.is_contiguous() && starts.scalar_type() == at::kLong && starts.size(0) >= 2,
              "starts must be int64 (B + 1,)");
  const int64_t T = qkv.size(0), D = qkv.size(1) / 3, Dh = D / n_heads, B = starts.size(0) - 1, C = Dh / Vec::size();
  const int64_t* st = starts.data_ptr<int64_t>();
  TORCH_CHECK(st[0] == 0 && st[B] == T, "starts must run from 0 to the T rows of qkv");
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK(st[b] <= st[b + 1], "starts must not decrease");
  TORCH_CHECK(Dh % Vec::size() == 0 && (C == 1 || C == 2 || C == 4 || C == 8 || C == 16),
              "the head size must be 1, 2, 4, 8 or 16 times ", Vec::size());
  at::Tensor out = at::empty({T, D}, qkv.options());
  const float* q = qkv.data_ptr<float>();
  float* o = out.data_ptr<float>();
  switch (C) {
    case 1: packed_attention_impl<1>(q, st, B, n_heads, Dh, o); break;
    case 2: packed_attention_impl<2>(q, st, B, n_heads, Dh, o); break;
    case 4: packed_attention_impl<4>(q, st, B, n_heads, Dh, o); break;
    case 8: packed_attention_impl<8>(q, st, B, n_heads, Dh, o); break;
    default: packed_attention_impl<16>(q, st, B, n_heads, Dh, o);
  }
  return out;
}

std::vector<at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const c10::optional<at::Tensor>& bias, bool need_weights,
                                  const c10::optional<at::Tensor>& rows) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, H, T, Dh)");
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(1) == k.size(1) && q.size(3) == k.size(3),
              "q (B, H, Tq, Dh) and k, v (B, H, Tk, Dh) do not match");
  at::Tensor r;
  if (rows.has_value()) {
    r = rows->contiguous();
    TORCH_CHECK(r.scalar_type() == at::kLong && r.dim() == 2 && r.size(0) == q.size(0) && r.size(1) == k.size(2),
                "rows must be int64 (B, Tk)");
  } else {
    TORCH_CHECK(q.size(0) == k.size(0), "q and k, v have different batch sizes (and no rows)");
  }
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "the head dimension must be contiguous");
  const int64_t C = q.size(3) / Vec::size();
  TORCH_CHECK(q.size(3) % Vec::size() == 0 && (C == 1 || C == 2 || C == 4 || C == 8 || C == 16),
              "the head size must be 1, 2, 4, 8 or 16 times ", Vec::size());
  TORCH_CHECK(k.size(2) >= 1, "no keys");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "q, k, v dtypes differ");
  TORCH_CHECK(q.device().is_cpu(), "CPU tensors only");
  at::Tensor b;
  if (bias.has_value()) {
    b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.dim() == 2 && b.size(0) == q.size(0) && b.size(1) == k.size(2), "bias must be (B, Tk)");
  }
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor weights = need_weights ? at::empty({q.size(0), q.size(1), q.size(2), k.size(2)}, q.options().dtype(at::kFloat))
                                    : at::Tensor();
  float* w = need_weights ? weights.data_ptr<float>() : nullptr;
  const int64_t* rp = r.defined() ? r.data_ptr<int64_t>() : nullptr;
  DISPATCH_STORAGE_TYPES(q.scalar_type(), "attention", [&] {
    switch (C) {
      case 1: attention_impl<1, scalar_t>(q, k, v, rp, b, out, w); break;
      case 2: attention_impl<2, scalar_t>(q, k, v, rp, b, out, w); break;
      case 4: attention_impl<4, scalar_t>(q, k, v, rp, b, out, w); break;
      case 8: attention_impl<8, scalar_t>(q, k, v, rp, b, out, w); break;
      default: attention_impl<16, scalar_t>(q, k, v, rp, b, out, w);
    }
  });
  return {out, weights};
}

namespace {

// logits (N, V), rows contiguous. Writes the m best log_softmax values of each row (float32,
// best first) and their columns; the banned columns are skipped but count in the softmax.
// Two passes over a row: the running top m, then the sum of exp(x - max), where the max is the
// best entry or a banned one. Neither pass carries a dependency from one vector to the next
// but through 4 accumulators (a chain of max or add ops would set the pace).
template <typename scalar_t>
void row_top_impl(const at::Tensor& logits, int64_t m, const std::vector<int64_t>& banned, float* values,
                  int64_t* indices) {
  const int64_t N = logits.size(0), V = logits.size(1), row_stride = logits.stride(0);
  const scalar_t* lp = logits.data_ptr<scalar_t>();
  constexpr int none_above = (1 << Vec::size()) - 1;  // zero_mask(): a bit per lane that compares false
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> best(m);
    std::vector<int64_t> at(m);
    float lanes[Vec::size()];
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* row = lp + r * row_stride;
      // running top m, best first; ties keep the lower column first
      int64_t filled = 0;
      float threshold = kNegInf;
      auto offer = [&](int64_t col, float value) {
        if (filled == m && !(value > threshold)) return;
        if (std::find(banned.begin(), banned.end(), col) != banned.end()) return;
        int64_t pos = std::min(filled, m - 1);
        for (; pos > 0 && best[pos - 1] < value; --pos) best[pos] = best[pos - 1], at[pos] = at[pos - 1];
        best[pos] = value, at[pos] = col;
        filled = std::min(filled + 1, m);
        if (filled == m) threshold = best[m - 1];
      };
      int64_t j = 0;
      for (; j < V && (filled < m || j % Vec::size()); ++j) offer(j, static_cast<float>(row[j]));  // fill first
      for (; j + Vec::size() <= V; j += Vec::size()) {
        const Vec x = load_float(row + j);
        if ((x > Vec(threshold)).zero_mask() != none_above) {  // some lane beats the m-th best
          x.store(lanes);
          for (int64_t u = 0; u < Vec::size(); ++u) offer(j + u, lanes[u]);
        }
      }
      for (; j < V; ++j) offer(j, static_cast<float>(row[j]));
      float mx = filled ? best[0] : kNegInf;
      for (int64_t t : banned) mx = std::max(mx, static_cast<float>(row[t]));
      // log sum_j exp(x_j), banned columns included
      const Vec shift(mx);
      Vec sums[4] = {Vec(0.f), Vec(0.f), Vec(0.f), Vec(0.f)};
      for (j = 0; j + 4 * Vec::size() <= V; j += 4 * Vec::size()) {
        for (int u = 0; u < 4; ++u) sums[u] = sums[u] + (load_float(row + j + u * Vec::size()) - shift).exp_u20();
      }
      for (; j + Vec::size() <= V; j += Vec::size()) sums[0] = sums[0] + (load_float(row + j) - shift).exp_u20();
      float sum = sum_lanes((sums[0] + sums[1]) + (sums[2] + sums[3]));
      for (; j < V; ++j) sum += std::exp(static_cast<float>(row[j]) - mx);
      const float log_norm = mx + std::log(sum);
      for (int64_t i = 0; i < m; ++i) {
        values[r * m + i] = i < filled ? best[i] - log_norm : kNegInf;
        indices[r * m + i] = i < filled ? at[i] : 0;
      }
    }
  });
}

}  // namespace

std::vector<at::Tensor> row_top(const at::Tensor& logits, int64_t m, const std::vector<int64_t>& banned) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "logits must be (N, V) with contiguous rows");
  TORCH_CHECK(1 <= m && m <= logits.size(1), "m must be between 1 and V");
  TORCH_CHECK(logits.device().is_cpu(), "CPU tensors only");
  for (int64_t t : banned) TORCH_CHECK(0 <= t && t < logits.size(1), "banned column out of range");
  at::Tensor values = at::empty({logits.size(0), m}, logits.options().dtype(at::kFloat));
  at::Tensor indices = at::empty({logits.size(0), m}, logits.options().dtype(at::kLong));
  DISPATCH_STORAGE_TYPES(logits.scalar_type(), "row_top", [&] {
    row_top_impl<scalar_t>(logits, m, banned, values.data_ptr<float>(), indices.data_ptr<int64_t>());
  });
  return {values, indices};
}

// fused.cpp: adds the Encoder and DecoderStep classes (an int8 model's encoder and decoder step) to
// the module (declared here, not in kernels.h, which leaves pybind11 out)
void define_fused(py::module& module);

}  // namespace nmt

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  // tensors only: each call releases the GIL, so other Python threads run meanwhile
  const auto release = py::call_guard<py::gil_scoped_release>();
  module.def("attention", &nmt::attention, "softmax(q k^T / sqrt(Dh) + bias) v, and the weights if asked",
             py::arg("q"), py::arg("k"), py::arg("v"), py::arg("bias"), py::arg("need_weights"),
             py::arg("rows") = py::none(), release);
  module.def("packed_self_attention", &nmt::packed_self_attention,
             "an encoder's self-attention over packed sentences: qkv (T, 3 * D), sentence b in rows starts[b] .. "
             "starts[b + 1] -> (T, D)", py::arg("qkv"), py::arg("starts"), py::arg("n_heads"), release);
  module.def("row_top", &nmt::row_top, "the m best log-probabilities of each row and their columns", release);
  module.def("beam_step", &nmt::beam_step, "one step of beam search after the decoder (model/search.py)",
             py::arg("logits"), py::arg("run_scores"), py::arg("pool_scores"), py::arg("pool_ref"), py::arg("max_len"),
             py::arg("t"), py::arg("banned"), py::arg("eos_id"), py::arg("length_penalty"),
             py::arg("steps") = py::none(), release);
  module.def("int8_linear", &nmt::int8_linear, "x W^T + b with int8 W and x quantized row by row", py::arg("x"),
             py::arg("q"), py::arg("scale"), py::arg("qsum"), py::arg("bias") = py::none(), py::arg("relu") = false,
             py::arg("path") = "", release);
  module.def("int8_paths", [] {
    std::vector<std::string> names;
    for (nmt::Int8Path path : nmt::runnable_int8_paths()) names.push_back(nmt::int8_path_name(path));
    return names;
  }, "the int8 product paths this CPU runs, fastest first");
  module.def("int8_path", [] { return std::string(nmt::int8_path_name(nmt::best_int8_path())); },
             "the int8 path products take: the fastest, or the one NMT_INT8_PATH names");
  module.def("int8_levels", [](const std::string& path) {
    return nmt::int8_levels(path.empty() ? nmt::best_int8_path() : nmt::int8_path_named(path));
  }, "activations are quantized to 0 .. levels on this path", py::arg("path") = "");
  nmt::define_fused(module);
  module.attr("vector_size") = static_cast<int64_t>(nmt::Vec::size());  // floats per vector register
}
