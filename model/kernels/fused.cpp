// The encoder and the decoder step of a model whose Linear layers are int8 (Int8Linear,
// int8.cpp), each in one call on the CPU: Transformer.encode and Transformer.decode_step of
// model/transformer.py, the same arithmetic bit for bit (the encoder's self-attention aside: here
// kernels.cpp's packed_self_attention, within each sentence; in PyTorch, SDPA over the padding).
//
// In PyTorch a decoder step is ~100 small ops and an encoder layer ~20, each paying Python and
// dispatch costs that do not shrink with the batch: at a few decoder rows they are most of a
// step. Here the embedding, the LayerNorms (ATen's, the PyTorch path's own), the int8 products
// (the residual added and ReLU applied as a product is stored), attention (kernels.cpp's) and
// the output projection run in one call; the encoder runs on the source's tokens alone, packed.
// The decoder step reads and writes the DecoderCache of model/transformer.py exactly as the
// PyTorch step does, so the two can take turns on one cache.
//
// Shapes: B sentences, S source length, N decoder rows, g rows per source, D model width, H heads,
// Dh = D / H, t this step's position, L layers, V vocabulary.

#include "kernels.h"

#include <torch/extension.h>  // the Python classes below

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

namespace nmt {
namespace {

struct Linear {
  at::Tensor q, scale, qsum;  // pack_int8's layout (model/cpu/weights.py)
  c10::optional<at::Tensor> bias;
  Int8Weight weight() const { return int8_weight(q, scale, qsum, bias); }
  int64_t out_features() const { return scale.numel(); }
};
using LinearTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, c10::optional<at::Tensor>>;

struct Norm {
  at::Tensor weight, bias;  // (D,) float32
};

// What the encoder and the decoder share: embeddings, and the arithmetic of sublayers.
class Stack {
 public:
  Stack(bool pre_norm, const std::string& activation, int64_t n_heads, double eps, double embed_scale,
        const at::Tensor& embedding, const at::Tensor& positions, const std::vector<at::Tensor>& norms,
        const std::vector<LinearTensors>& linears)
      : pre_norm_(pre_norm), activation_(activation), H_(n_heads), eps_(eps),
        embed_scale_(static_cast<float>(embed_scale)), embedding_(embedding.contiguous()),
        positions_(positions.contiguous()), D_(embedding.size(1)) {
    TORCH_CHECK(activation == "relu" || activation == "gelu" || activation == "swish", "unknown activation ", activation);
    TORCH_CHECK(embedding_.scalar_type() == at::kFloat && positions_.scalar_type() == at::kFloat,
                "fused calls run float32 models (with int8 Linear layers)");
    TORCH_CHECK(D_ % H_ == 0, "d_model must divide into heads");
    TORCH_CHECK(norms.size() % 2 == 0, "norms: weight and bias of each LayerNorm");
    for (size_t i = 0; i < norms.size(); i += 2) norms_.push_back(Norm{norms[i].contiguous(), norms[i + 1].contiguous()});
    for (const auto& [q, scale, qsum, bias] : linears) linears_.push_back(Linear{q, scale, qsum, bias});
  }

 protected:
  // (B, T) token ids -> (B * T, D): sections 3.4 and 3.5, as Transformer.embed, (embedding * sqrt(D))
  // + the position of each token, start + its index in the row
  at::Tensor embed(const at::Tensor& ids, int64_t start) const {
    TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "ids must be int64 (B, T)");
    const int64_t B = ids.size(0), T = ids.size(1), V = embedding_.size(0), D = D_;
    TORCH_CHECK(start + T <= positions_.size(0), "position ", start + T - 1, " beyond the model's ", positions_.size(0));
    const at::Tensor contiguous_ids = ids.contiguous();
    const int64_t* id = contiguous_ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < B * T; ++i) TORCH_CHECK(0 <= id[i] && id[i] < V, "token ", id[i], " outside the vocabulary of ", V);
    at::Tensor x = at::empty({B * T, D}, ids.options().dtype(at::kFloat));
    float* out = x.data_ptr<float>();
    const float* table = embedding_.data_ptr<float>();
    const float* position = positions_.data_ptr<float>() + start * D;
    for (int64_t i = 0; i < B * T; ++i)
      for (int64_t d = 0; d < D; ++d) out[i * D + d] = table[id[i] * D + d] * embed_scale_ + position[(i % T) * D + d];
    return x;
  }

