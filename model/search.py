"""Batched beam search over sentences x beams, with greedy search as its beam=1 case.

Semantics are those of Hugging Face transformers' `generate(num_beams=k, early_stopping=True)`:
each step ranks 2k candidates per sentence by accumulated log-probability; a candidate that
ends (EOS, or the sentence's length cap) is set aside when it ranks within the top k, with
score log_prob / length^alpha (length counts the EOS); the best k candidates that do not end
continue. A sentence is done when k hypotheses are set aside or its cap is reached, and it
then leaves the batch (its cache rows are dropped), so a batch shrinks as sentences finish.

Shapes: B sentences still running, k beams, N = B * k decoder rows, V target vocabulary,
L decoder layers, H heads, S padded source length, T target positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model.transformer import Transformer


@dataclass
class Hypothesis:
    token_ids: list[int]  # target ids, without the decoder start token and without EOS
    score: float  # log_prob / length^alpha
    log_prob: float  # sum of token log-probabilities (the EOS included when present)
    ended_with_eos: bool  # False when the length cap stopped it
    attention: Tensor | None = None  # (L, H, T, source_len); T = len(token_ids) + ended_with_eos


@dataclass
class _Step:
    """What attention capture keeps of one step to retrace each hypothesis's own path."""

    position: Tensor  # (B_orig,) where each original sentence sits in this step's batch
    attention: Tensor  # (B, k, L, H, S) encoder-decoder attention of this step's rows
    parents: Tensor | None = None  # (B, k) row (at this step) each next-step row extends


