// What the CPU kernel files share (model/kernels/kernels.cpp, int8.cpp, search.cpp, fused.cpp);
// one extension module, defined in kernels.cpp.
//
// Only ATen's Tensor here: <torch/extension.h> (pybind11, the whole C++ API) takes ~30 s to parse,
// so only the files that define Python bindings (kernels.cpp, fused.cpp) include it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace nmt {

// ---- kernels.cpp -------------------------------------------------------------------------

// the smallest and largest of x[0 .. n)
std::pair<float, float> min_max(const float* x, int64_t n);

// softmax(q k^T / sqrt(Dh) + bias) v for a few queries per (batch, head); see kernels.cpp
std::vector<at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const c10::optional<at::Tensor>& bias, bool need_weights,
                                  const c10::optional<at::Tensor>& rows);

// an encoder's self-attention over packed sentences: qkv (T, 3 * D) float32, sentence b in rows
// starts[b] .. starts[b + 1] (B + 1,); each token attends to its own sentence -> (T, D); see kernels.cpp
at::Tensor packed_self_attention(const at::Tensor& qkv, const at::Tensor& starts, int64_t n_heads);

// the m best log-probabilities of each row of logits (N, V) and their columns, banned columns skipped
std::vector<at::Tensor> row_top(const at::Tensor& logits, int64_t m, const std::vector<int64_t>& banned);

// ---- int8.cpp ----------------------------------------------------------------------------

enum class Int8Path { kAvx512Vnni, kAvx2, kScalar };

std::vector<Int8Path> runnable_int8_paths();  // best first
Int8Path best_int8_path();
int int8_levels(Int8Path path);  // activations are quantized to 0 .. levels
const char* int8_path_name(Int8Path path);
Int8Path int8_path_named(const std::string& name);

// an int8 weight (N, K) in the packed layout, with its per-feature scale and scale * row sum
struct Int8Weight {
  const int8_t* q;  // (N/16, K4, 16, 4)
  const float* scale;
  const float* qsum;
  const float* bias;  // or null
  int64_t N, K4;
};

// M rows quantized for one path: a (M, row_bytes) in 0 .. levels, x ~ lo + step * a; on the AVX2
// path a holds a - 127 as signed bytes and lo is moved up by 127 steps (int8.cpp, tile_avx2)
struct QuantizedRows {
  Int8Path path = Int8Path::kScalar;
  int64_t row_bytes = 0;
  std::vector<uint8_t> a;
  std::vector<float> step, lo;
};

// what happens to a product before it is stored: added to what y holds (a residual), ReLU
struct Epilogue {
  bool relu = false;
  bool accumulate = false;
};

void quantize_rows(const float* x, int64_t M, int64_t K, int64_t ldx, Int8Path path, QuantizedRows& out);
// y (M, N), ldy floats between rows: x W^T + b, then the epilogue
void int8_matmul(const QuantizedRows& x, int64_t M, const Int8Weight& w, float* y, int64_t ldy, const Epilogue& e);
Int8Weight int8_weight(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& qsum,
                       const c10::optional<at::Tensor>& bias);
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& qsum,
                       const c10::optional<at::Tensor>& bias, bool relu, const std::string& path);

// ---- search.cpp --------------------------------------------------------------------------

// one step of beam search after the decoder (model/search.py, select): candidates, the pool of
// finished hypotheses, the beams that continue; and whether a sentence is done, whether the
// beams kept their order
std::tuple<std::vector<at::Tensor>, bool, bool> beam_step(const at::Tensor& logits, const at::Tensor& run_scores,
                                                          const at::Tensor& pool_scores, const at::Tensor& pool_ref,
                                                          const at::Tensor& max_len, int64_t t,
                                                          const std::vector<int64_t>& banned, int64_t eos_id,
                                                          double length_penalty,
                                                          const c10::optional<at::Tensor>& steps);

}  // namespace nmt
