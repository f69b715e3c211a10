"""An int8 model's fused encoder and decoder step (model/kernels/fused.cpp) against the PyTorch
encode and decode_step they replace: the same arithmetic, so the same results bit for bit (an
activation that came out a last bit apart could round to another int8 level)."""

import copy
import threading

import pytest
import torch

from model import kernels as loader
from model.config import ModelConfig
from model.cpu.fused import can_fuse, fuse
from model.cpu.weights import quantize_linear_int8
from model.search import beam_search
from model.transformer import Transformer
from model.translator import Translator
from tests.conftest import make_tiny_checkpoint

pytestmark = pytest.mark.kernels


@pytest.fixture(scope="module", autouse=True)
def kernels():
    assert loader.load() is not None, "model/kernels/kernels.cpp did not build"


def int8_pair(norm="pre", activation="relu", seed=0, **overrides):
    """An int8 model with the PyTorch encoder and step, and the same modules with the fused ones."""
    options = dict(src_vocab_size=50, tgt_vocab_size=60, d_model=64, n_heads=4, d_ff=96, encoder_layers=2,
                   decoder_layers=3, norm=norm, activation=activation, dropout=0.0, max_positions=64)
    options.update(overrides)
    torch.manual_seed(seed)
    # the PyTorch step attends through the same kernel as the fused one (as Translator.load builds it)
    model = quantize_linear_int8(Transformer(ModelConfig(**options), loader.decoder_attention).eval())
    for p in model.parameters():  # LayerNorms and biases away from their initial 1 and 0
        p.data += 0.1 * torch.randn_like(p)
    fused = fuse(model)  # the same modules; only encode and decode_step differ
    assert fused.model is model and fused.config is model.config
    return model, fused


NORMS_AND_ACTIVATIONS = [("pre", "relu"), ("post", "relu"), ("pre", "gelu"), ("post", "swish")]


@pytest.mark.parametrize("norm, activation", NORMS_AND_ACTIVATIONS)
def test_fused_encoder_equals_the_pytorch_encoder(norm, activation):
    model, fused = int8_pair(norm, activation)
    g = torch.Generator().manual_seed(2)
    for B, S in [(1, 1), (3, 9), (2, 40)]:
        src = torch.randint(4, 50, (B, S), generator=g)
        src[-1, S // 2 + 1:] = 0  # padding
        with torch.inference_mode():
            (expected, expected_mask), (memory, mask) = model.encode(src), fused.encode(src)
        assert memory.shape == (B, S, 64) and torch.equal(mask, expected_mask)
        assert torch.equal(memory, expected)
    with pytest.raises(RuntimeError, match="vocabulary"), torch.inference_mode():
        fused.encode(torch.tensor([[4, 50]]))


@pytest.mark.parametrize("norm, activation", NORMS_AND_ACTIVATIONS)
def test_fused_step_equals_the_pytorch_step(norm, activation):
    """Logits and attention step by step, through beam reorders and a source leaving the batch,
    with both steps writing their own copy of the cache."""
    model, fused = int8_pair(norm, activation)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 50, (3, 9), generator=g)
    src[1, 6:] = 0  # padding
    with torch.inference_mode():
        memory, mask = model.encode(src)
        caches = [m.start_cache(memory, mask, group=2, capacity=12) for m in (model, fused)]
        tokens = torch.full((6,), model.config.decoder_start_id)
        for t in range(7):
            before = copy.deepcopy(caches[1])
            (expected, expected_w), (logits, weights) = (m.decode_step(tokens, c, True) for m, c in zip((model, fused), caches))
            assert logits.shape == expected.shape and weights.shape == expected_w.shape  # (N, V), (L, N, H, S)
            assert torch.equal(logits, expected) and torch.equal(weights, expected_w)
            assert [c.length for c in caches] == [t + 1, t + 1]
            without, none = fused.decode_step(tokens, before, False)
            assert none is None and torch.equal(without, logits)
            tokens = expected.argmax(-1)
            if t == 3:  # source 1 is done: its rows leave
                rows, sources = torch.tensor([1, 1, 4, 5]), torch.tensor([0, 2])
                tokens = tokens[rows]
            else:
                rows, sources = torch.arange(len(tokens)).view(-1, 2).flip(1).reshape(-1), None
            for c in caches:
                c.reorder(rows, sources)


