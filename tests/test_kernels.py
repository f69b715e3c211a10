"""Every C++ operation of model/kernels against its PyTorch reference, in one place: attention
(kernels.cpp) against transformer.attention, candidate selection and the search step (kernels.cpp,
search.cpp) against search.rows_top and search.select, int8 products (int8.cpp) against
Int8Linear.twin, an int8 model's encoder and decoder step (fused.cpp) against Transformer.encode and
decode_step; then the loader (builds, read-only caches, vector widths)."""

import copy
import logging
import os
import threading
from pathlib import Path

import pytest
import torch

from model import kernels as loader
from model.config import ModelConfig
from model.cpu.fused import can_fuse, fuse
from model.cpu.weights import Int8Linear, quantize_linear_int8
from model.search import beam_search, rows_top, select
from model.transformer import Transformer, attention
from model.translator import Translator
from tests.conftest import make_tiny_checkpoint

pytestmark = pytest.mark.kernels

DTYPES = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}  # output tolerance per storage type


@pytest.fixture(scope="module")
def kernels():
    """The kernels must build wherever the tests run (g++ and ninja are installed with the project);
    a silent fallback to PyTorch ops would hide a broken build."""
    module = loader.load()
    assert module is not None, "model/kernels/kernels.cpp did not build; see the warning logged above"
    return module