@torch.inference_mode()
def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    n_best: int = 1,
    length_penalty: float = 1.0,
    max_new_tokens: Tensor | int = 128,
    return_attention: bool = False,
) -> list[list[Hypothesis]]:
    """src: (B, S) PAD-padded source ids. max_new_tokens: cap per sentence (EOS included),
    an int or a (B,) tensor. Returns per sentence its n_best hypotheses, best first."""
    c = model.config
    k, device = beam_size, src.device
    if not 1 <= n_best <= k:
        raise ValueError(f"n_best must be between 1 and beam_size={k}, got {n_best}")
    B_orig = src.size(0)
    max_len = torch.as_tensor(max_new_tokens, device=device).expand(B_orig).clone()  # (B,)
    if int(max_len.min()) < 1:
        raise ValueError("max_new_tokens must be at least 1")
    T_cap = int(max_len.max())

    memory, src_mask = model.encode(src)
    cache = model.start_cache(memory, src_mask, group=k, capacity=T_cap)
    source_len = src_mask.view(B_orig, -1).sum(-1).tolist()

    sent = torch.arange(B_orig, device=device)  # original index of each running sentence
    tokens = torch.full((B_orig * k,), c.decoder_start_id, dtype=torch.long, device=device)
    run_scores = torch.zeros(B_orig, k, device=device)
    run_scores[:, 1:] = -1e9  # all beams start equal: expand only the first
    run_seqs = torch.zeros(B_orig, k, T_cap, dtype=torch.long, device=device)
    # hypotheses set aside, best first: score, raw log-prob, tokens, step and row it ended at
    pool_scores = torch.full((B_orig, k), float("-inf"), device=device)
    pool_logp = torch.zeros(B_orig, k, device=device)
    pool_seqs = torch.zeros(B_orig, k, T_cap, dtype=torch.long, device=device)
    pool_end = torch.zeros(B_orig, k, 2, dtype=torch.long, device=device)  # (step, row)
    pool_eos = torch.zeros(B_orig, k, dtype=torch.bool, device=device)
    results: list[list[Hypothesis] | None] = [None] * B_orig
    steps: list[_Step] = []
    rank_in_top_k = torch.arange(2 * k, device=device) < k  # (2k,)

    for t in range(T_cap):
        B = sent.numel()
        logits, attn = model.decode_step(tokens, cache, need_weights=return_attention)  # (N, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        logp[:, c.pad_id] = float("-inf")  # the decoder never emits PAD
        V = logp.size(-1)
        if return_attention:  # (L, N, H, S) -> (B, k, L, H, S)
            position = torch.full((B_orig,), -1, dtype=torch.long, device=device)
            position[sent] = torch.arange(B, device=device)
            steps.append(_Step(position, attn.transpose(0, 1).reshape(B, k, *attn.shape[:1], *attn.shape[2:])))

        cand = (run_scores.view(-1, 1) + logp).view(B, k * V)
        cand_scores, cand_idx = cand.topk(2 * k, dim=-1)  # (B, 2k)
        cand_row, cand_tok = cand_idx // V, cand_idx % V
        at_cap = (t + 1 >= max_len[sent])[:, None]  # (B, 1)
        ends = (cand_tok == c.eos_id) | at_cap  # (B, 2k)
        cand_seqs = run_seqs.gather(1, cand_row[:, :, None].expand(-1, -1, T_cap)).clone()  # (B, 2k, T)
        cand_seqs[:, :, t] = cand_tok

        # set aside candidates that end within the top k, unless the sentence is already full
        pool_full = torch.isfinite(pool_scores).all(-1, keepdim=True)  # (B, 1)
        aside = ends & rank_in_top_k & ~pool_full
        aside_scores = torch.where(aside, cand_scores / (t + 1) ** length_penalty, float("-inf"))
        merged = torch.cat([pool_scores, aside_scores], dim=1).topk(k, dim=1).indices  # (B, k) of 3k
        step_row = torch.stack([torch.full_like(cand_row, t), cand_row], dim=-1)  # (B, 2k, 2)
        pool_scores = torch.cat([pool_scores, aside_scores], 1).gather(1, merged)
        pool_logp = torch.cat([pool_logp, cand_scores], 1).gather(1, merged)
        pool_eos = torch.cat([pool_eos, cand_tok == c.eos_id], 1).gather(1, merged)
        pool_end = torch.cat([pool_end, step_row], 1).gather(1, merged[:, :, None].expand(-1, -1, 2))
        pool_seqs = torch.cat([pool_seqs, cand_seqs], 1).gather(1, merged[:, :, None].expand(-1, -1, T_cap))

        # the best k candidates that do not end continue
        keep_scores, keep = cand_scores.masked_fill(ends, -1e9).topk(k, dim=1)  # (B, k) of 2k
        run_scores = keep_scores
        run_seqs = cand_seqs.gather(1, keep[:, :, None].expand(-1, -1, T_cap))
        parents = cand_row.gather(1, keep)  # (B, k)
        tokens = cand_tok.gather(1, keep).view(-1)
        if return_attention:
            steps[-1].parents = parents

        done = torch.isfinite(pool_scores).all(-1) | at_cap[:, 0]  # (B,)
        if bool(done.any()):  # one host sync per step: which sentences leave the batch
            for i in done.nonzero()[:, 0].tolist():
                b = int(sent[i])
                results[b] = _collect(pool_scores[i], pool_logp[i], pool_seqs[i], pool_end[i], pool_eos[i], n_best)
                if return_attention:
                    for hyp, (step, row) in zip(results[b], pool_end[i].tolist()):
                        hyp.attention = _retrace(steps, b, step, row, source_len[b])
            alive = (~done).nonzero()[:, 0]
            if alive.numel() == 0:
                break
            sent, parents, tokens = sent[alive], parents[alive], tokens.view(B, k)[alive].view(-1)
            run_scores, run_seqs = run_scores[alive], run_seqs[alive]
            pool_scores, pool_logp, pool_seqs = pool_scores[alive], pool_logp[alive], pool_seqs[alive]
            pool_end, pool_eos = pool_end[alive], pool_eos[alive]
            cache.reorder((alive[:, None] * k + parents).view(-1), sources=alive)
        elif k > 1:
            cache.reorder((torch.arange(B, device=device)[:, None] * k + parents).view(-1))
    return results  # type: ignore[return-value]


def _collect(scores, logp, seqs, end, eos, n_best) -> list[Hypothesis]:
    """One sentence's pool (k entries, best first) -> its n_best hypotheses."""
    hyps = []
    for h in range(n_best):
        if not torch.isfinite(scores[h]):
            break  # fewer than n_best hypotheses exist (tiny vocabularies)
        length = int(end[h, 0]) + 1  # tokens generated, the last being EOS when eos[h]
        ids = seqs[h, : length - int(eos[h])].tolist()
        hyps.append(Hypothesis(ids, float(scores[h]), float(logp[h]), bool(eos[h])))
    return hyps


def _retrace(steps: list[_Step], sentence: int, step: int, row: int, source_len: int) -> Tensor:
    """Attention of the hypothesis that ended at (step, row), following its own back-pointers:
    (L, H, step + 1, source_len)."""
    rows = []
    for s in range(step, -1, -1):
        p = int(steps[s].position[sentence])
        rows.append(steps[s].attention[p, row, :, :, :source_len])  # (L, H, source_len)
        if s > 0:
            row = int(steps[s - 1].parents[int(steps[s - 1].position[sentence]), row])
    return torch.stack(rows[::-1], dim=2)
