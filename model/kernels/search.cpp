// One step of beam search after the decoder (model/search.py, `select`; its PyTorch twin is
// `_select` there): the 2k best candidates of each sentence, which of them are set aside as
// finished hypotheses, and which k continue. In PyTorch that is ~25 small ops a step, whose fixed
// cost (~150 us) is most of a step at a few decoder rows; here it is one pass per sentence.
//
// Shapes: B sentences, k beams, N = B * k decoder rows, V vocabulary, n = 2k candidates.
// t is the step's index in the history of candidates (pool references are t * n + candidate);
// each sentence's own step count is t too, or steps[b] when given (a running batch, whose
// sentences joined at different steps: model/running.py).
// Ties between equal scores go to the lower index (torch.topk leaves their order open).

#include "kernels.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace nmt {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// indices of the `count` largest of values[0 .. size), best first, ties to the lower index
void top_indices(const float* values, int64_t size, int64_t count, std::vector<int64_t>& order) {
  order.resize(size);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [values](int64_t a, int64_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  order.resize(count);
}

}  // namespace

std::tuple<std::vector<at::Tensor>, bool, bool> beam_step(const at::Tensor& logits, const at::Tensor& run_scores,
                                                          const at::Tensor& pool_scores, const at::Tensor& pool_ref,
                                                          const at::Tensor& max_len, int64_t t,
                                                          const std::vector<int64_t>& banned, int64_t eos_id,
                                                          double length_penalty,
                                                          const c10::optional<at::Tensor>& steps) {
  TORCH_CHECK(run_scores.dim() == 2 && run_scores.scalar_type() == at::kFloat && run_scores.is_contiguous(),
              "run_scores must be contiguous float32 (B, k)");
  const int64_t B = run_scores.size(0), k = run_scores.size(1), n = 2 * k, N = B * k;
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) == N, "logits must be (B * k, V)");
  TORCH_CHECK(pool_scores.sizes() == run_scores.sizes() && pool_scores.scalar_type() == at::kFloat &&
                  pool_scores.is_contiguous() && pool_ref.sizes() == run_scores.sizes() &&
                  pool_ref.scalar_type() == at::kLong && pool_ref.is_contiguous(),
              "pool_scores (float32) and pool_ref (int64) must be contiguous (B, k)");
  TORCH_CHECK(max_len.numel() == B && max_len.scalar_type() == at::kLong && max_len.is_contiguous(),
              "max_len must be contiguous int64 (B,)");
  TORCH_CHECK(!steps || (steps->numel() == B && steps->scalar_type() == at::kLong && steps->is_contiguous()),
              "steps must be contiguous int64 (B,)");
  const int64_t m = std::min(n, logits.size(1));
  const std::vector<at::Tensor> best = row_top(logits, m, banned);  // (N, m) log-probs and tokens
  const float* row_value = best[0].data_ptr<float>();
  const int64_t* row_token = best[1].data_ptr<int64_t>();

  const auto f32 = run_scores.options(), i64 = f32.dtype(at::kLong);
  at::Tensor cand_scores = at::empty({B, n}, f32), cand_row = at::empty({B, n}, i64), cand_tok = at::empty({B, n}, i64);
  at::Tensor keep = at::empty({B, k}, i64), next_run = at::empty({B, k}, f32), parents = at::empty({B, k}, i64);
  at::Tensor next_pool = at::empty({B, k}, f32), next_ref = at::empty({B, k}, i64), tokens = at::empty({N}, i64);
  at::Tensor done = at::empty({B}, f32.dtype(at::kBool));
  const float* run = run_scores.data_ptr<float>();
  const float* pool = pool_scores.data_ptr<float>();
  const int64_t* ref = pool_ref.data_ptr<int64_t>();
  const int64_t* cap = max_len.data_ptr<int64_t>();
  const int64_t* own_step = steps ? steps->data_ptr<int64_t>() : nullptr;
  bool any_done = false, in_place = true;
  std::vector<float> scores(k * m), merged(3 * k), masked(n);
  std::vector<int64_t> order;
  for (int64_t b = 0; b < B; ++b) {
    // a sentence's best n among all k * m (beam, token): its beams' scores plus their rows' best m
    for (int64_t r = 0; r < k; ++r)
      for (int64_t i = 0; i < m; ++i) scores[r * m + i] = run[b * k + r] + row_value[(b * k + r) * m + i];
    top_indices(scores.data(), k * m, n, order);
    float* cs = cand_scores.data_ptr<float>() + b * n;
    int64_t *crow = cand_row.data_ptr<int64_t>() + b * n, *ctok = cand_tok.data_ptr<int64_t>() + b * n;
    const int64_t length = (own_step ? own_step[b] : t) + 1;  // of a candidate, its EOS counted
    const bool at_cap = length >= cap[b];
    // as PyTorch divides a float32 tensor by a Python float: in float32
    const float denominator = static_cast<float>(std::pow(static_cast<double>(length), length_penalty));
    for (int64_t j = 0; j < n; ++j) {
      cs[j] = scores[order[j]];
      crow[j] = order[j] / m;
      ctok[j] = row_token[(b * k + crow[j]) * m + order[j] % m];
    }
    // candidates that end (EOS, or the cap) within the top k are set aside, unless k already are
    bool pool_full = true;
    for (int64_t i = 0; i < k; ++i) pool_full = pool_full && std::isfinite(pool[b * k + i]);
    for (int64_t i = 0; i < k; ++i) merged[i] = pool[b * k + i];
    for (int64_t j = 0; j < n; ++j) {
      const bool ends = ctok[j] == eos_id || at_cap;
      merged[k + j] = ends && j < k && !pool_full ? cs[j] / denominator : kNegInf;
      masked[j] = ends ? -1e9f : cs[j];
    }
    top_indices(merged.data(), 3 * k, k, order);
    bool full = true;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t from = order[i];
      next_pool.data_ptr<float>()[b * k + i] = merged[from];
      next_ref.data_ptr<int64_t>()[b * k + i] = from < k ? ref[b * k + from] : t * n + (from - k);
      full = full && std::isfinite(merged[from]);
    }
    // the best k that do not end continue
    top_indices(masked.data(), n, k, order);
    for (int64_t i = 0; i < k; ++i) {
      keep.data_ptr<int64_t>()[b * k + i] = order[i];
      next_run.data_ptr<float>()[b * k + i] = masked[order[i]];
      parents.data_ptr<int64_t>()[b * k + i] = crow[order[i]];
      tokens.data_ptr<int64_t>()[b * k + i] = ctok[order[i]];
      in_place = in_place && crow[order[i]] == i;
    }
    done.data_ptr<bool>()[b] = full || at_cap;
    any_done = any_done || full || at_cap;
  }
  return {{cand_scores, cand_row, cand_tok, keep, next_run, next_pool, next_ref, tokens, parents, done}, any_done,
          in_place};
}

}  // namespace nmt
