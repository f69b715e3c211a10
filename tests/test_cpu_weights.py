import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.cpu.weights import (
    Int8Linear,
    PrepackedFeedForward,
    PrepackedLinear,
    can_prepack_bf16,
    prepack_linear_bf16,
    quantize_linear_int8,
)
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
    plain = Translator.load(tiny_checkpoint, device="cpu", dtype="bfloat16", prepack=False)
    packed = Translator.load(tiny_checkpoint, device="cpu", dtype="bfloat16")
    assert isinstance(packed.model.output_proj, PrepackedLinear)
    assert isinstance(plain.model.output_proj, nn.Linear)
    assert not any(isinstance(m, nn.Linear) for m in packed.model.modules())
    texts = ["Open the file.", "Save your changes now please.", "Click the button to print the document."]
    a = plain.translate(texts, beam_size=3, n_best=2, attention=True)
    b = packed.translate(texts, beam_size=3, n_best=2, attention=True)
    for x, y in zip(a, b):
        assert [h.token_ids for h in x.hypotheses] == [h.token_ids for h in y.hypotheses]
        assert [h.score for h in x.hypotheses] == [h.score for h in y.hypotheses]
        for hx, hy in zip(x.hypotheses, y.hypotheses):
            assert torch.equal(hx.attention, hy.attention)


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16 oneDNN kernels")
def test_feed_forward_activation_moves_into_the_packed_product():
    from model.transformer import PositionwiseFeedForward

    torch.manual_seed(0)
    for activation in ("relu", "swish", "gelu"):
        layer = nn.Sequential(PositionwiseFeedForward(32, 64, activation, 0.0)).eval().bfloat16()
        x = torch.randn(5, 32, dtype=torch.bfloat16)
        expected = layer(x)
        prepack_linear_bf16(layer)
        ffn = layer[0]
        fused = activation != "gelu"  # oneDNN's gelu is not torch's exactly: left as it was
        assert isinstance(ffn, PrepackedFeedForward) == fused
        assert isinstance(ffn.w1, PrepackedLinear) and (ffn.w1.activation != "none") == fused
        if activation == "relu":
            assert torch.equal(ffn(x), expected)
        else:  # swish: computed before the rounding to bf16 instead of after
            torch.testing.assert_close(ffn(x), expected, atol=0.05, rtol=0.02)


@pytest.fixture(params=["kernels", "pytorch"])
def int8_kernels(request):
    """Int8Linear's products on the C++ kernels (model/kernels/int8.cpp), or None: its PyTorch twin."""
    from model import kernels as loader

    if request.param == "kernels":
        assert loader.load() is not None
        return loader.load()
    return None


def test_int8_rows_are_independent_of_the_batch_and_close_to_float32(int8_kernels):
    torch.manual_seed(0)
    linear = nn.Linear(64, 300)
    int8 = Int8Linear(linear, int8_kernels)
    # rows of very different magnitudes, as in a real batch; one all zero
    x = torch.randn(9, 64) * torch.tensor([1e-3, 0.1, 1, 3, 10, 100, 0, 1, 2])[:, None]
    with torch.inference_mode():
        batched = int8(x)
        for i in range(len(x)):
            assert torch.equal(int8(x[i:i + 1]), batched[i:i + 1])
        assert torch.equal(int8(x.view(3, 3, 64)), batched.view(3, 3, 300))
        reference = linear(x)
        torch.testing.assert_close(batched[6], linear.bias, rtol=0, atol=1e-6)  # a zero row: the bias
        for row, expected in zip(batched, reference):
            if expected.abs().max() > linear.bias.abs().max() * 2:  # rows the product dominates
                assert (row - expected).norm() < 0.03 * expected.norm()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.ao, for the comparison only
def test_one_scale_per_batch_would_mix_rows_up():
    """Why Int8Linear scales rows: PyTorch's dynamic quantization gives a row another result
    when a larger row shares its batch."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    plain = torch.ao.quantization.quantize_dynamic(nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(2, 64) * torch.tensor([[1.0], [50.0]])
    with torch.inference_mode():
        assert not torch.equal(plain(x)[:1], plain(x[:1]))
        assert torch.equal(Int8Linear(linear)(x)[:1], Int8Linear(linear)(x[:1]))


def test_quantize_replaces_every_linear_in_place():
    from model.transformer import PositionwiseFeedForward

    ffn = PositionwiseFeedForward(32, 64, "relu", 0.0).eval()
    assert quantize_linear_int8(ffn) is ffn
    assert isinstance(ffn.w1, Int8Linear) and isinstance(ffn.w2, Int8Linear)
    with torch.inference_mode():
        assert ffn(torch.randn(2, 5, 32)).shape == (2, 5, 32)


def test_a_build_waits_for_a_live_builder_and_clears_what_a_killed_one_left(tmp_path):
    """torch's loader waits forever on its lock file: a build held by a live process is waited
    for, and the lock file of one that was killed goes once it is dead."""
    import subprocess
    import sys
    import threading

    from model.kernels import build_lock

    builder = ("import sys, time; from pathlib import Path; from model.kernels import build_lock\n"
               "with build_lock(Path(sys.argv[1])):\n"
               "    (Path(sys.argv[1]) / 'lock').touch(); print('building', flush=True); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", builder, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "building\n"
        acquired = threading.Event()

        def build():
            with build_lock(tmp_path):
                acquired.set()

        threading.Thread(target=build, daemon=True).start()
        assert not acquired.wait(1.0)  # the builder is alive: wait for it
    finally:
        child.kill()
        child.wait()
    assert acquired.wait(30)  # killed mid-build: its lock file is left, and is no reason to wait
    assert not (tmp_path / "lock").exists()