def reference_attention(q, k, v, bias):
    scores = (q.float() @ k.float().transpose(-2, -1)) * q.size(-1) ** -0.5
    if bias is not None:
        scores = scores + bias.float()
    weights = scores.softmax(-1)
    return weights @ v.float(), weights


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("Dh", [16, 32, 64, 128])
@pytest.mark.parametrize("Tq, Tk", [(1, 1), (1, 7), (4, 16), (2, 33)])
def test_attention_equals_softmax_attention(kernels, dtype, Dh, Tq, Tk):
    g = torch.Generator().manual_seed(Dh + Tk)
    B, H = 3, 4
    # keys and values as a decoder cache holds them: (B, capacity, 2, H, Dh), read as strided views
    cache = torch.randn(B, Tk + 5, 2, H, Dh, generator=g).to(dtype)
    k, v = cache[:, :Tk].transpose(1, 3).unbind(2)  # (B, H, Tk, Dh) each
    q = torch.randn(B, Tq, H, Dh, generator=g).to(dtype).transpose(1, 2)  # (B, H, Tq, Dh), strided
    bias = torch.zeros(B, 1, 1, Tk, dtype=dtype)
    cut = (Tk + 1) // 2
    bias[1, ..., cut:] = float("-inf")  # source padding (none when Tk = 1)
    for b in (None, bias):
        out, weights = loader.attention(q, k, v, b, need_weights=True)
        expected, expected_weights = reference_attention(q, k, v, b)
        assert out.dtype == dtype and out.shape == (B, H, Tq, Dh)
        assert weights.dtype == torch.float32 and weights.shape == (B, H, Tq, Tk)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out.float(), expected, atol=DTYPES[dtype], rtol=DTYPES[dtype])
        if b is not None and cut < Tk:
            assert weights[1, ..., cut:].abs().max() == 0
        alone, none = loader.attention(q, k, v, b, need_weights=False)
        assert none is None and torch.equal(alone, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keys_masked_at_either_end_are_skipped_as_if_absent(kernels, dtype):
    """A running batch's row reads the columns from its start on (the ones before: -inf), a padded
    source the positions before its padding: each entry's output is bit for bit the one over its
    own keys alone, and the masked keys' weights are exactly 0, even where they hold NaN."""
    g = torch.Generator().manual_seed(11)
    H, Dh, Tk = 2, 32, 37
    k, v = (torch.randn(3, H, Tk, Dh, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(3, H, 1, Dh, generator=g).to(dtype)
    spans = [(0, Tk), (5, Tk), (9, 30)]  # the columns each entry reads
    bias = torch.full((3, 1, 1, Tk), float("-inf"), dtype=dtype)
    for b, (first, last) in enumerate(spans):
        bias[b, ..., first:last] = 0.0
        k[b, :, :first] = float("nan")  # never read
    out, weights = loader.attention(q, k, v, bias, True)
    for b, (first, last) in enumerate(spans):
        alone, alone_weights = loader.attention(q[b : b + 1], k[b : b + 1, :, first:last], v[b : b + 1, :, first:last],
                                                None, True)
        assert torch.equal(out[b : b + 1], alone)
        assert torch.equal(weights[b : b + 1, ..., first:last], alone_weights)
        assert weights[b, ..., :first].abs().sum() == 0 and weights[b, ..., last:].abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_through_a_slot_table_equals_attention_on_gathered_keys(kernels, monkeypatch, dtype):
    """rows[b, j]: the cache slot holding key j of entry b (beams that share a history)."""
    g = torch.Generator().manual_seed(5)
    slots, B, H, Dh, Tk = 6, 4, 2, 32, 9
    cache = torch.randn(slots, Tk + 3, 2, H, Dh, generator=g).to(dtype)
    k, v = cache[:, :Tk].transpose(1, 3).unbind(2)  # (slots, H, Tk, Dh)
    rows = torch.randint(0, slots, (B, Tk), generator=g)
    q = torch.randn(B, H, 1, Dh, generator=g).to(dtype)
    out, weights = loader.attention(q, k, v, None, True, rows=rows)
    positions = torch.arange(Tk)
    gathered_k, gathered_v = k[rows, :, positions].transpose(1, 2), v[rows, :, positions].transpose(1, 2)
    expected, expected_weights = reference_attention(q, gathered_k, gathered_v, None)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.float(), expected, atol=DTYPES[dtype], rtol=DTYPES[dtype])
    with pytest.raises(RuntimeError, match="slots"):
        loader.attention(q, k, v, None, False, rows=rows + slots)
    with torch.inference_mode():  # the reference (model/transformer.py) gathers the keys
        twin, twin_weights = attention(q, k, v, None, True, 0.0, rows=rows)
    torch.testing.assert_close(twin_weights, weights, atol=DTYPES[dtype], rtol=DTYPES[dtype])  # bf16 scores there
    torch.testing.assert_close(twin.float(), out.float(), atol=DTYPES[dtype], rtol=DTYPES[dtype])


def test_attention_rejects_what_it_cannot_do(kernels):
    q = torch.randn(2, 4, 1, 16)
    with pytest.raises(RuntimeError, match="head size"):
        kernels.attention(torch.randn(2, 4, 1, 24), torch.randn(2, 4, 3, 24), torch.randn(2, 4, 3, 24), None, False)
    with pytest.raises(RuntimeError, match="contiguous"):
        k = torch.randn(2, 4, 16, 3).transpose(2, 3)
        kernels.attention(q, k, k, None, False)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        kernels.attention(q.double(), q.double(), q.double(), None, False)
    assert not loader.handles_attention(torch.randn(2, 4, 1, 24), torch.randn(2, 4, 3, 24), None)
    assert not loader.handles_attention(q, q, torch.ones(2, 1, 1, 1, dtype=torch.bool))  # a bool mask
    with torch.inference_mode():
        assert loader.handles_attention(q, q, torch.zeros(2, 1, 1, 1))
    assert not loader.handles_attention(q, q, None)  # gradients wanted: PyTorch ops


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("V, m", [(5, 5), (40, 3), (8000, 8), (1003, 32)])
def test_row_top_equals_log_softmax_topk(kernels, dtype, V, m):
    g = torch.Generator().manual_seed(V + m)
    logits = (torch.randn(6, V, generator=g) * 4).to(dtype)
    logits[2, : V // 2] = float("-inf")  # a row with impossible tokens
    banned = (0, V - 1)
    values, columns = loader.row_top(logits, m, banned)
    logp = logits.float().log_softmax(-1)
    logp[:, list(banned)] = float("-inf")
    expected_values, _ = logp.topk(m, dim=-1)
    torch.testing.assert_close(values, expected_values, atol=2e-6, rtol=1e-6)
    # each chosen column has the value reported, and none is banned
    torch.testing.assert_close(logp.gather(1, columns), values, atol=2e-6, rtol=1e-6)
    finite = values.isfinite()
    assert not any(int(c) in banned for c in columns[finite])
    assert (columns[finite].view(-1, 1) != torch.tensor(banned)).all()


def test_row_top_ties_keep_the_lower_column(kernels):
    logits = torch.zeros(1, 64)
    logits[0, [9, 40, 3]] = 1.0
    values, columns = loader.row_top(logits, 4, ())
    assert columns.tolist() == [[3, 9, 40, 0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_top_equals_its_reference(kernels, dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(12, 300, generator=g) * 3).to(dtype)
    with torch.inference_mode():
        fast = loader.row_top(logits, 8, (0, 2))
        slow = rows_top(logits, 8, (0, 2))
        logp = torch.log_softmax(logits.float(), -1)
    torch.testing.assert_close(fast[0], slow[0], atol=2e-6, rtol=1e-6)
    if dtype == torch.float32:
        assert torch.equal(fast[1], slow[1])
    else:  # bf16 logits tie often: the kernel takes the lower column, torch.topk any of them
        torch.testing.assert_close(logp.gather(1, fast[1]), fast[0], atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("k, V", [(1, 50), (4, 300), (3, 4)])
def test_a_search_step_is_the_same_in_cpp_and_pytorch(kernels, k, V):
    """kernels.select against model/search.py's select: candidates, the pool of finished
    hypotheses and the beams that continue, from states a search meets: empty, part-full and full
    pools, sentences at their cap, EOS among the best candidates, a vocabulary smaller than 2k (V = 4)."""

    g = torch.Generator().manual_seed(k * V)
    B, eos = 5, 2
    for t in range(6):
        logits = torch.randn(B * k, V, generator=g) * 3
        logits[::2, eos] += 4  # EOS among the best of some rows
        run_scores = -torch.rand(B, k, generator=g) * 10
        pool_scores = torch.full((B, k), float("-inf"))
        pool_scores[1, : k // 2 + 1] = torch.linspace(-1, -2, k // 2 + 1)  # part full (full when k = 1)
        pool_scores[2] = torch.linspace(-0.5, -3, k)  # full
        pool_ref = torch.randint(0, 100, (B, k), generator=g)
        max_len = torch.tensor([10, 10, 10, t + 1, 10])  # sentence 3 reaches its cap now
        args = (logits, run_scores, pool_scores, pool_ref, max_len, t, (0,), eos, 0.8)
        with torch.inference_mode():
            fast, fast_done, fast_in_place = loader.select(*args)
            slow, slow_done, slow_in_place = select(*args)
        assert (fast_done, fast_in_place) == (slow_done, slow_in_place) and fast_done  # sentences 2 and 3
        assert fast.done.tolist() == slow.done.tolist() and fast.done[2] and fast.done[3]
        for name in ("cand_scores", "run_scores", "pool_scores"):
            torch.testing.assert_close(getattr(fast, name), getattr(slow, name), atol=2e-6, rtol=1e-6)
        for name in ("cand_row", "cand_tok"):
            assert torch.equal(getattr(fast, name), getattr(slow, name)), name
        live = slow.run_scores > -1e8  # beams that continue for real (ended ones tie at -1e9)
        for name in ("keep", "parents"):
            assert torch.equal(getattr(fast, name)[live], getattr(slow, name)[live]), name
        assert torch.equal(fast.tokens[live.view(-1)], slow.tokens[live.view(-1)])
        found = torch.isfinite(slow.pool_scores)  # entries of an empty pool are never read
        assert torch.equal(fast.pool_ref[found], slow.pool_ref[found])


def kernel_model(dtype=torch.float32, attention_fn=attention, **overrides):
    """A tiny model whose heads (32 / 2 = 16) the kernels take."""
    options = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=2, d_ff=64, encoder_layers=2,
                   decoder_layers=2, dropout=0.0, decoder_start_id=1, pad_id=0, eos_id=2, bos_id=1)
    options.update(overrides)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**options), attention_fn).eval().to(dtype)


def test_cached_decoding_with_kernels_matches_full_recomputation(kernels, monkeypatch):
    calls = []
    real = loader.attention
    monkeypatch.setattr(loader, "attention", lambda *a: calls.append(a[0].shape) or real(*a))
    m = kernel_model(attention_fn=loader.decoder_attention)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 9), generator=g)
    src[1, 6:] = 0
    tgt = torch.randint(4, 40, (3, 7), generator=g)
    tgt[:, 0] = 1
    with torch.inference_mode():
        memory, mask = m.encode(src)
        full_logits, full_attn = m.decode(tgt, memory, mask, need_weights=True)
        assert not calls  # whole sequences (bool masks, many queries) stay on PyTorch ops
        cache = m.start_cache(memory, mask, group=1, capacity=tgt.size(1))
        for t in range(tgt.size(1)):
            logits, attn = m.decode_step(tgt[:, t], cache, need_weights=True)
            torch.testing.assert_close(logits, full_logits[:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(attn, full_attn[:, :, :, t], atol=1e-6, rtol=1e-5)
    assert len(calls) == 2 * 2 * tgt.size(1)  # self and encoder-decoder attention, 2 layers, each step


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_beam_search_is_the_same_with_and_without_kernels(kernels, dtype):
    """The search with the C++ attention and step against the PyTorch references, same weights."""
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, 40, (4, 10), generator=g)
    src[1, 4:] = 0
    src[3, 7:] = 0
    fast = beam_search(kernel_model(dtype, loader.decoder_attention, tgt_vocab_size=40), src, beam_size=3, n_best=3,
                       max_new_tokens=12, return_attention=True, select_fn=loader.select)
    slow = beam_search(kernel_model(dtype, tgt_vocab_size=40), src, beam_size=3, n_best=3, max_new_tokens=12,
                       return_attention=True)
    for a, b in zip(fast, slow):
        assert [h.token_ids for h in a] == [h.token_ids for h in b]
        for x, y in zip(a, b):
            assert x.score == pytest.approx(y.score, abs=1e-4 if dtype == torch.float32 else 2e-2)
            torch.testing.assert_close(x.attention, y.attention, atol=1e-5 if dtype == torch.float32 else 2e-2,
                                       rtol=1e-4)


@pytest.mark.parametrize("M, K, N", [(1, 1, 1), (3, 5, 17), (4, 64, 16), (7, 130, 33), (9, 256, 200), (130, 40, 70)])
def test_int8_products_equal_their_twin_on_every_path(kernels, M, K, N):
    """Each path this CPU runs (AVX-512 VNNI, AVX2, portable) against the PyTorch twin of its
    arithmetic; sizes off the tiles (rows of 4, blocks of 16 features, groups of 4 inputs)."""
    g = torch.Generator().manual_seed(M * K + N)
    linear = torch.nn.Linear(K, N)
    int8 = Int8Linear(linear, kernels)
    x = torch.randn(M, K, generator=g) * torch.rand(M, 1, generator=g) * 10
    x[-1] = 2.5  # a constant row: all its information is in its minimum
    assert "scalar" in kernels.int8_paths()
    for path in kernels.int8_paths():
        y = int8.product(x, path=path)
        twin = int8.twin(x, kernels.int8_levels(path))
        # the same up to float rounding, and now and then an activation rounded the other way at a tie
        assert (y - twin).abs().max() < 1e-4 * (1 + twin.abs().max())
        torch.testing.assert_close(y[-1], 2.5 * int8.qsum + int8.bias)  # exactly its minimum times W's row sums
        relu = int8.product(x, relu=True, path=path)
        assert torch.equal(relu, y.clamp_min(0))
        for i in range(M):  # a row's product is its own
            assert torch.equal(int8.product(x[i:i + 1], path=path), y[i:i + 1])


def test_int8_products_are_exact_where_byte_products_are_largest(kernels):
    """Every weight at +-127 and activations at the top of their range: on AVX2 a plain vpmaddubsw
    of a * q would saturate each pair at 32,767 (2 * 254 * 127 = 64,516); each path must still
    equal the twin, whose integer sums are exact."""
    linear = torch.nn.Linear(64, 32)
    with torch.no_grad():
        linear.weight.copy_(torch.where(torch.arange(32)[:, None] % 2 == 0, 1.0, -1.0).expand(32, 64))
        linear.bias.zero_()
    int8 = Int8Linear(linear, kernels)
    x = torch.ones(3, 64)
    x[:, 0] = 0.0  # the minimum; every other activation is at the top, a = levels
    x[1, 1::2] = 0.5  # pairs of unequal activations
    for path in kernels.int8_paths():
        twin = int8.twin(x, kernels.int8_levels(path))
        torch.testing.assert_close(twin[0], torch.where(torch.arange(32) % 2 == 0, 63.0, -63.0), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(int8.product(x, path=path), twin, rtol=1e-5, atol=1e-4)


def test_an_int8_linear_layer_on_the_kernels_equals_its_twin(kernels):
    torch.manual_seed(1)
    linear = torch.nn.Linear(40, 70)
    x = torch.randn(2, 6, 40) * 3
    module = loader.load()
    assert module is not None
    int8 = Int8Linear(linear, module)
    with torch.inference_mode():
        with_kernels = int8(x)
        # the twin at the levels of the path this CPU runs (AVX2: 254, centred on 127)
        twin = int8.twin(x.view(-1, 40), module.int8_levels(loader.int8_path())).view(2, 6, 70)
    torch.testing.assert_close(with_kernels, twin, rtol=1e-5, atol=1e-5)


def test_the_environment_picks_another_int8_path(kernels):
    import subprocess
    import sys

    show = "from model import kernels as loader; print(loader.int8_path())"
    for path in kernels.int8_paths():
        env = {**os.environ, "NMT_INT8_PATH": path}
        out = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == path
    env = {**os.environ, "NMT_INT8_PATH": "sse9"}
    out = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "int8 path sse9 does not run on this CPU; it runs " in out.stderr


def test_int8_levels_follow_the_path(kernels):
    # vpmaddubsw sums byte pairs into int16: 2 * 127 * 127 fits, 2 * 255 * 127 does not, so AVX2
    # multiplies a - 127 (a signed byte: levels 254), not a
    levels = {path: kernels.int8_levels(path) for path in kernels.int8_paths()}
    assert levels["scalar"] == 255 and levels.get("avx2", 254) == 254 and levels.get("avx512_vnni", 255) == 255
    assert kernels.int8_levels() == levels[kernels.int8_paths()[0]]
    with pytest.raises(RuntimeError, match="does not run"):
        kernels.int8_levels("sse9")


def test_a_failed_build_falls_back_to_pytorch(monkeypatch, caplog):
    def no_compiler(capability=None):
        raise RuntimeError("Error building extension: c++ not found\nmore detail")

    monkeypatch.setattr(loader, "_build", no_compiler)
    monkeypatch.setattr(loader, "_module", None)
    monkeypatch.setattr(loader, "_tried", False)
    with caplog.at_level(logging.WARNING, logger="model.kernels"):
        assert loader.load() is None
    assert "c++ not found" in caplog.text and "more detail" not in caplog.text
    assert not loader.available()
    with torch.inference_mode():
        assert not loader.handles_logits(torch.zeros(2, 40))


def test_environment_switch_turns_the_kernels_off(monkeypatch):
    monkeypatch.setenv("NMT_CPU_KERNELS", "0")
    monkeypatch.setattr(loader, "_module", None)
    monkeypatch.setattr(loader, "_tried", False)
    assert loader.load() is None


def test_a_read_only_cache_is_used_when_its_build_matches_the_source(kernels, monkeypatch, tmp_path):
    """A read-only container: torch's loader fails on its lock file, the build the image made is
    imported as it is, and a build of other source is not."""
    import shutil

    import torch.utils.cpp_extension as extension

    name = loader.build_spec(torch.backends.cpu.get_cpu_capability())[0]
    shutil.copytree(Path(kernels.__file__).parent, tmp_path / name, ignore=shutil.ignore_patterns("*.o", "lock"))

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system", str(tmp_path / name / "lock"))

    monkeypatch.setattr(extension, "_get_build_directory", lambda name, verbose: str(tmp_path / name))
    monkeypatch.setattr(extension, "load", read_only)
    imported = []
    monkeypatch.setattr(loader, "_import", lambda *args: imported.append(args) or kernels)
    assert loader._build() is kernels
    assert imported == [(name, tmp_path / name / f"{name}.so")]

    (tmp_path / name / f"{name}.stamp").write_text("built from other source")
    with pytest.raises(OSError, match="Read-only"):
        loader._build()


def test_a_checkout_elsewhere_shares_the_build_of_the_same_code(kernels, monkeypatch, tmp_path):
    """Two checkouts of the same code sharing one kernel cache: the second builds nothing (torch's
    loader would rebuild for sources at another path; they are built from the cache's copies)."""
    import shutil

    import torch.utils.cpp_extension as extension

    name = loader.build_spec(torch.backends.cpu.get_cpu_capability())[0]
    directory = Path(extension._get_build_directory(name, verbose=False))
    loader._build()  # this checkout's build (the fixture made it)
    library, ninja = directory / f"{name}.so", directory / "build.ninja"
    built, commands = library.stat().st_mtime_ns, ninja.read_text()
    other = tmp_path / "checkout" / "model" / "kernels"
    shutil.copytree(Path(loader.__file__).parent, other, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(loader, "_SOURCES", [other / path.name for path in loader._SOURCES])
    monkeypatch.setattr(loader, "_HEADER", other / loader._HEADER.name)
    assert loader._build().vector_size == kernels.vector_size
    assert library.stat().st_mtime_ns == built and ninja.read_text() == commands
    assert str(tmp_path) not in commands and str(directory / "src") in commands


def test_another_version_of_the_code_builds_in_a_directory_of_its_own(monkeypatch, tmp_path):
    """A checkout of other kernel source sharing the cache: its build directory is another one, so
    the two never rebuild each other's kernels (a worker would wait minutes on that build)."""
    import shutil

    capability = torch.backends.cpu.get_cpu_capability()
    name, flags, stamp = loader.build_spec(capability)
    other = tmp_path / "checkout" / "model" / "kernels"
    shutil.copytree(Path(loader.__file__).parent, other, ignore=shutil.ignore_patterns("__pycache__"))
    (other / "search.cpp").write_text((other / "search.cpp").read_text() + "\n// another version\n")
    monkeypatch.setattr(loader, "_SOURCES", [other / path.name for path in loader._SOURCES])
    monkeypatch.setattr(loader, "_HEADER", other / loader._HEADER.name)
    other_name, other_flags, other_stamp = loader.build_spec(capability)
    assert other_flags == flags and other_stamp != stamp
    assert other_name != name and loader.build_directory(other_name) != loader.build_directory(name)
    (other / "search.cpp").write_text((Path(loader.__file__).parent / "search.cpp").read_text())
    assert loader.build_spec(capability) == (name, flags, stamp)  # the same code: the same build


def test_a_read_only_cache_without_this_width_uses_a_narrower_build(monkeypatch):
    """An AVX-512 host running an image built on an AVX2 one, read-only: the AVX2 build."""
    narrower = object()

    def build(capability):
        if capability == "AVX512":
            raise OSError(30, "Read-only file system")
        return narrower

    monkeypatch.setattr(loader, "_runnable_widths", lambda: ["AVX512", "AVX2"])
    monkeypatch.setattr(loader, "_build", build)
    monkeypatch.setattr(loader, "_module", None)
    monkeypatch.setattr(loader, "_tried", False)
    assert loader.load() is narrower


def test_prebuild_leaves_a_stamped_build_for_each_width_this_cpu_runs(kernels):
    """What the image does at build time, so that a read-only container finds its kernels."""
    built = loader.prebuild()
    capability = torch.backends.cpu.get_cpu_capability()
    assert built == [capability] + (["AVX2"] if capability == "AVX512" else [])
    for each in built:
        name, _, stamp = loader.build_spec(each)
        assert name.endswith(stamp[:12])
        directory = loader.build_directory(name)
        assert (directory / f"{name}.so").is_file() and (directory / f"{name}.stamp").read_text() == stamp


@pytest.mark.parametrize("capability", ["AVX2", "DEFAULT"])
def test_the_other_vector_widths_compute_the_same(kernels, capability):
    """The AVX2 and portable builds (8-float vectors, no AVX-512 reduction tree), on this CPU."""
    if capability == "AVX2" and torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("this CPU has no AVX2")  # never on this project's x86 machines
    other = loader._build(capability)
    assert other.vector_size == 8
    g = torch.Generator().manual_seed(7)
    for Dh, Tk in [(8, 5), (32, 33), (128, 17)]:
        q = torch.randn(3, 2, 4, Dh, generator=g)
        k, v = torch.randn(2, 3, 2, Tk, Dh, generator=g).unbind(0)
        bias = torch.zeros(3, 1, 1, Tk)
        bias[2, ..., Tk // 2:] = float("-inf")
        out, weights = other.attention(q, k, v, bias.view(3, Tk), True)
        expected, expected_weights = reference_attention(q, k, v, bias)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    qkv, starts = torch.randn(30, 3 * 2 * 32, generator=g), torch.tensor([0, 13, 14, 30])
    torch.testing.assert_close(other.packed_self_attention(qkv, starts, 2), loader.packed_self_attention(qkv, starts, 2),
                               atol=1e-5, rtol=1e-5)
    logits = torch.randn(5, 1003, generator=g) * 4
    values, columns = other.row_top(logits, 8, [0])
    expected_values, expected_columns = loader.row_top(logits, 8, (0,))
    torch.testing.assert_close(values, expected_values, atol=2e-6, rtol=1e-6)
    assert torch.equal(columns, expected_columns)
    # int8 products pick their path at run time, whatever the build's vector width
    int8, x = Int8Linear(torch.nn.Linear(70, 40)), torch.randn(6, 70, generator=g)
    assert other.int8_paths() == kernels.int8_paths()
    for path in kernels.int8_paths():
        assert torch.equal(other.int8_linear(x, int8.q, int8.scale, int8.qsum, int8.bias, False, path),
                           kernels.int8_linear(x, int8.q, int8.scale, int8.qsum, int8.bias, False, path))


# --- an int8 model's encoder and decoder step (fused.cpp) against Transformer.encode / decode_step --------
# the same arithmetic, so the same results bit for bit (an activation that came out a last bit apart
# could round to another int8 level)


def packed_attention(q, k, v, mask, need_weights, dropout, rows=None):
    """transformer.attention for an encoder's self-attention (mask (B, 1, 1, S), True at tokens)
    through the fused encoder's kernel, kernels.packed_self_attention: the tokens packed, each
    attending within its sentence; 0 at padded queries. q, k, v: (B, H, S, Dh)."""
    assert rows is None and not need_weights and dropout == 0.0
    B, H, S, Dh = q.shape
    tokens = mask.reshape(B, S)
    qkv = torch.cat([x.transpose(1, 2).reshape(B, S, H * Dh) for x in (q, k, v)], -1)[tokens]  # (T, 3 * D)
    starts = torch.nn.functional.pad(tokens.sum(1).cumsum(0), (1, 0))  # (B + 1,)
    out = q.new_zeros(B, S, H * Dh)
    out[tokens] = loader.packed_self_attention(qkv.contiguous(), starts, H)
    return out.view(B, S, H, Dh).transpose(1, 2), None


@pytest.mark.parametrize("Dh", [8, 16, 32, 64, 128])
def test_packed_self_attention_equals_masked_attention(kernels, Dh):
    """Each token attends to its own sentence, as a padding mask makes SDPA do over the padded batch,
    whatever the lengths (1, 0, longer than a vector block) and wherever the padding is."""
    if Dh % kernels.vector_size:
        pytest.skip(f"head size {Dh} is not whole vectors of {kernels.vector_size}")
    g = torch.Generator().manual_seed(Dh)
    B, H, S = 5, 3, 37
    q, k, v = (2 * torch.randn(B, H, S, Dh, generator=g) for _ in range(3))
    mask = torch.zeros(B, 1, 1, S, dtype=torch.bool)
    for b, n in enumerate([37, 1, 0, 20, 9]):
        mask[b, ..., :n] = True
    mask[4] = torch.rand(S, generator=g) < 0.5  # padding between tokens, not only after them
    out, _ = packed_attention(q, k, v, mask, False, 0.0)
    expected, _ = attention(q.double(), k.double(), v.double(), mask, False, 0.0)
    queries = mask.reshape(B, 1, S, 1).expand(B, H, S, Dh)
    torch.testing.assert_close(out[queries], expected[queries].float(), atol=1e-5, rtol=1e-5)
    assert not out[~queries].any()
    with pytest.raises(RuntimeError, match="starts"):
        loader.packed_self_attention(torch.zeros(4, 3 * H * Dh), torch.tensor([0, 3]), H)


def int8_pair(norm="pre", activation="relu", seed=0, **overrides):
    """An int8 model with the PyTorch encoder and step, and the same modules with the fused ones.
    The PyTorch encoder attends through the fused encoder's kernel (packed_attention), so that the
    two agree bit for bit; against its own SDPA they agree up to float32 rounding."""
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
    for layer in model.encoder_layers:
        layer.self_attn.attention_fn = packed_attention
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
        tokens = mask.view(B, S)  # the fused encoder skips the padding: memory there is 0, masked wherever it is read
        assert torch.equal(memory[tokens], expected[tokens])
        assert not memory[~tokens].any()
        for layer in model.encoder_layers:  # the PyTorch encoder as it is, attending through SDPA
            layer.self_attn.attention_fn = attention
        with torch.inference_mode():
            sdpa, _ = model.encode(src)
        for layer in model.encoder_layers:
            layer.self_attn.attention_fn = packed_attention
        # float32 rounding apart, now and then moved across an int8 level by a later layer: one such
        # move in a token moves every row of its sentence a little (the next layer attends over them
        # all; on an AVX-512 Zen 5, 40 rows of a 40-token sentence, the median value by 3e-4, none
        # by more than 1.1e-2), where a wrong mask moves rows by tenths and a 1% wrong scale
        # moves the median value by ~7e-3
        difference = (memory[tokens] - sdpa[tokens]).abs()
        assert difference.median() < 1e-3 and difference.max() < 0.05
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


def test_shortlisted_steps_and_searches_agree_fused_and_pytorch():
    """With a vocabulary shortlist, the fused step's logits are the PyTorch step's, and are the
    whole vocabulary's logits at the shortlist's columns; beam search writes only its ids."""
    model, fused = int8_pair("pre", "relu", seed=4)
    columns = torch.tensor([3, 5, 8, 13, 21, 34, 40, 41, 42, 55])  # EOS (3) among them
    short_model, short_fused = model.shortlisted(columns), fused.shortlisted(columns)
    assert model.columns is None and fused.columns is None  # the views are new objects
    g = torch.Generator().manual_seed(5)
    src = torch.randint(4, 50, (3, 8), generator=g)
    with torch.inference_mode():
        memory, mask = model.encode(src)
        caches = [m.start_cache(memory, mask, group=2, capacity=6) for m in (model, short_model, short_fused)]
        tokens = torch.full((6,), model.config.decoder_start_id)
        (full, _), (expected, _), (logits, _) = (m.decode_step(tokens, c) for m, c in
                                                 zip((model, short_model, short_fused), caches))
    assert logits.shape == (6, 10) and torch.equal(logits, expected)
    assert torch.equal(logits, full[:, columns])
    caps = torch.tensor([6, 4, 6])
    expected = beam_search(short_model, src, beam_size=3, n_best=3, max_new_tokens=caps)
    found = beam_search(short_fused, src, beam_size=3, n_best=3, max_new_tokens=caps)
    for a, b in zip(expected, found):
        assert [h.token_ids for h in a] == [h.token_ids for h in b] and [h.score for h in a] == [h.score for h in b]
        assert all(set(h.token_ids) <= set(columns.tolist()) for h in b)


def test_fused_step_reads_rows_at_their_own_positions_as_the_pytorch_step():
    """A running batch's cache (a sentence joining at a later step, each row at its own position,
    the encoder-decoder keys/values in a pool): the fused step's logits and attention are the PyTorch step's,
    and a running batch over either finds the same hypotheses, scores and attention."""
    from model.running import EagerRunningBatch
    from tests.test_running import ARRIVALS, decode_arriving

    model, fused = int8_pair("pre", "relu", seed=6)
    g = torch.Generator().manual_seed(7)
    with torch.inference_mode():
        caches = []
        for m in (model, fused):
            memory, mask = m.encode(torch.randint(4, 50, (2, 7), generator=g if not caches else g.manual_seed(7)))
            cache = m.start_cache(memory, mask, group=2, capacity=1)
            cache.at_own_positions()
            cache.resize(8, 10)
            caches.append(cache)
        tokens = torch.tensor([1, 1, 1, 1])
        for t in range(6):
            if t == 2:  # a third source joins at step 2, its rows at position 0
                for m, cache in zip((model, fused), caches):
                    memory, mask = m.encode(torch.tensor([[5, 9, 11, 2]]))
                    cache.join(m.start_cache(memory, mask, group=2, capacity=1), torch.tensor([4, 5]))
                tokens = torch.cat([tokens, torch.tensor([1, 1])])
            (expected, expected_w), (logits, weights) = (m.decode_step(tokens, c, True) for m, c in zip((model, fused), caches))
            assert torch.equal(logits, expected) and torch.equal(weights, expected_w)
            tokens = expected.argmax(-1)
        assert caches[1].position.tolist() == [6, 6, 6, 6, 4, 4] and caches[1].length == 6
        caches[1].position[0] = 10  # past the buffer
        with pytest.raises(ValueError, match="full"):
            fused.decode_step(tokens, caches[1])
        with pytest.raises(RuntimeError, match="position 10 outside"):
            fused.decoder_step.forward(tokens, 0, caches[1].self_kv, caches[1].slot, caches[1].table,
                                       [t for kv in caches[1].cross_kv for t in kv], caches[1].src_bias.view(3, -1),
                                       2, False, None, caches[1].position, caches[1].entry)

    results = [decode_arriving(EagerRunningBatch(m, slots=4, beam_size=3, attention=True))[0] for m in (model, fused)]
    for key, *_ in ARRIVALS:
        expected, found = results[0][key], results[1][key]
        assert [h.token_ids for h in found] == [h.token_ids for h in expected]
        assert [h.score for h in found] == [h.score for h in expected]
        assert all(torch.equal(a.attention, b.attention) for a, b in zip(found, expected))


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
    fused = translator.translate(texts, beam_size=3, n_best=2, attention=True)
    # the same int8 model and search step, with the PyTorch encoder (attending through the fused
    # encoder's kernel) and decoder step
    for layer in translator.model.encoder_layers:
        layer.self_attn.attention_fn = packed_attention
    pytorch = Translator(translator.model, translator.tokenizer, select_fn=translator.select_fn)
    reference = pytorch.translate(texts, beam_size=3, n_best=2, attention=True)
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


def test_operations_never_start_a_build(monkeypatch):
    """Before load() has run, the operations take the PyTorch references: no g++ inside a decoder step."""
    builds = []
    monkeypatch.setattr(loader, "_build", lambda capability=None: builds.append(capability))
    monkeypatch.setattr(loader, "_module", None)
    monkeypatch.setattr(loader, "_tried", False)
    q = torch.randn(2, 2, 1, 16)
    with torch.inference_mode():
        out, _ = loader.decoder_attention(q, q, q, None, False, 0.0)
        expected, _ = attention(q, q, q, None, False, 0.0)
        assert not loader.handles_logits(torch.zeros(2, 40))
    assert torch.equal(out, expected) and builds == []