  // the rows `rows` (T,) of (B, S) token ids -> (T, D): embed's arithmetic for those tokens alone
  // (each at its column's position), for an encoder that skips the padding
  at::Tensor embed_rows(const at::Tensor& ids, const at::Tensor& rows) const {
    TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "ids must be int64 (B, S)");
    const int64_t S = ids.size(1);
    TORCH_CHECK(S <= positions_.size(0), "position ", S - 1, " beyond the model's ", positions_.size(0));
    const at::Tensor picked = ids.contiguous().view({-1}).index_select(0, rows);  // (T,)
    const at::Tensor position = rows.remainder(S);  // (T,) each token's column
    return embed_at(picked, position.data_ptr<int64_t>());
  }

  // (N,) token ids at their own positions (N,) -> (N, D): embed's arithmetic, a row at a time
  at::Tensor embed_at(const at::Tensor& ids, const int64_t* position_of) const {
    const int64_t N = ids.size(0), V = embedding_.size(0), D = D_;
    const int64_t* id = ids.data_ptr<int64_t>();
    at::Tensor x = at::empty({N, D}, ids.options().dtype(at::kFloat));
    float* out = x.data_ptr<float>();
    const float* table = embedding_.data_ptr<float>();
    for (int64_t r = 0; r < N; ++r) {
      TORCH_CHECK(0 <= id[r] && id[r] < V, "token ", id[r], " outside the vocabulary of ", V);
      TORCH_CHECK(0 <= position_of[r] && position_of[r] < positions_.size(0), "position ", position_of[r],
                  " outside the model's ", positions_.size(0));
      const float* position = positions_.data_ptr<float>() + position_of[r] * D;
      for (int64_t d = 0; d < D; ++d) out[r * D + d] = table[id[r] * D + d] * embed_scale_ + position[d];
    }
    return x;
  }

  // out (M, n) = in (M, k) W^T + b: stored, or added to what out holds (a residual); ReLU if asked
  void product(const at::Tensor& in, const Linear& linear, float* out, bool accumulate, bool relu = false) const {
    const Int8Weight w = linear.weight();
    thread_local QuantizedRows rows;  // reused product after product (each thread its own)
    quantize_rows(in.data_ptr<float>(), in.size(0), in.size(1), in.stride(0), best_int8_path(), rows);
    int8_matmul(rows, in.size(0), w, out, w.N, Epilogue{relu, accumulate});
  }

  // ATen's LayerNorm: the PyTorch path's, bit for bit, so that both quantize the same activations
  // (an own LayerNorm differs in the last bits, and now and then that moves an activation across a
  // rounding boundary of the int8 quantization)
  at::Tensor layer_norm(const at::Tensor& x, const Norm& norm) const {
    return at::layer_norm(x, {D_}, norm.weight, norm.bias, eps_);
  }

  // one sublayer around x (M, D): pre-norm x + f(LN(x)), post-norm LN(x + f(x)); f adds its result to x
  template <typename F>
  void sublayer(at::Tensor& x, const Norm& norm, F&& f) const {
    if (pre_norm_) {
      f(layer_norm(x, norm));
    } else {
      f(x);
      x = layer_norm(x, norm);
    }
  }

  // section 3.3: x += act(in W1^T + b1) W2^T + b2
  void feed_forward(const at::Tensor& in, const Linear& w1, const Linear& w2, at::Tensor& x) const {
    at::Tensor hidden = at::empty({in.size(0), w1.out_features()}, in.options());
    product(in, w1, hidden.data_ptr<float>(), false, activation_ == "relu");
    if (activation_ == "gelu") hidden = at::gelu(hidden);
    if (activation_ == "swish") hidden = at::silu(hidden);
    product(hidden, w2, x.data_ptr<float>(), true);
  }

  bool pre_norm_;
  std::string activation_;
  int64_t H_;
  double eps_;
  float embed_scale_;
  at::Tensor embedding_, positions_;
  int64_t D_;
  std::vector<Norm> norms_;
  std::vector<Linear> linears_;
};

// Transformer.encode: per layer 2 LayerNorms (self-attention, feed-forward) and 4 Linear layers
// (qkv, out, w1, w2), then the final LayerNorm of a pre-norm stack.
class Encoder : Stack {
 public:
  Encoder(bool pre_norm, const std::string& activation, int64_t n_heads, double eps, double embed_scale, int64_t pad_id,
          const at::Tensor& embedding, const at::Tensor& positions, const std::vector<at::Tensor>& norms,
          const std::vector<LinearTensors>& linears)
      : Stack(pre_norm, activation, n_heads, eps, embed_scale, embedding, positions, norms, linears), pad_id_(pad_id) {
    const size_t L = linears_.size() / 4;
    TORCH_CHECK(L >= 1 && linears_.size() == 4 * L, "4 Linear layers per encoder layer");
    TORCH_CHECK(norms_.size() == 2 * L + (pre_norm ? 1 : 0), "2 LayerNorms per layer, and a final one for pre-norm");
  }