def test_beam_search_with_fused_calls_finds_the_same_hypotheses():
    model, fused = int8_pair("pre", "relu", seed=3)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, 50, (4, 11), generator=g)
    src[2, 4:] = 0
    caps = torch.tensor([12, 5, 9, 12])
    expected = beam_search(model, src, beam_size=3, n_best=3, max_new_tokens=caps, return_attention=True)
    found = beam_search(fused, src, beam_size=3, n_best=3, max_new_tokens=caps, return_attention=True)
    for a, b in zip(expected, found):
        assert [h.token_ids for h in a] == [h.token_ids for h in b]
        assert [h.score for h in a] == [h.score for h in b]
        for x, y in zip(a, b):
            assert torch.equal(x.attention, y.attention)


def test_only_int8_cpu_models_with_a_kernel_head_size_fuse():
    torch.manual_seed(0)
    options = dict(src_vocab_size=20, tgt_vocab_size=20, d_model=64, n_heads=4, d_ff=32, encoder_layers=1,
                   decoder_layers=1, dropout=0.0)
    float32 = Transformer(ModelConfig(**options)).eval()
    assert not can_fuse(float32)
    with pytest.raises(ValueError, match="int8"):
        fuse(float32)
    assert can_fuse(quantize_linear_int8(float32))
    odd_heads = quantize_linear_int8(Transformer(ModelConfig(**{**options, "n_heads": 16})).eval())  # 4 per head
    assert not can_fuse(odd_heads)


def test_bad_input_is_an_error_not_a_crash():
    model, fused = int8_pair()
    with torch.inference_mode():
        memory, mask = model.encode(torch.randint(4, 50, (1, 5)))
        cache = fused.start_cache(memory, mask, group=2, capacity=2)
        with pytest.raises(RuntimeError, match="vocabulary"):
            fused.decode_step(torch.tensor([1, 60]), cache)
        assert cache.length == 0
        fused.decode_step(torch.tensor([1, 2]), cache)
        fused.decode_step(torch.tensor([1, 2]), cache)
        with pytest.raises(ValueError, match="full"):
            fused.decode_step(torch.tensor([1, 2]), cache)


@pytest.fixture(scope="module")
def int8_checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("fused"), seed=4, d_ff=128)


def test_the_int8_translator_fuses_and_threads_share_the_fused_calls(int8_checkpoint):
    translator = Translator.load(int8_checkpoint, device="cpu", dtype="int8")
    assert translator.fused
    texts = ["Open the file.", "Save your changes now please.", "Print.", "Close the window and the dialog.",
             "Hello world.", "Click the button to print the document."]
    fused = translator.translate(texts, beam_size=3, n_best=2, return_attention=True)
    # the same int8 model and search step, with the PyTorch encoder and decoder step
    pytorch = Translator(translator.model, translator.tokenizer, select_fn=translator.select_fn)
    reference = pytorch.translate(texts, beam_size=3, n_best=2, return_attention=True)
    for a, b in zip(fused, reference):
        assert [h.token_ids for h in a.hypotheses] == [h.token_ids for h in b.hypotheses]
        assert torch.equal(a.hypotheses[0].attention, b.hypotheses[0].attention)
    # the fused calls are shared by threads decoding side by side (Translator.translate(parallel=N))
    results = {}

    def run(i):
        results[i] = translator.translate(texts, beam_size=3, n_best=2, batch_tokens=40, parallel=2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in results.values():
        assert [r.hypotheses[0].token_ids for r in out] == [r.hypotheses[0].token_ids for r in fused]
