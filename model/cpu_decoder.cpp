// A whole decoder step (Transformer.decode_step in model/transformer.py) in one call, for a model
// whose Linear layers are int8 (Int8Linear, cpu_int8.cpp) on the CPU.
//
// The step in PyTorch is ~100 small ops a step, each paying Python and dispatch costs that do not
// shrink with the batch: at 4 decoder rows they are most of a step. Here the same arithmetic runs
// as one call: embedding, then per layer LayerNorm, int8 products (the residual added as the
// product is stored, ReLU applied there too), attention over the cache (cpu_kernels.cpp), and the
// output projection. It reads and writes the cache of model/transformer.py (DecoderCache) exactly as
// the PyTorch step does, so the two can take turns on one cache.
//
// Shapes: N decoder rows, g rows per source, D model width, H heads, Dh = D / H, F feed-forward
// width, t this step's position, S source length, L layers, V target vocabulary.

#include "cpu_kernels.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace nmt {
namespace {

struct Linear {
  at::Tensor q, scale, qsum;  // pack_int8's layout (model/cpu_weights.py)
  c10::optional<at::Tensor> bias;
  Int8Weight weight() const { return int8_weight(q, scale, qsum, bias); }
  int64_t out_features() const { return scale.numel(); }
};

struct Norm {
  at::Tensor weight, bias;  // (D,) float32
};

struct Layer {
  Norm self_norm, cross_norm, ffn_norm;  // before (pre-norm) or after (post-norm) each sublayer
  Linear qkv, self_out, cross_q, cross_out, w1, w2;
};

}  // namespace

class DecoderStep {
 public:
  DecoderStep(bool pre_norm, const std::string& activation, int64_t n_heads, double eps, double embed_scale,
              at::Tensor embedding, at::Tensor positions, const std::vector<at::Tensor>& norms,
              const std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor, c10::optional<at::Tensor>>>& linears)
      : pre_norm_(pre_norm), activation_(activation), H_(n_heads), eps_(eps),
        embed_scale_(static_cast<float>(embed_scale)), embedding_(embedding.contiguous()),
        positions_(positions.contiguous()) {
    TORCH_CHECK(activation == "relu" || activation == "gelu" || activation == "swish", "unknown activation ", activation);
    TORCH_CHECK(embedding_.scalar_type() == at::kFloat && positions_.scalar_type() == at::kFloat,
                "the fused step runs float32 models (int8 Linear layers)");
    D_ = embedding_.size(1);
    TORCH_CHECK(D_ % H_ == 0, "d_model must divide into heads");
    const int64_t L = static_cast<int64_t>(linears.size() - 1) / 6;
    TORCH_CHECK(linears.size() == static_cast<size_t>(6 * L + 1) && L >= 1, "6 Linear layers per decoder layer, then the output projection");
    TORCH_CHECK(norms.size() == static_cast<size_t>(6 * L + (pre_norm ? 2 : 0)), "3 LayerNorms (weight, bias) per layer, and a final one for pre-norm");
    auto linear = [&](size_t i) {
      const auto& [q, scale, qsum, bias] = linears[i];
      return Linear{q, scale, qsum, bias};
    };
    auto norm = [&](size_t i) { return Norm{norms[2 * i].contiguous(), norms[2 * i + 1].contiguous()}; };
    for (int64_t l = 0; l < L; ++l) {
      layers_.push_back(Layer{norm(3 * l), norm(3 * l + 1), norm(3 * l + 2), linear(6 * l), linear(6 * l + 1),
                              linear(6 * l + 2), linear(6 * l + 3), linear(6 * l + 4), linear(6 * l + 5)});
      TORCH_CHECK(layers_.back().qkv.out_features() == 3 * D_, "layer ", l, ": qkv must have 3 * d_model outputs");
    }
    output_ = linear(6 * L);
    if (pre_norm) final_norm_ = norm(3 * L);
  }