  // src (B, S) PAD-padded ids -> memory (B, S, D) and src_mask (B, 1, 1, S), True at tokens.
  // The T source tokens run packed, (T, D), sentence after sentence: the row-wise ops (the int8
  // products, their rows quantized one by one; the LayerNorms; the activations) as they would
  // padded, bit for bit, and self-attention within each sentence (kernels.cpp,
  // packed_self_attention), so a batch of unlike lengths does no work for its padding. memory is 0
  // at padding, which the mask keeps out of every attention that reads it.
  std::vector<at::Tensor> forward(const at::Tensor& src) const {
    const int64_t B = src.size(0), S = src.size(1), D = D_;
    const at::Tensor mask = src.ne(pad_id_).view({B, 1, 1, S});
    const at::Tensor tokens = mask.reshape({B * S}).nonzero().view({-1});  // (T,) their rows in (B * S)
    const int64_t T = tokens.size(0);
    at::Tensor starts = at::zeros({B + 1}, src.options());  // (B + 1,) sentence b: rows starts[b] .. starts[b + 1]
    starts.slice(0, 1).copy_(mask.view({B, S}).sum(1).cumsum(0));
    at::Tensor x = embed_rows(src, tokens);  // (T, D)
    at::Tensor qkv = at::empty({T, 3 * D}, x.options());
    for (size_t l = 0; l < linears_.size() / 4; ++l) {
      const Linear* linear = &linears_[4 * l];  // qkv, out, w1, w2
      sublayer(x, norms_[2 * l], [&](const at::Tensor& in) {  // self-attention within each sentence
        product(in, linear[0], qkv.data_ptr<float>(), false);
        product(packed_self_attention(qkv, starts, H_), linear[1], x.data_ptr<float>(), true);
      });
      sublayer(x, norms_[2 * l + 1], [&](const at::Tensor& in) { feed_forward(in, linear[2], linear[3], x); });
    }
    if (pre_norm_) x = layer_norm(x, norms_.back());
    return {at::zeros({B * S, D}, x.options()).index_copy_(0, tokens, x).view({B, S, D}), mask};
  }

 private:
  int64_t pad_id_;
};

// Transformer.decode_step: per layer 3 LayerNorms (self-attention, encoder-decoder attention,
// feed-forward) and 6 Linear layers (qkv, self out, cross q, cross out, w1, w2), the final
// LayerNorm of a pre-norm stack, then the output projection.
class DecoderStep : Stack {
 public:
  using Stack::Stack;

  void check() const {
    const size_t L = (linears_.size() - 1) / 6;
    TORCH_CHECK(L >= 1 && linears_.size() == 6 * L + 1, "6 Linear layers per decoder layer, then the output projection");
    TORCH_CHECK(norms_.size() == 3 * L + (pre_norm_ ? 1 : 0), "3 LayerNorms per layer, and a final one for pre-norm");
    for (size_t l = 0; l < L; ++l)
      TORCH_CHECK(linears_[6 * l].out_features() == 3 * D_, "layer ", l, ": qkv must have 3 * d_model outputs");
  }

