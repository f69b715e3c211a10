import itertools

import pytest
import torch

from model.config import ModelConfig
from model.search import beam_search, top_candidates, topk_rows
from model.transformer import Transformer

PAD, START, EOS = 0, 1, 2


def tiny(vocab=40, eos_bias=0.0, seed=0, **overrides):
    options = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32, n_heads=4, d_ff=64, encoder_layers=2,
                   decoder_layers=2, dropout=0.0, output_bias=True, pad_id=PAD, bos_id=START, eos_id=EOS,
                   decoder_start_id=START)
    options.update(overrides)
    torch.manual_seed(seed)
    m = Transformer(ModelConfig(**options)).eval()
    with torch.no_grad():
        m.output_proj.bias.normal_(0, 0.5)
        m.output_proj.bias[EOS] += eos_bias
    return m


def sources():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (4, 12), generator=g)
    for row, length in enumerate([12, 3, 7, 1]):
        src[row, length - 1] = EOS
        src[row, length:] = PAD
    return src


def teacher_forced(m, src_row, tokens, ended_with_eos):
    """Sum of log-probs of tokens (+ EOS) and the encoder-decoder attention, by full recomputation."""
    src_row = src_row[src_row != PAD][None]
    outputs = tokens + ([EOS] if ended_with_eos else [])
    tgt_in = torch.tensor([[START] + outputs[:-1]])
    memory, mask = m.encode(src_row)
    logits, attn = m.decode(tgt_in, memory, mask, need_weights=True)
    logp = logits.log_softmax(-1)[0]
    return sum(logp[i, t].item() for i, t in enumerate(outputs)), attn[:, 0]


def greedy_reference(m, src_row, max_new):
    """Plain greedy decoding by full recomputation, PAD forbidden."""
    src_row = src_row[src_row != PAD][None]
    memory, mask = m.encode(src_row)
    out = []
    for _ in range(max_new):
        logits, _ = m.decode(torch.tensor([[START] + out]), memory, mask)
        logits[0, -1, PAD] = float("-inf")
        tok = int(logits[0, -1].argmax())
        if tok == EOS:
            return out, True
        out.append(tok)
    return out, False


@pytest.mark.parametrize("eos_bias", [3.0, -5.0])  # sentences that end early / that hit the cap
def test_beam_one_is_greedy_and_scores_are_teacher_forced(eos_bias):
    m = tiny(eos_bias=eos_bias)
    src = sources()
    results = beam_search(m, src, beam_size=1, max_new_tokens=9)
    for row, [hyp] in enumerate(results):
        tokens, ended = greedy_reference(m, src[row], 9)
        assert (hyp.token_ids, hyp.ended_with_eos) == (tokens, ended)
        logp, _ = teacher_forced(m, src[row], hyp.token_ids, hyp.ended_with_eos)
        length = len(hyp.token_ids) + hyp.ended_with_eos
        assert hyp.log_prob == pytest.approx(logp, abs=1e-4)
        assert hyp.score == pytest.approx(logp / length, abs=1e-4)


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_beam_scores_and_nbest_order(alpha):
    m = tiny(eos_bias=1.0)
    src = sources()
    results = beam_search(m, src, beam_size=4, n_best=4, length_penalty=alpha, max_new_tokens=8)
    for row, hyps in enumerate(results):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.token_ids) + (h.ended_with_eos,) for h in hyps}) == 4
        for h in hyps:
            assert PAD not in h.token_ids and EOS not in h.token_ids
            logp, _ = teacher_forced(m, src[row], h.token_ids, h.ended_with_eos)
            length = len(h.token_ids) + h.ended_with_eos
            assert h.score == pytest.approx(logp / length**alpha, abs=1e-4)
            assert h.ended_with_eos or length == 8


def test_wide_beam_equals_brute_force():
    vocab, max_new = 6, 3  # outputs: ids 1, 3, 4, 5 (PAD is forbidden) and EOS
    m = tiny(vocab=vocab, eos_bias=-0.5, seed=5)
    src = torch.tensor([[4, 5, 3, EOS]])
    best = None
    words = [1, 3, 4, 5]
    for length in range(max_new + 1):
        for seq in itertools.product(words, repeat=length):
            ended = length < max_new
            logp, _ = teacher_forced(m, src[0], list(seq), ended)
            score = logp / (length + ended)
            if best is None or score > best[0]:
                best = (score, list(seq), ended)
    [hyp] = beam_search(m, src, beam_size=100, max_new_tokens=max_new)[0]
    assert (hyp.token_ids, hyp.ended_with_eos) == (best[1], best[2])
    assert hyp.score == pytest.approx(best[0], abs=1e-5)
    assert len(best[1]) > 0  # the test is only meaningful if the best output is not empty