  // tokens (N,) int64; self_kv (slots, capacity, L, 2, H, Dh) float32; slot (N,); table (N,
  // capacity) int64, contiguous; cross_kv: per layer its keys and values (N/g, H, S, Dh);
  // src_bias (N/g, S) float32. Writes this step's keys and values into self_kv and table[:, t];
  // returns logits (N, V) and, if asked, the encoder-decoder attention (L, N, H, S).
  std::vector<at::Tensor> forward(const at::Tensor& tokens, int64_t t, at::Tensor self_kv, const at::Tensor& slot,
                                  at::Tensor table, const std::vector<at::Tensor>& cross_kv, const at::Tensor& src_bias,
                                  int64_t group, bool need_weights) const {
    const int64_t N = tokens.size(0), D = D_, H = H_, Dh = D / H, L = static_cast<int64_t>(layers_.size());
    const int64_t capacity = self_kv.size(1);
    TORCH_CHECK(tokens.scalar_type() == at::kLong && slot.scalar_type() == at::kLong && table.scalar_type() == at::kLong,
                "tokens, slot and table must be int64");
    TORCH_CHECK(self_kv.is_contiguous() && self_kv.scalar_type() == at::kFloat && self_kv.dim() == 6 &&
                    self_kv.size(2) == L && self_kv.size(3) == 2 && self_kv.size(4) == H && self_kv.size(5) == Dh,
                "self_kv must be a contiguous float32 (slots, capacity, L, 2, H, Dh) cache");
    TORCH_CHECK(table.is_contiguous() && table.size(0) == N && table.size(1) == capacity && slot.numel() == N,
                "table must be a contiguous (N, capacity) and slot an (N,) tensor");
    TORCH_CHECK(0 <= t && t < capacity, "position ", t, " outside the cache's ", capacity);
    TORCH_CHECK(t < positions_.size(0), "position ", t, " beyond the model's ", positions_.size(0));
    TORCH_CHECK(cross_kv.size() == static_cast<size_t>(2 * L), "cross_kv: keys and values of each layer");
    TORCH_CHECK(group >= 1 && N % group == 0 && src_bias.size(0) == N / group, "N rows must be N / group sources");

    const int64_t* tok = tokens.data_ptr<int64_t>();
    const int64_t* slots = slot.data_ptr<int64_t>();
    const int64_t V = embedding_.size(0);
    for (int64_t r = 0; r < N; ++r) {
      TORCH_CHECK(0 <= tok[r] && tok[r] < V, "token ", tok[r], " outside the vocabulary of ", V);
      TORCH_CHECK(0 <= slots[r] && slots[r] < self_kv.size(0), "slot ", slots[r], " outside the cache");
    }

    // sections 3.4 and 3.5, as Transformer.embed: (embedding * sqrt(D)) + position t
    const auto f32 = tokens.options().dtype(at::kFloat);
    at::Tensor x = at::empty({N, D}, f32);
    float* xp = x.data_ptr<float>();
    const float* emb = embedding_.data_ptr<float>();
    const float* pos = positions_.data_ptr<float>() + t * D;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t i = 0; i < D; ++i) xp[r * D + i] = emb[tok[r] * D + i] * embed_scale_ + pos[i];

    int64_t* tab = table.data_ptr<int64_t>();
    for (int64_t r = 0; r < N; ++r) tab[r * capacity + t] = slots[r];
    // each row's history, the slot of each position 0 .. t: (N, t + 1)
    const at::Tensor history = table.narrow(1, 0, t + 1).contiguous();

    at::Tensor qkv = at::empty({N, 3 * D}, f32), cross_q = at::empty({N, D}, f32);
    at::Tensor ffn = at::empty({N, layers_[0].w1.out_features()}, f32);
    QuantizedRows rows;
    std::vector<at::Tensor> all_weights;
    float* kv = self_kv.data_ptr<float>();
    const int64_t position_stride = L * 2 * D, slot_stride = capacity * position_stride;
    const int64_t B = N / group;
    const at::Tensor bias = src_bias.reshape({B, -1}).to(at::kFloat).contiguous();

    // out (N, n) = in (N, k) W^T + b: stored, or added to out (a residual), ReLU if asked
    auto product = [&](const at::Tensor& in, const Linear& linear, float* out, bool accumulate, bool relu) {
      const Int8Weight w = linear.weight();
      quantize_rows(in.data_ptr<float>(), N, in.size(1), in.size(1), best_int8_path(), rows);
      int8_matmul(rows, N, w, out, w.N, Epilogue{relu, accumulate});
    };
    // ATen's LayerNorm: the PyTorch step's, bit for bit, so that both steps quantize the same
    // activations (an own LayerNorm differs in the last bits, and now and then that moves an
    // activation across a rounding boundary of the int8 quantization)
    auto layer_norm = [&](const at::Tensor& in, const Norm& norm) {
      return at::layer_norm(in, {D}, norm.weight, norm.bias, eps_);
    };
    // one sublayer: pre-norm x + f(LN(x)), post-norm LN(x + f(x)); f adds its result to x
    auto sublayer = [&](const Norm& norm, auto&& f) {
      if (pre_norm_) {
        f(layer_norm(x, norm));
      } else {
        f(x);
        x = layer_norm(x, norm);
      }
    };

