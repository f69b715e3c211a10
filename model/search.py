"""Batched beam search over sentences x beams, with greedy search as its beam=1 case.

Semantics are those of Hugging Face transformers' `generate(num_beams=k, early_stopping=True)`:
each step ranks 2k candidates per sentence by accumulated log-probability; a candidate that
ends (EOS, or the sentence's length cap) is set aside when it ranks within the top k, with
score log_prob / length^alpha (length counts the EOS); the best k candidates that do not end
continue. A sentence is done when k hypotheses are set aside or its cap is reached, and it
then leaves the batch (its cache rows are dropped), so a batch shrinks as sentences finish.

Sequences are not carried along: each step records its candidates (token, the row they
extend, log-prob) and which of them continue; a finished hypothesis is a reference
(step, candidate) into that history, and its tokens (and attention) are read back by
following back-pointers once the search is over.

Shapes: B sentences still running, k beams, N = B * k decoder rows, V target vocabulary,
L decoder layers, H heads, S padded source length, T target positions.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from model.config import ModelConfig
from model.transformer import DecoderCache

# entries per block in the two-level top-k (measured at V = 32000: 32 beats 16, 64 and 128)
_BLOCK_SIZE = 32
# floats per slice of rows in the vocabulary-wide passes (1 MiB: within a core's L2)
_CACHE_FLOATS = 1 << 18
# what one more encoder call costs, in source tokens: a batch is cut into length groups only
# where that saves more padding than this
_GROUP_COST_TOKENS = 96


class IncrementalDecoder(Protocol):
    """What beam search needs of a model, and all it may touch (fairseq's rule: the cache is the
    whole interface). The PyTorch `Transformer` implements it, and so does the fused int8 engine
    (model/cpu/fused.py); `Translator` picks one when it loads a model."""

    config: ModelConfig
    # the target ids of decode_step's logit columns, sorted (V',), when it computes a shortlist of
    # the vocabulary only (model/shortlist.py); None: column i is id i
    columns: Tensor | None

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S)."""

    def start_cache(self, memory: Tensor, src_mask: Tensor, group: int, capacity: int) -> DecoderCache:
        """A cache for `group` decoder rows per source and up to `capacity` target positions."""

    def decode_step(self, tokens: Tensor, cache: DecoderCache, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """tokens (N,) -> logits (N, V) (or (N, V'): columns) and, if asked, encoder-decoder
        attention (L, N, H, S)."""


# the search's step after the decoder: `select` below, or kernels.select (one C++ call on the CPU)
SelectFn = Callable[..., "tuple[Selection, bool, bool]"]


@dataclass
class Hypothesis:
    token_ids: list[int]  # target ids, without the decoder start token and without EOS
    score: float  # log_prob / length^alpha
    log_prob: float  # sum of token log-probabilities (the EOS included when present)
    ended_with_eos: bool  # False when the length cap stopped it
    attention: Tensor | None = None  # (L, H, T, source_len); T = len(token_ids) + ended_with_eos


@dataclass
class StepRecord:
    """One step's candidates, all (B, 2k) over this step's running sentences `sent` (B,)."""

    sent: Tensor  # original index of each running sentence
    scores: Tensor  # accumulated log-prob of each candidate
    row: Tensor  # beam (0..k-1) each candidate extends
    token: Tensor  # token it appends
    keep: Tensor | None = None  # (B, k) candidate that each next-step beam is
    attention: Tensor | None = None  # (B, k, L, H, S) encoder-decoder attention of this step's beams


def topk_rows(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """x.topk(n, dim=-1) for (R, V) rows of a wide vocabulary, in two passes.

    torch's row top-k is slow on wide rows, an elementwise max is fast. Cut each row into
    V / _BLOCK_SIZE blocks (block j: entries j, j + V / _BLOCK_SIZE, j + 2 V / _BLOCK_SIZE, ...)
    and take each block's max: the best n of a row lie in its n blocks with the highest maxima
    (a block outside them has n block maxima above or equal to all its entries), so rank the
    blocks, then only the entries of those n. Values are exactly those of x.topk (indices may
    differ only among equal values).
    """
    R, V = x.shape
    n_blocks = V // _BLOCK_SIZE
    # on a GPU, torch's top-k is one fast kernel and each extra pass costs a launch
    if V % _BLOCK_SIZE or n_blocks < 4 * n or x.device.type != "cpu":
        return x.topk(n, dim=-1)
    blocks = x.view(R, _BLOCK_SIZE, n_blocks)  # blocks[:, :, j] is block j
    best = blocks.amax(1).topk(n, dim=-1).indices  # (R, n) blocks
    inside = blocks.gather(2, best[:, None, :].expand(-1, _BLOCK_SIZE, -1)).view(R, _BLOCK_SIZE * n)
    values, at = inside.topk(n, dim=-1)  # (R, n); entry at = i * n + b: the i-th of block best[b]
    return values, (at // n) * n_blocks + best.gather(1, at % n)


def top_candidates(logits: Tensor, run_scores: Tensor, n: int, banned: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """The n best continuations of each sentence: run_scores (B, k) plus log_softmax(logits)
    (N, V), ranked over all k * V (beam, token) pairs, the `banned` tokens excluded. Returns
    their scores, beams and tokens, (B, n) each, best first.

    Same selection as topk over (run_scores + log_softmax(logits)).view(B, k * V), but that
    (B, k * V) sum is never formed: adding a row's score keeps the order within the row, so a
    sentence's best n are among the best n of each of its rows.
    """
    B, k = run_scores.shape
    m = min(n, logits.size(-1))
    row_top, row_tok = rows_top(logits, m, banned)
    scores = run_scores.view(-1, 1) + row_top  # (N, m)
    cand_scores, flat = scores.view(B, k * m).topk(n, dim=1)  # (B, n) of k * m
    return cand_scores, flat // m, row_tok.view(B, k * m).gather(1, flat)


def rows_top(logits: Tensor, m: int, banned: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(N, V) logits -> the m best log-probs of each row (float32) and their tokens, `banned`
    excluded (the reference of the C++ kernels.row_top)."""
    # bf16/fp16 logits: convert all rows in one pass first; upcasting slice by slice inside
    # log_softmax is slower (128 x 32000 bf16 rows, 1 thread: 7.9 ms -> 5.1 ms per step)
    logits = logits.float()
    if logits.device.type != "cpu":  # all rows at once: on a GPU each slice would cost launches
        return _row_top(logits, m, banned)
    # a few rows at a time, so that each (rows, V) float32 block stays in cache across its passes
    # (the vocabulary-wide passes are memory-bound; a block of all N rows is tens of MB)
    best = [_row_top(rows, m, banned) for rows in logits.split(max(1, _CACHE_FLOATS // logits.size(-1)))]
    return tuple(torch.cat(parts) for parts in zip(*best))  # (N, m) each


def _row_top(logits: Tensor, m: int, banned: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(R, V) logits -> the m best log-probs of each row and their tokens, `banned` excluded
    (their probability still counts in the normalisation). Log-probs are float32 whatever the
    model's dtype."""
    logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    for token in banned:
        logp[:, token] = float("-inf")
    return topk_rows(logp, m)


@dataclass
class Selection:
    """What one step of the search decides, over its B running sentences (k beams, 2k candidates)."""

    cand_scores: Tensor  # (B, 2k) the best 2k continuations: accumulated log-prob, best first
    cand_row: Tensor  # (B, 2k) beam each extends
    cand_tok: Tensor  # (B, 2k) token it appends
    keep: Tensor  # (B, k) candidate that each next-step beam is
    run_scores: Tensor  # (B, k) their scores
    pool_scores: Tensor  # (B, k) finished hypotheses, best first: score (-inf: none yet)
    pool_ref: Tensor  # (B, k) and step * 2k + candidate
    tokens: Tensor  # (B * k,) the next step's input tokens
    parents: Tensor  # (B, k) beam each next-step beam continues
    done: Tensor  # (B,) bool: the sentence leaves the batch


def select(logits: Tensor, run_scores: Tensor, pool_scores: Tensor, pool_ref: Tensor, max_len: Tensor, t: int,
           banned: tuple[int, ...], eos_id: int, length_penalty: float, steps: Tensor | None = None
           ) -> tuple[Selection, bool, bool]:
    """One step of beam search after the decoder (`select_on_device`), and what the loop must
    know on the host: whether any sentence is done, whether every beam continues itself (no
    reorder). t: the step's index in the history; steps (B,): each sentence's own step count
    when they differ (a running batch's sentences joined at different steps), else t. PyTorch
    ops; model/kernels has the same step as one C++ call (kernels.select)."""
    chosen = select_on_device(logits, run_scores, pool_scores, pool_ref, max_len, t if steps is None else steps,
                              banned, eos_id, length_penalty, history_step=t)
    k = run_scores.size(1)
    # one host sync per step
    any_done, in_place = torch.stack([chosen.done.any(),
                                      (chosen.parents == torch.arange(k, device=logits.device)).all()]).tolist()
    return chosen, any_done, in_place


def select_on_device(logits: Tensor, run_scores: Tensor, pool_scores: Tensor, pool_ref: Tensor, max_len: Tensor,
                     t: int | Tensor, banned: tuple[int, ...], eos_id: int, length_penalty: float | Tensor,
                     history_step: int | Tensor | None = None) -> Selection:
    """For logits (B * k, V) of step t: the 2k best candidates of each sentence; those that end
    (EOS, or the sentence's cap max_len (B,)) within the top k go to the pool of finished
    hypotheses (score log_prob / (t + 1)^length_penalty) unless it is full; the best k that do
    not end continue. A sentence is done when its pool is full or its cap reached. No host sync:
    t may be a tensor, (1,) or one step count per sentence (B,), and so may length_penalty (1,),
    so that a CUDA graph can replay the step (model/graphs.py). A pool entry refers to its
    candidate as history_step * 2k + candidate (default: t)."""
    B, k = run_scores.shape
    cand_scores, cand_row, cand_tok = top_candidates(logits, run_scores, 2 * k, banned)  # (B, 2k)
    lengths = t + 1 if isinstance(t, int) else (t + 1).view(-1, 1)  # (1, 1) or (B, 1) as a tensor
    at_cap = (lengths >= max_len[:, None])  # (B, 1)
    ends = (cand_tok == eos_id) | at_cap  # (B, 2k)

    # set aside candidates that end within the top k, unless the sentence is already full
    cand_ids = torch.arange(2 * k, device=logits.device)  # (2k,)
    pool_full = torch.isfinite(pool_scores).all(-1, keepdim=True)  # (B, 1)
    aside = ends & (cand_ids < k) & ~pool_full
    aside_scores = torch.where(aside, cand_scores / lengths ** length_penalty, float("-inf"))
    pool_scores, merged = torch.cat([pool_scores, aside_scores], 1).topk(k, dim=1)  # (B, k) of 3k
    step = t if history_step is None else history_step
    pool_ref = torch.cat([pool_ref, (cand_ids + step * 2 * k).expand(B, -1)], 1).gather(1, merged)

    # the best k candidates that do not end continue
    run_scores, keep = cand_scores.masked_fill(ends, -1e9).topk(k, dim=1)  # (B, k) of 2k
    parents = cand_row.gather(1, keep)  # (B, k)
    tokens = cand_tok.gather(1, keep).view(-1)

    done = torch.isfinite(pool_scores).all(-1) | at_cap[:, 0]  # (B,)
    return Selection(cand_scores, cand_row, cand_tok, keep, run_scores, pool_scores, pool_ref, tokens, parents, done)


def length_groups(lengths: list[int], group_cost: int = _GROUP_COST_TOKENS) -> list[list[int]]:
    """Row indices cut into groups of similar length, to minimise the padded tokens of encoding
    each group apart (sum of rows x longest) plus group_cost per group; exact, by dynamic
    programming over the rows sorted by length."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0] + [None] * n  # best[j]: cost of the j shortest rows; a group is order[i:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        # a group ending at row j is padded to that row's length; only the first row of each
        # run of equal lengths can start a group worth having
        best[j], cut[j] = min((best[i] + (j - i) * longest + group_cost, i) for i in range(j)
                              if i == 0 or lengths[order[i - 1]] != lengths[order[i]])
    groups, j = [], n
    while j:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def padded(ids: list[list[int]], pad_id: int) -> Tensor:
    """Source id lists as one batch (B, S), each padded with pad_id to the longest."""
    S = max(len(x) for x in ids)
    return torch.tensor([x + [pad_id] * (S - len(x)) for x in ids], dtype=torch.long)  # one tensor, not one a row


def encode_by_length(model: IncrementalDecoder, src: Tensor) -> tuple[Tensor, Tensor]:
    """model.encode(src), with sentences of very different lengths encoded apart, each group
    padded only to its own longest: in a mixed batch (a service's) most encoder work would
    otherwise go to padding. Returns memory (B, S, D), zero at padding, and src_mask (B, 1, 1, S).
    CPU only: on a GPU padding costs little and each extra encoder call costs launches; and not
    for an engine whose encoder skips the padding itself (`skips_padding`: the fused int8 one)."""
    if src.device.type != "cpu" or getattr(model, "skips_padding", False):
        return model.encode(src)
    src_mask = (src != model.config.pad_id)[:, None, None, :]
    lengths = src_mask.view(src.size(0), -1).sum(-1).tolist()
    if max(lengths) * len(lengths) - sum(lengths) <= _GROUP_COST_TOKENS:  # little padding to save
        return model.encode(src)
    groups = length_groups(lengths)
    if len(groups) == 1:
        return model.encode(src)
    memory = None
    for rows in groups:
        index = torch.tensor(rows, device=src.device)
        S = max(lengths[i] for i in rows)
        part, _ = model.encode(src[index, :S])  # (rows, S, D)
        if memory is None:
            memory = part.new_zeros(src.size(0), src.size(1), part.size(-1))
        memory[index, :S] = part
    return memory, src_mask


@torch.inference_mode()
def beam_search(
    model: IncrementalDecoder,
    src: Tensor,
    beam_size: int = 4,
    n_best: int = 1,
    length_penalty: float = 1.0,
    max_new_tokens: Tensor | int = 128,
    return_attention: bool = False,
    min_new_tokens: int = 0,
    select_fn: SelectFn = select,
    repetition_penalty: float = 1.0,
) -> list[list[Hypothesis]]:
    """src: (B, S) PAD-padded source ids. max_new_tokens: cap per sentence (EOS included),
    an int or a (B,) tensor. min_new_tokens: EOS is banned while fewer tokens than this have
    been generated (as `generate(min_new_tokens=...)`; a cap below it still ends a sentence).
    repetition_penalty: each beam's logits of the tokens it wrote already are penalized
    (`penalize_repeats`) before the selection; 1 is none.
    select_fn: the step after the decoder, `select` or one with its contract (kernels.select).
    Returns per sentence its n_best hypotheses, best first."""
    c = model.config
    k, device = beam_size, src.device
    B_orig = src.size(0)
    max_len = search_caps(src, beam_size, n_best, max_new_tokens)  # (B,)
    T_cap = int(max_len.max())

    memory, src_mask = encode_by_length(model, src)
    cache = model.start_cache(memory, src_mask, group=k, capacity=T_cap)
    source_len = src_mask.view(B_orig, -1).sum(-1).tolist()

    # the logits' columns: the vocabulary, or a shortlist of it whose column j is id columns[j]
    columns = getattr(model, "columns", None)
    pad_col, eos_col = (c.pad_id, c.eos_id) if columns is None else columns_of(columns, (c.pad_id, c.eos_id))
    # the decoder never emits PAD; EOS is banned before min_new_tokens (a column not in a shortlist needs no ban)
    banned_late = tuple(col for col in (pad_col,) if col >= 0)
    banned_early = tuple(col for col in (pad_col, eos_col) if col >= 0)

    # made once, sliced or filtered as the batch shrinks
    sent = torch.arange(B_orig, device=device)  # original index of each running sentence
    first_row = sent[:, None] * k  # (B, 1) cache row of each sentence's first beam

    tokens = torch.full((B_orig * k,), c.decoder_start_id, dtype=torch.long, device=device)
    run_scores = torch.zeros(B_orig, k, device=device)
    run_scores[:, 1:] = -1e9  # all beams start equal: expand only the first
    # hypotheses set aside, best first: score and (step * 2k + candidate) into `steps`
    pool_scores = torch.full((B_orig, k), float("-inf"), device=device)
    pool_ref = torch.zeros(B_orig, k, dtype=torch.long, device=device)
    finished: list[tuple[Tensor, Tensor, Tensor]] = []  # (sentences, their pool scores, pool refs)
    steps: list[StepRecord] = []
    written = None  # (N, V) bool: the columns each beam wrote so far, with a repetition penalty

    for t in range(T_cap):
        B = sent.numel()
        logits, attn = model.decode_step(tokens, cache, need_weights=return_attention)  # (N, V)
        if repetition_penalty != 1.0:
            written = torch.zeros_like(logits, dtype=torch.bool) if written is None else written
            logits = penalize_repeats(logits, written, repetition_penalty)
        banned = banned_late if t >= min_new_tokens else banned_early
        chosen, any_done, in_place = select_fn(logits, run_scores, pool_scores, pool_ref, max_len, t, banned,
                                               eos_col, length_penalty)
        cand_tok, next_tokens = chosen.cand_tok, chosen.tokens
        if columns is not None:  # column -> target id
            cand_tok, next_tokens = columns[cand_tok], columns[next_tokens]
        step = StepRecord(sent, chosen.cand_scores, chosen.cand_row, cand_tok, chosen.keep)
        if return_attention:  # (L, N, H, S) -> (B, k, L, H, S)
            step.attention = attn.transpose(0, 1).reshape(B, k, *attn.shape[:1], *attn.shape[2:])
        steps.append(step)
        run_scores, pool_scores, pool_ref = chosen.run_scores, chosen.pool_scores, chosen.pool_ref
        tokens, parents, done = next_tokens, chosen.parents, chosen.done
        if written is not None:  # each new beam: its parent's columns, and the one it writes now
            written = written.index_select(0, (first_row[:B] + parents).view(-1))
            written.scatter_(1, chosen.tokens.view(-1, 1), True)
        if any_done:
            finished.append((sent[done], pool_scores[done], pool_ref[done]))
            alive = (~done).nonzero()[:, 0]
            if alive.numel() == 0:
                break
            sent, parents, tokens = sent[alive], parents[alive], tokens.view(B, k)[alive].view(-1)
            run_scores, max_len = run_scores[alive], max_len[alive]
            pool_scores, pool_ref = pool_scores[alive], pool_ref[alive]
            if written is not None:
                written = written.view(B, k, -1)[alive].view(alive.numel() * k, -1)
            cache.reorder((alive[:, None] * k + parents).view(-1), sources=alive)
        elif not in_place:
            cache.reorder((first_row[:B] + parents).view(-1))
    return read_back(steps, finished, n_best, 2 * k, c.eos_id, source_len, B_orig)


def penalize_repeats(logits: Tensor, written: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al., 2019): the logit of a token its beam wrote
    already is divided by `penalty` when positive, multiplied when negative. logits, written: (N, V)."""
    return torch.where(written, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def search_caps(src: Tensor, beam_size: int, n_best: int, max_new_tokens: Tensor | int) -> Tensor:
    """The new-token cap of each sentence (B,), on src's device, once the arguments are checked."""
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size={beam_size}, got {n_best}")
    max_len = torch.as_tensor(max_new_tokens, device=src.device).expand(src.size(0)).clone()
    if int(max_len.min()) < 1:
        raise ValueError("max_new_tokens must be at least 1")
    return max_len


def columns_of(columns: Tensor, ids: tuple[int, ...]) -> tuple[int, ...]:
    """The column of each id in sorted `columns`, or -1 where it is not one."""
    at = torch.searchsorted(columns, torch.tensor(ids, device=columns.device)).clamp(max=columns.numel() - 1)
    return tuple(int(j) if int(columns[j]) == i else -1 for i, j in zip(ids, at.tolist()))


def read_back(steps: list[StepRecord], finished, n_best: int, n_cand: int, eos_id: int, source_len: list[int],
              B_orig: int) -> list[list[Hypothesis]]:
    """Each sentence's n_best pool entries -> Hypotheses, following the back-pointers of `steps`."""
    # the history on the host, once: per step, where each original sentence sits, and its lists
    where, host = {}, []
    for s in steps:
        if id(s.sent) not in where:
            where[id(s.sent)] = {b: i for i, b in enumerate(s.sent.tolist())}
        host.append((where[id(s.sent)], s.scores.tolist(), s.row.tolist(), s.token.tolist(),
                     s.keep.tolist() if s.keep is not None else None))
    results: list[list[Hypothesis]] = [[] for _ in range(B_orig)]
    paths: list[tuple[Hypothesis, list[tuple[int, int, int]], int]] = []  # with attention: each one's beams
    for sentences, scores, refs in finished:
        for b, row_scores, row_refs in zip(sentences.tolist(), scores.tolist(), refs.tolist()):
            for score, ref in list(zip(row_scores, row_refs))[:n_best]:
                if score == float("-inf"):
                    break  # fewer than n_best hypotheses exist (tiny vocabularies)
                hypothesis, beams = hypothesis_at(host, b, *divmod(ref, n_cand), score, eos_id)
                results[b].append(hypothesis)
                paths.append((hypothesis, beams, source_len[b]))
    if steps and steps[0].attention is not None:
        for (hypothesis, _, _), attention in zip(paths, attention_along(steps, paths)):
            hypothesis.attention = attention
    return results


def hypothesis_at(host, b, step: int, cand: int, score: float, eos_id: int, first: int = 0
                  ) -> tuple[Hypothesis, list[tuple[int, int, int]]]:
    """The hypothesis of sentence b that is candidate `cand` of step `step`: walk back to the
    sentence's first step. host[s]: step s's (where: sentence -> its place, candidate scores, rows,
    tokens, keep) as lists. Also its beams, newest first: (step, the sentence's place in it, the
    beam that step extended)."""
    where, cand_scores, _, _, _ = host[step]
    log_prob = cand_scores[where[b]][cand]
    ids, beams = [], []  # newest first
    for s in range(step, first - 1, -1):
        where, _, row, token, keep = host[s]
        i = where[b]
        ids.append(token[i][cand])
        beams.append((s, i, row[i][cand]))
        if s > first:
            prev_where, _, _, _, prev_keep = host[s - 1]
            cand = prev_keep[prev_where[b]][row[i][cand]]
    ids.reverse()
    ended_with_eos = ids[-1] == eos_id
    return Hypothesis(ids[:-1] if ended_with_eos else ids, score, log_prob, ended_with_eos), beams


def attention_along(steps: list[StepRecord], paths) -> list[Tensor]:
    """Each hypothesis's encoder-decoder attention along its own beams, float32 on the host:
    (L, H, T, its source length). paths: (hypothesis, its beams newest first, source length).

    Per step one gather of the rows the hypotheses pass through (step s's beam r of its i-th
    sentence is its row i k + r), then one gather that puts them in each hypothesis's order, the
    row numbers sent to the device at once, one copy to the host: on a GPU about a launch a step,
    and no more rows than the hypotheses hold."""
    if not paths:
        return []
    k = steps[0].attention.size(1)
    wanted: list[list[int]] = [[] for _ in steps]  # per step, the rows asked for, in the order asked
    asked = []  # each hypothesis's rows, its first step first: (step, place in wanted[step])
    for _, newest_first, _ in paths:
        for s, i, r in reversed(newest_first):
            rows = wanted[s]
            asked.append((s, len(rows)))
            rows.append(i * k + r)
    starts, total = [], 0  # where each step's rows start among all of them
    for rows in wanted:
        starts.append(total)
        total += len(rows)
    # (an array, where torch.tensor would take ~1 ms over a list of a few thousand ints)
    index = array("q", [row for rows in wanted for row in rows] + [starts[s] + p for s, p in asked])
    index = torch.frombuffer(index, dtype=torch.int64).to(steps[0].attention.device, non_blocking=True)
    parts = [step.attention.reshape(-1, *step.attention.shape[2:]).index_select(0, index[start:start + len(rows)])
             for step, start, rows in zip(steps, starts, wanted) if rows]  # (its rows, L, H, S)
    gathered = torch.cat(parts).index_select(0, index[total:]).float().cpu()  # (sum of T, L, H, S)
    out, start = [], 0
    for _, newest_first, source_len in paths:
        T = len(newest_first)
        out.append(gathered[start:start + T, :, :, :source_len].permute(1, 2, 0, 3).contiguous())  # (L, H, T, source_len)
        start += T
    return out