@pytest.mark.parametrize("beam", [1, 4])
def test_batch_invariance(beam):
    m = tiny(eos_bias=1.5)
    src = sources()
    batched = beam_search(m, src, beam_size=beam, n_best=beam, max_new_tokens=torch.tensor([10, 4, 7, 3]))
    for row, cap in enumerate([10, 4, 7, 3]):
        alone_src = src[row : row + 1, : int((src[row] != PAD).sum())]
        alone = beam_search(m, alone_src, beam_size=beam, n_best=beam, max_new_tokens=cap)[0]
        assert [h.token_ids for h in alone] == [h.token_ids for h in batched[row]]
        for a, b in zip(alone, batched[row]):
            assert a.score == pytest.approx(b.score, abs=1e-4)


@pytest.mark.parametrize("beam, n_best", [(1, 1), (4, 3), (5, 5)])
def test_captured_attention_follows_each_hypothesis(beam, n_best):
    m = tiny(eos_bias=1.0)
    src = sources()
    results = beam_search(m, src, beam_size=beam, n_best=n_best, max_new_tokens=7, return_attention=True)
    for row, hyps in enumerate(results):
        source_len = int((src[row] != PAD).sum())
        for h in hyps:
            T = len(h.token_ids) + h.ended_with_eos
            assert h.attention.shape == (2, 4, T, source_len)
            torch.testing.assert_close(h.attention.sum(-1), torch.ones(2, 4, T))
            _, expected = teacher_forced(m, src[row], h.token_ids, h.ended_with_eos)
            torch.testing.assert_close(h.attention, expected, atol=1e-5, rtol=1e-4)


def test_attention_is_not_computed_unless_asked():
    m = tiny()
    [[hyp]] = beam_search(m, sources()[:1], beam_size=2, max_new_tokens=5)
    assert hyp.attention is None