    for (int64_t l = 0; l < L; ++l) {
      const Layer& layer = layers_[l];
      sublayer(layer.self_norm, [&](const at::Tensor& in) {  // self-attention over the cache
        product(in, layer.qkv, qkv.data_ptr<float>(), false, false);
        const float* qkvp = qkv.data_ptr<float>();
        for (int64_t r = 0; r < N; ++r) {  // this position's key and value into the row's slot
          float* dst = kv + slots[r] * slot_stride + t * position_stride + l * 2 * D;
          std::copy(qkvp + r * 3 * D + D, qkvp + r * 3 * D + 3 * D, dst);
        }
        const at::Tensor q = qkv.as_strided({N, H, 1, Dh}, {3 * D, Dh, Dh, 1});
        const at::Tensor layer_kv = self_kv.select(2, l).narrow(1, 0, t + 1);  // (slots, t + 1, 2, H, Dh)
        const at::Tensor k = layer_kv.select(2, 0).transpose(1, 2), v = layer_kv.select(2, 1).transpose(1, 2);
        const at::Tensor out = attention(q, k, v, c10::nullopt, false, history)[0];  // (N, H, 1, Dh)
        product(out.view({N, D}), layer.self_out, x.data_ptr<float>(), true, false);
      });
      sublayer(layer.cross_norm, [&](const at::Tensor& in) {  // the g rows of a source as g queries
        product(in, layer.cross_q, cross_q.data_ptr<float>(), false, false);
        const at::Tensor q = cross_q.view({B, group, H, Dh}).transpose(1, 2);  // (B, H, g, Dh)
        auto result = attention(q, cross_kv[2 * l], cross_kv[2 * l + 1], bias, need_weights, c10::nullopt);
        const at::Tensor out = result[0].transpose(1, 2).contiguous();  // (B, g, H, Dh)
        if (need_weights) all_weights.push_back(result[1].transpose(1, 2).reshape({N, H, -1}));  // (N, H, S)
        product(out.view({N, D}), layer.cross_out, x.data_ptr<float>(), true, false);
      });
      sublayer(layer.ffn_norm, [&](const at::Tensor& in) {  // section 3.3
        product(in, layer.w1, ffn.data_ptr<float>(), false, activation_ == "relu");
        if (activation_ == "gelu") ffn = at::gelu(ffn);
        if (activation_ == "swish") ffn = at::silu(ffn);
        product(ffn, layer.w2, x.data_ptr<float>(), true, false);
      });
    }
    if (pre_norm_) x = layer_norm(x, final_norm_);
    at::Tensor logits = at::empty({N, output_.out_features()}, f32);
    product(x, output_, logits.data_ptr<float>(), false, false);
    return {logits, need_weights ? at::stack(all_weights) : at::Tensor()};
  }

 private:
  bool pre_norm_;
  std::string activation_;
  int64_t H_, D_ = 0;
  double eps_;
  float embed_scale_;
  at::Tensor embedding_, positions_;
  std::vector<Layer> layers_;
  Linear output_;
  Norm final_norm_;
};

void define_decoder_step(py::module& module) {
  // module_local: the builds for other vector widths (tests, prebuild) load beside this one
  py::class_<DecoderStep>(module, "DecoderStep", py::module_local(), "A decoder step of an int8 model in one call")
      .def(py::init<bool, const std::string&, int64_t, double, double, at::Tensor, at::Tensor,
                    const std::vector<at::Tensor>&,
                    const std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor, c10::optional<at::Tensor>>>&>(),
           py::arg("pre_norm"), py::arg("activation"), py::arg("n_heads"), py::arg("eps"), py::arg("embed_scale"),
           py::arg("embedding"), py::arg("positions"), py::arg("norms"), py::arg("linears"))
      .def("forward", &DecoderStep::forward, py::arg("tokens"), py::arg("t"), py::arg("self_kv"), py::arg("slot"),
           py::arg("table"), py::arg("cross_kv"), py::arg("src_bias"), py::arg("group"), py::arg("need_weights"),
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace nmt