  // tokens (N,) int64; self_kv (slots, capacity, L, 2, H, Dh) float32; slot (N,); table (N,
  // capacity) int64, contiguous; cross_kv: per layer its keys and values (N/g, H, S, Dh);
  // src_bias (N/g, S) float32; position: none (every row writes position t and reads 0..t), or (N,)
  // int64, the position each row writes (a running batch's: rows at their own positions, each
  // reading its own 0..position; t is then ignored); entry: none (cross_kv (N/g, H, S, Dh)), or
  // (N/g,) int64, the entry of a pool cross_kv (P, H, S' >= S, Dh) that each source reads (a
  // running batch's). Writes this step's keys and values into self_kv and table; returns logits
  // (N, V) and, if asked, the encoder-decoder attention (L, N, H, S).
  // With a shortlist (the output projection's rows of V' target ids: model/shortlist.py), logits
  // (N, V') of those ids alone.
  std::vector<at::Tensor> forward(const at::Tensor& tokens, int64_t t, at::Tensor self_kv, const at::Tensor& slot,
                                  at::Tensor table, const std::vector<at::Tensor>& cross_kv, const at::Tensor& src_bias,
                                  int64_t group, bool need_weights,
                                  const c10::optional<LinearTensors>& shortlist_output,
                                  const c10::optional<at::Tensor>& position,
                                  const c10::optional<at::Tensor>& entry) const {
    const int64_t N = tokens.size(0), D = D_, H = H_, Dh = D / H, L = static_cast<int64_t>(linears_.size() / 6);
    const int64_t capacity = self_kv.size(1);
    TORCH_CHECK(slot.scalar_type() == at::kLong && table.scalar_type() == at::kLong, "slot and table must be int64");
    TORCH_CHECK(self_kv.is_contiguous() && self_kv.scalar_type() == at::kFloat && self_kv.dim() == 6 &&
                    self_kv.size(2) == L && self_kv.size(3) == 2 && self_kv.size(4) == H && self_kv.size(5) == Dh,
                "self_kv must be a contiguous float32 (slots, capacity, L, 2, H, Dh) cache");
    TORCH_CHECK(table.is_contiguous() && table.size(0) == N && table.size(1) == capacity && slot.numel() == N,
                "table must be a contiguous (N, capacity) and slot an (N,) tensor");
    TORCH_CHECK(cross_kv.size() == static_cast<size_t>(2 * L), "cross_kv: keys and values of each layer");
    TORCH_CHECK(group >= 1 && N % group == 0 && src_bias.size(0) == N / group, "N rows must be N / group sources");
    TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.dim() == 1, "tokens must be int64 (N,)");
    const int64_t* slots = slot.data_ptr<int64_t>();
    for (int64_t r = 0; r < N; ++r)
      TORCH_CHECK(0 <= slots[r] && slots[r] < self_kv.size(0), "slot ", slots[r], " outside the cache");

    std::vector<int64_t> write_at(N, t);  // the position each row writes
    if (position.has_value()) {
      TORCH_CHECK(position->scalar_type() == at::kLong && position->is_contiguous() && position->numel() == N,
                  "position must be a contiguous int64 (N,) tensor");
      std::copy(position->data_ptr<int64_t>(), position->data_ptr<int64_t>() + N, write_at.begin());
    }
    int64_t T = 0;  // positions read: 0 .. the furthest row's
    for (int64_t r = 0; r < N; ++r) {
      TORCH_CHECK(0 <= write_at[r] && write_at[r] < capacity, "position ", write_at[r], " outside the cache's ", capacity);
      T = std::max(T, write_at[r] + 1);
    }
    at::Tensor x = position.has_value() ? embed_at(tokens.contiguous(), write_at.data()) : embed(tokens.view({N, 1}), t);
    at::Tensor self_bias;  // (N, T): -inf past each row's own position, or none (all rows at t)
    if (position.has_value()) {
      self_bias = at::zeros({N, T}, at::kFloat);
      float* bias_of = self_bias.data_ptr<float>();
      for (int64_t r = 0; r < N; ++r)
        std::fill(bias_of + r * T + write_at[r] + 1, bias_of + (r + 1) * T, -std::numeric_limits<float>::infinity());
    }
    int64_t* tab = table.data_ptr<int64_t>();
    for (int64_t r = 0; r < N; ++r) tab[r * capacity + write_at[r]] = slots[r];
    const at::Tensor history = table.narrow(1, 0, T).contiguous();  // (N, T): the slot of each position

    const auto f32 = x.options();
    at::Tensor qkv = at::empty({N, 3 * D}, f32), cross_q = at::empty({N, D}, f32);
    std::vector<at::Tensor> all_weights;
    float* kv = self_kv.data_ptr<float>();
    const int64_t position_stride = L * 2 * D, slot_stride = capacity * position_stride, B = N / group;
    const at::Tensor bias = src_bias.reshape({B, -1}).to(at::kFloat).contiguous();
    const int64_t S = bias.size(1);
    c10::optional<at::Tensor> source_rows;  // (B, S): the pool entry of each source's every key
    if (entry.has_value()) {
      TORCH_CHECK(entry->scalar_type() == at::kLong && entry->numel() == B, "entry must be int64 (N / group,)");
      source_rows = entry->view({B, 1}).expand({B, S}).contiguous();
    }
    for (const at::Tensor& kv : cross_kv)
      TORCH_CHECK(kv.dim() == 4 && kv.size(2) >= S && (entry.has_value() || kv.size(0) == B),
                  "cross_kv must be (N / group, H, S, Dh), or a pool with an entry per source");

