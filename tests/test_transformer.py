import pytest
import torch

from model.config import ModelConfig
from model.transformer import Transformer, attention, sinusoidal_positions


def tiny(**overrides):
    options = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, d_ff=64,
                   encoder_layers=3, decoder_layers=2, dropout=0.0, decoder_start_id=1)
    options.update(overrides)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**options)).eval()


def batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 9), generator=g)
    src[1, 6:] = 0  # padding
    src[2, 3:] = 0
    tgt = torch.randint(4, 40, (3, 7), generator=g)
    tgt[:, 0] = 1
    return src, tgt


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
def test_cached_decoding_matches_full_recomputation(norm, activation):
    m = tiny(norm=norm, activation=activation, output_bias=True, share_embeddings=norm == "pre")
    src, tgt = batch()
    memory, mask = m.encode(src)
    full_logits, full_attn = m.decode(tgt, memory, mask, need_weights=True)
    cache = m.start_cache(memory, mask, group=1, capacity=tgt.size(1))
    for t in range(tgt.size(1)):
        logits, attn = m.decode_step(tgt[:, t], cache, need_weights=True)
        torch.testing.assert_close(logits, full_logits[:, t], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(attn, full_attn[:, :, :, t], atol=1e-6, rtol=1e-5)


def test_grouped_rows_and_reorder_match_independent_rows():
    """Beams share their source's encoder-decoder keys; reordering moves self-attention state."""
    m = tiny()
    src, tgt = batch()
    memory, mask = m.encode(src)
    g = 2
    cache = m.start_cache(memory, mask, group=g, capacity=5)
    rows_tgt = tgt.repeat_interleave(g, 0)  # (6, T)
    rows_tgt[1::2, 1:] = torch.randint(4, 40, (3, 6))  # the second beam of each source differs
    for t in range(3):
        cache_logits, _ = m.decode_step(rows_tgt[:, t], cache)
    swap = torch.tensor([1, 0, 2, 3, 5, 4])
    cache.reorder(swap)
    rows_tgt = rows_tgt[swap]
    logits, _ = m.decode_step(rows_tgt[:, 3], cache)
    full, _ = m.decode(rows_tgt[:, :4], memory.repeat_interleave(g, 0), mask.repeat_interleave(g, 0))
    torch.testing.assert_close(logits, full[:, 3], atol=1e-5, rtol=1e-5)
    # dropping source 1 keeps sources 0 and 2 intact
    keep = torch.tensor([0, 2])
    cache.reorder(torch.tensor([0, 1, 4, 5]), sources=keep)
    logits, _ = m.decode_step(rows_tgt[[0, 1, 4, 5], 4], cache)
    full, _ = m.decode(rows_tgt[[0, 1, 4, 5], :5], memory[keep].repeat_interleave(g, 0), mask[keep].repeat_interleave(g, 0))
    torch.testing.assert_close(logits, full[:, 4], atol=1e-5, rtol=1e-5)


def test_explicit_attention_equals_fused_kernel():
    q, k, v = torch.randn(3, 2, 4, 5, 8).unbind(0)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    fused, none = attention(q, k, v, mask, need_weights=False, dropout=0.0)
    explicit, weights = attention(q, k, v, mask, need_weights=True, dropout=0.0)
    assert none is None
    torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
    assert weights[1, ..., 3:].abs().max() == 0


def test_padding_does_not_change_encoder_output():
    m = tiny()
    src, _ = batch()
    alone, _ = m.encode(src[2:3, :3])
    padded, _ = m.encode(src)
    torch.testing.assert_close(padded[2, :3], alone[0], atol=1e-5, rtol=1e-5)


def test_positions_are_sinusoids():
    pe = sinusoidal_positions(50, 16)
    assert pe.shape == (50, 16)
    torch.testing.assert_close(pe[:, 0], torch.sin(torch.arange(50.0)))
    torch.testing.assert_close(pe[:, 8], torch.cos(torch.arange(50.0)))


def test_config_round_trip_and_validation(tmp_path):
    c = ModelConfig(src_vocab_size=10, tgt_vocab_size=12, norm="pre", activation="gelu", encoder_layers=8,
                    decoder_layers=1)
    c.save(tmp_path / "config.json")
    assert ModelConfig.load(tmp_path / "config.json") == c
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="activation"):
        ModelConfig(src_vocab_size=10, tgt_vocab_size=10, activation="tanh")
    with pytest.raises(ValueError, match="share_embeddings"):
        ModelConfig(src_vocab_size=10, tgt_vocab_size=12, share_embeddings=True)


def test_deep_encoder_shallow_decoder_and_tying():
    m = tiny(encoder_layers=5, decoder_layers=1, share_embeddings=True)
    assert len(m.encoder_layers) == 5 and len(m.decoder_layers) == 1
    assert m.src_embed.weight is m.tgt_embed.weight is m.output_proj.weight
    untied = tiny(tie_output=False)
    assert untied.output_proj.weight is not untied.tgt_embed.weight


def test_repeated_reorders_and_shrinks_match_full_recomputation():
    """The cache gathers into a second buffer and swaps; several reorders in a row (some
    shrinking the batch, some the identity) must leave every row's keys/values intact."""
    m = tiny()
    src, _ = batch()
    memory, mask = m.encode(src)
    g, T = 3, 8
    g_rows = torch.Generator().manual_seed(2)
    rows_tgt = torch.randint(4, 40, (9, T), generator=g_rows)
    rows_tgt[:, 0] = 1
    sources = torch.arange(3)
    cache = m.start_cache(memory, mask, group=g, capacity=T)
    with torch.inference_mode():
        for t in range(T - 1):
            logits, _ = m.decode_step(rows_tgt[:, t], cache)
            full, _ = m.decode(rows_tgt[:, : t + 1], memory[sources].repeat_interleave(g, 0),
                               mask[sources].repeat_interleave(g, 0))
            torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)
            n_src = sources.numel()
            if t == 3:  # drop the middle source (or the last one left)
                keep = torch.tensor([0, 2]) if n_src == 3 else torch.tensor([0])
                rows = (keep[:, None] * g + torch.tensor([2, 0, 0])).view(-1)
                cache.reorder(rows, sources=keep)
                sources, rows_tgt = sources[keep], rows_tgt[rows]
            elif t % 2 == 0:  # back-pointers within each source
                rows = (torch.arange(n_src)[:, None] * g + torch.tensor([1, 1, 2])).view(-1)
                cache.reorder(rows)
                rows_tgt = rows_tgt[rows]
            else:
                cache.reorder(torch.arange(n_src * g))


def test_the_same_seed_builds_the_same_model():
    """Initialisation walks the embeddings in a fixed order: two models built after the same seed
    are equal (a set of modules iterates in an order that varies from run to run)."""
    config = ModelConfig(src_vocab_size=30, tgt_vocab_size=40, d_model=16, n_heads=2, d_ff=32, encoder_layers=1,
                         decoder_layers=1)
    models = []
    for _ in range(4):
        torch.manual_seed(0)
        models.append(Transformer(config))
    for other in models[1:]:
        for (name, a), (_, b) in zip(models[0].state_dict().items(), other.state_dict().items()):
            assert torch.equal(a, b), name
