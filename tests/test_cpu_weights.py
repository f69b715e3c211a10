import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.cpu_weights import PrepackedLinear, can_prepack_bf16, prepack_linear_bf16
from model.translator import Translator

NATIVE_BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_only_bfloat16_cpu_models_are_prepacked():
    assert not can_prepack_bf16(nn.Linear(8, 4))  # float32
    assert can_prepack_bf16(nn.Linear(8, 4).bfloat16()) == NATIVE_BF16
    with pytest.raises(ValueError, match="bfloat16 model on a CPU"):
        prepack_linear_bf16(nn.Sequential(nn.Linear(8, 4)))


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16 oneDNN kernels")
@pytest.mark.parametrize("bias", [True, False])
def test_prepacked_linear_is_bit_identical_to_linear(bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, 300, bias=bias).bfloat16()
    packed = PrepackedLinear(linear)
    for shape in [(1, 64), (7, 64), (130, 64), (3, 5, 64)]:
        x = torch.randn(shape, dtype=torch.bfloat16)
        assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16 oneDNN kernels")
def test_prepacked_translator_gives_the_same_translations_and_attention(tiny_checkpoint):
    plain = Translator(tiny_checkpoint, device="cpu", dtype="bfloat16", prepack=False)
    packed = Translator(tiny_checkpoint, device="cpu", dtype="bfloat16")
    assert isinstance(packed.model.output_proj, PrepackedLinear)
    assert isinstance(plain.model.output_proj, nn.Linear)
    assert not any(isinstance(m, nn.Linear) for m in packed.model.modules())
    texts = ["Open the file.", "Save your changes now please.", "Click the button to print the document."]
    a = plain.translate(texts, beam_size=3, n_best=2, return_attention=True)
    b = packed.translate(texts, beam_size=3, n_best=2, return_attention=True)
    for x, y in zip(a, b):
        assert [h.token_ids for h in x.hypotheses] == [h.token_ids for h in y.hypotheses]
        assert [h.score for h in x.hypotheses] == [h.score for h in y.hypotheses]
        for hx, hy in zip(x.hypotheses, y.hypotheses):
            assert torch.equal(hx.attention, hy.attention)


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16 oneDNN kernels")
def test_feed_forward_activation_moves_into_the_packed_product():
    from model.transformer import PositionwiseFeedForward

    torch.manual_seed(0)
    for activation, fn in [("relu", F.relu), ("swish", F.silu), ("gelu", F.gelu)]:
        ffn = PositionwiseFeedForward(32, 64, activation, 0.0).eval().bfloat16()
        x = torch.randn(5, 32, dtype=torch.bfloat16)
        expected = ffn(x)
        prepack_linear_bf16(ffn)
        fused = activation != "gelu"  # oneDNN's gelu is not torch's exactly: left as it was
        assert isinstance(ffn.w1, PrepackedLinear) and (ffn.w1.activation != "none") == fused
        if activation == "relu":
            assert torch.equal(ffn(x), expected)
        else:  # swish: computed before the rounding to bf16 instead of after
            torch.testing.assert_close(ffn(x), expected, atol=0.05, rtol=0.02)