    for (int64_t l = 0; l < L; ++l) {
      const Linear* linear = &linears_[6 * l];  // qkv, self out, cross q, cross out, w1, w2
      sublayer(x, norms_[3 * l], [&](const at::Tensor& in) {  // self-attention over the cache
        product(in, linear[0], qkv.data_ptr<float>(), false);
        const float* qkvp = qkv.data_ptr<float>();
        for (int64_t r = 0; r < N; ++r) {  // this position's key and value into the row's slot
          float* dst = kv + slots[r] * slot_stride + write_at[r] * position_stride + l * 2 * D;
          std::copy(qkvp + r * 3 * D + D, qkvp + r * 3 * D + 3 * D, dst);
        }
        const at::Tensor q = qkv.as_strided({N, H, 1, Dh}, {3 * D, Dh, Dh, 1});
        const at::Tensor layer_kv = self_kv.select(2, l).narrow(1, 0, T);  // (slots, T, 2, H, Dh)
        const at::Tensor k = layer_kv.select(2, 0).transpose(1, 2), v = layer_kv.select(2, 1).transpose(1, 2);
        const at::Tensor out = attention(q, k, v, self_bias.defined() ? c10::optional<at::Tensor>(self_bias) : c10::nullopt,
                                         false, history)[0];  // (N, H, 1, Dh)
        product(out.view({N, D}), linear[1], x.data_ptr<float>(), true);
      });
      sublayer(x, norms_[3 * l + 1], [&](const at::Tensor& in) {  // the g rows of a source as g queries
        product(in, linear[2], cross_q.data_ptr<float>(), false);
        const at::Tensor q = cross_q.view({B, group, H, Dh}).transpose(1, 2);  // (B, H, g, Dh)
        auto result = attention(q, cross_kv[2 * l].narrow(2, 0, S), cross_kv[2 * l + 1].narrow(2, 0, S), bias,
                                need_weights, source_rows);
        const at::Tensor out = result[0].transpose(1, 2).contiguous();  // (B, g, H, Dh)
        if (need_weights) all_weights.push_back(result[1].transpose(1, 2).reshape({N, H, -1}));  // (N, H, S)
        product(out.view({N, D}), linear[3], x.data_ptr<float>(), true);
      });
      sublayer(x, norms_[3 * l + 2], [&](const at::Tensor& in) { feed_forward(in, linear[4], linear[5], x); });
    }
    if (pre_norm_) x = layer_norm(x, norms_.back());
    const Linear& output = linears_.back();
    Linear rows = output;
    if (shortlist_output.has_value()) {
      const auto& [q, scale, qsum, bias] = *shortlist_output;
      rows = Linear{q, scale, qsum, bias};
    }
    at::Tensor logits = at::empty({N, rows.out_features()}, f32);
    product(x, rows, logits.data_ptr<float>(), false);
    return {logits, need_weights ? at::stack(all_weights) : at::Tensor()};
  }
};

}  // namespace

void define_fused(py::module& module) {
  // module_local: the builds for other vector widths (tests, prebuild) load beside this one
  py::class_<Encoder>(module, "Encoder", py::module_local(), "Transformer.encode of an int8 model in one call")
      .def(py::init<bool, const std::string&, int64_t, double, double, int64_t, const at::Tensor&, const at::Tensor&,
                    const std::vector<at::Tensor>&, const std::vector<LinearTensors>&>(),
           py::arg("pre_norm"), py::arg("activation"), py::arg("n_heads"), py::arg("eps"), py::arg("embed_scale"),
           py::arg("pad_id"), py::arg("embedding"), py::arg("positions"), py::arg("norms"), py::arg("linears"))
      .def("forward", &Encoder::forward, py::arg("src"), py::call_guard<py::gil_scoped_release>());
  py::class_<DecoderStep>(module, "DecoderStep", py::module_local(), "Transformer.decode_step of an int8 model in one call")
      .def(py::init([](bool pre_norm, const std::string& activation, int64_t n_heads, double eps, double embed_scale,
                       const at::Tensor& embedding, const at::Tensor& positions, const std::vector<at::Tensor>& norms,
                       const std::vector<LinearTensors>& linears) {
             auto step = std::make_unique<DecoderStep>(pre_norm, activation, n_heads, eps, embed_scale, embedding,
                                                       positions, norms, linears);
             step->check();
             return step;
           }),
           py::arg("pre_norm"), py::arg("activation"), py::arg("n_heads"), py::arg("eps"), py::arg("embed_scale"),
           py::arg("embedding"), py::arg("positions"), py::arg("norms"), py::arg("linears"))
      .def("forward", &DecoderStep::forward, py::arg("tokens"), py::arg("t"), py::arg("self_kv"), py::arg("slot"),
           py::arg("table"), py::arg("cross_kv"), py::arg("src_bias"), py::arg("group"), py::arg("need_weights"),
           py::arg("shortlist_output") = py::none(), py::arg("position") = py::none(), py::arg("entry") = py::none(),
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace nmt