def test_options_are_validated():
    m = tiny()
    with pytest.raises(ValueError, match="n_best"):
        beam_search(m, sources(), beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        beam_search(m, sources(), max_new_tokens=0)


def reference_candidates(logits, run_scores, n, pad_id):
    """The selection as first written: log_softmax over the vocabulary, add, top-k over k * V."""
    B, k = run_scores.shape
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp[:, pad_id] = float("-inf")
    V = logp.size(-1)
    scores, flat = (run_scores.view(-1, 1) + logp).view(B, k * V).topk(n, dim=1)
    return scores, flat // V, flat % V


@pytest.mark.parametrize("vocab", [32000, 8000, 5000, 40])  # two-level top-k; plain top-k (5000 % 32, 40)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_candidates_equal_full_vocabulary_selection(vocab, dtype):
    g = torch.Generator().manual_seed(vocab)
    B, k = 6, 4
    logits = (torch.randn(B * k, vocab, generator=g) * 4).to(dtype)  # bfloat16: many exact ties
    run_scores = torch.randn(B, k, generator=g) * 3
    run_scores[0, 1:] = -1e9  # first step: only beam 0 is live
    scores, rows, tokens = top_candidates(logits.clone(), run_scores, 2 * k, (PAD,))
    ref_scores, ref_rows, ref_tokens = reference_candidates(logits, run_scores, 2 * k, PAD)
    torch.testing.assert_close(scores, ref_scores, atol=0, rtol=0)
    # (beam, token) pairs may differ only among exactly equal scores: each must carry its score
    logp = torch.log_softmax(logits.float(), dim=-1).view(B, k, vocab)
    picked = logp[torch.arange(B)[:, None], rows, tokens] + run_scores.gather(1, rows)
    torch.testing.assert_close(picked, scores, atol=0, rtol=0)
    assert not (tokens == PAD).any()
    if dtype == torch.float32:  # no ties: the very same candidates
        assert torch.equal(rows, ref_rows) and torch.equal(tokens, ref_tokens)


@pytest.mark.parametrize("n", [1, 2, 8, 50])
def test_topk_rows_equals_topk(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(7, 32000, generator=g)
    x[0] = 1.0  # a row of ties
    x[1, :5000] = x[1].max() + 1  # ties at the top, spread over many blocks
    x[2, 1000::1000] = 100.0 + torch.arange(31.0)  # the best all in one block
    values, idx = topk_rows(x, n)
    ref_values, _ = x.topk(n, dim=-1)
    assert torch.equal(values, ref_values)
    assert torch.equal(x.gather(1, idx), values)
    assert all(len(set(row)) == n for row in idx.tolist())


def test_bfloat16_search_keeps_float32_scores_and_attention():
    m = tiny(eos_bias=1.0)
    src = sources()
    results = beam_search(m.to(torch.bfloat16), src, beam_size=3, n_best=2, max_new_tokens=6, return_attention=True)
    for row, hyps in enumerate(results):
        source_len = int((src[row] != PAD).sum())
        for h in hyps:
            T = len(h.token_ids) + h.ended_with_eos
            assert h.attention.dtype == torch.float32 and h.attention.shape == (2, 4, T, source_len)
            torch.testing.assert_close(h.attention.sum(-1), torch.ones(2, 4, T))
            assert isinstance(h.score, float) and h.log_prob <= 0


def test_length_groups_minimise_padding_plus_group_cost():
    from model.search import length_groups

    lengths = [30, 3, 31, 4, 29, 5, 3]
    groups = length_groups(lengths, group_cost=10)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert [sorted(lengths[i] for i in g) for g in groups] == [[3, 3, 4, 5], [29, 30, 31]]
    assert length_groups(lengths, group_cost=1000) == [sorted(range(7), key=lambda i: lengths[i])]
    assert length_groups([7, 7, 7], group_cost=0) == [[0, 1, 2]]  # equal lengths never split
    # brute force over every way to cut the sorted rows
    lengths = [9, 1, 4, 4, 12, 2, 8, 15]
    order = sorted(range(8), key=lambda i: lengths[i])
    cost = lambda gs: sum(len(g) * max(lengths[i] for i in g) + 5 for g in gs)  # noqa: E731
    best = min(cost([order[a:b] for a, b in zip((0,) + cuts, cuts + (8,))])
               for r in range(8) for cuts in itertools.combinations(range(1, 8), r))
    assert cost(length_groups(lengths, group_cost=5)) == best


def test_grouped_encoding_equals_padded_encoding():
    from model.search import encode_by_length, length_groups

    m = tiny()
    g = torch.Generator().manual_seed(5)
    lengths = [40, 2, 39, 3, 41, 1]
    src = torch.full((len(lengths), 41), PAD)
    for row, n in enumerate(lengths):
        src[row, : n - 1] = torch.randint(4, 40, (n - 1,), generator=g)
        src[row, n - 1] = EOS
    assert len(length_groups(lengths)) == 2  # the short and the long ones apart
    with torch.no_grad():
        ref, ref_mask = m.encode(src)
        memory, mask = encode_by_length(m, src)
    assert torch.equal(mask, ref_mask)
    real = ref_mask[:, 0, 0, :, None]  # (B, S, 1)
    torch.testing.assert_close(memory * real, ref * real, atol=1e-5, rtol=1e-5)


def test_the_gpu_form_of_rows_top_ranks_as_the_cpu_form():
    """Off the CPU, rows_top takes all rows at once with torch's top-k (one launch each); on the CPU
    it goes cache-sized slices with the two-pass top-k. Both give the same log-probs."""
    from model.search import _row_top, rows_top

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(37, 32000, generator=g).to(torch.bfloat16)
    cpu_values, cpu_tokens = rows_top(logits, 8, banned=(0, 3))
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp[:, [0, 3]] = float("-inf")
    gpu_values, gpu_tokens = logp.topk(8, dim=-1)  # what _row_top does on a GPU, over all rows
    assert torch.equal(cpu_values, gpu_values)
    assert torch.equal(logp.gather(1, cpu_tokens), gpu_values)  # the tokens carry those values
    assert torch.equal(_row_top(logits.float(), 8, (0, 3))[0], cpu_values)
