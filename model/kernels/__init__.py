"""C++ kernels for decoding on the CPU (model/kernels/*.cpp, one extension module), with PyTorch twins.

- kernels.cpp: attention with a few queries per head (a decoder step's self-attention over its
  cache, and encoder-decoder attention with the beams as queries), an encoder's self-attention
  over packed sentences (no work for padding), and choosing candidates (the
  best log-probabilities of each row without writing out log_softmax): PyTorch's CPU ops run
  both far below memory speed at decoding shapes (numbers: `bench/kernels.py`, BENCHMARKS.md).
- int8.cpp: int8 matrix products with activations quantized row by row (Int8Linear,
  model/cpu/weights.py): AVX-512 VNNI, AVX2 or portable, chosen at run time.
- search.cpp: beam search's step after the decoder (model/search.py, select).
- fused.cpp: an int8 model's encoder and decoder step as one call each (model/cpu/fused.py).

They are compiled when the project is set up (scripts/setup.sh, the image's build: `prebuild()`),
else on first use, with torch's C++ extension loader (needs g++ and ninja) for the vector
instructions torch itself uses on this CPU. Builds live under TORCH_EXTENSIONS_DIR
(~/.cache/torch_extensions by default), one directory per version of the code (its name carries
a hash of the sources, flags and torch version: `build_spec`), built from copies of the sources
kept there; checkouts of one version share a build, other versions never rebuild it, and
processes starting together wait for one build (an flock) instead of racing. A read-only cache (a read-only container
whose image built them) is used as it is when its build matches this source. Where they
cannot be built, or with NMT_CPU_KERNELS=0, `available()` is False and callers use PyTorch ops; tests compare both.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import threading
from pathlib import Path

import torch
from torch import Tensor

from model import search, transformer  # the PyTorch references these kernels must match

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
# one extension module; the header is not a source torch's loader tracks, so its hash goes in a flag
_SOURCES = [_HERE / name for name in ("kernels.cpp", "int8.cpp", "search.cpp", "fused.cpp")]
_HEADER = _HERE / "kernels.h"
# what torch.backends.cpu.get_cpu_capability() says -> the flags torch builds that level with
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
}
_lock = threading.Lock()
_module = None
_tried = False


@contextlib.contextmanager
def build_lock(directory: Path):
    """Hold the build of `directory` against other processes while it runs.

    torch's loader marks a build with a lock file and waits for that file to go, forever; a build
    that was killed (a worker past its start timeout, a test run torn down) leaves it behind and
    every later build hangs. Builds of ours take an flock first, which the kernel releases when
    its holder dies: whoever holds it is the only builder alive, so a lock file found then is a
    dead one and goes."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "nmt-build.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # waits while another process builds; never on a dead one
        stale = directory / "lock"
        if stale.exists():
            log.warning("removing %s: left by a build that was killed", stale)
            stale.unlink(missing_ok=True)
        yield


def stage_sources(directory: Path) -> list[Path]:
    """Copies of the sources in the build directory (directory/src), rewritten only when their
    content changed; returns the copies of the .cpp files.

    torch's loader writes the sources' paths into the build's ninja file, and ninja rebuilds when
    a command line changes. Built from the checkout itself, two checkouts sharing one cache
    (~/.cache/torch_extensions) would rebuild each other's kernels in turn, and a worker starting
    meanwhile waits minutes on that build. From these copies the command lines are the same
    whichever checkout builds, so only a change of the code itself rebuilds."""
    staged = directory / "src"
    staged.mkdir(parents=True, exist_ok=True)
    for path in (*_SOURCES, _HEADER):
        copy, content = staged / path.name, path.read_bytes()
        if not copy.is_file() or copy.read_bytes() != content:  # an unchanged copy keeps its time stamp
            copy.write_bytes(content)
    return [staged / path.name for path in _SOURCES]


def build_spec(capability: str) -> tuple[str, list[str], str]:
    """(module name, compiler flags, stamp) of the kernels for `capability`. The stamp hashes the
    sources, the flags and torch's version, and the name carries it: each version of the code has
    its own build directory, so checkouts of different versions sharing one cache never rebuild
    each other's kernels, and those of the same version share one build."""
    flags = ["-O3", f"-DNMT_HEADER={hashlib.sha256(_HEADER.read_bytes()).hexdigest()[:16]}"]
    if capability in _CAPABILITY_FLAGS:  # else ATen's portable (scalar) vector code
        flags += [f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}", *_CAPABILITY_FLAGS[capability]]
    built = b"".join(path.read_bytes() for path in (*_SOURCES, _HEADER))
    stamp = hashlib.sha256(built + repr((flags, torch.__version__)).encode()).hexdigest()
    return f"nmt_cpu_kernels_{capability.lower()}_{stamp[:12]}", flags, stamp


def build_directory(name: str) -> Path:
    """Where torch's loader builds extension `name` (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def _build(capability: str | None = None):
    """Compile (or load from the cache) the kernels for this CPU's vector instructions, or for
    `capability` ("AVX512", "AVX2", "DEFAULT": the portable code, as tests use it)."""
    from torch.utils.cpp_extension import load as build_extension

    name, flags, stamp = build_spec(capability or torch.backends.cpu.get_cpu_capability())
    directory = build_directory(name)
    # torch's loader checks what the library was built from itself, but only with a writable
    # cache; the stamp lets a read-only one (a read-only container) use its build
    library, stamp_file = directory / f"{name}.so", directory / f"{name}.stamp"
    built_from = stamp_file.read_text() if stamp_file.is_file() else None
    if built_from != stamp or not library.is_file():
        log.warning("compiling the CPU kernels (%s, about a minute on 2 cores, once per version of their source; "
                    "scripts/setup.sh does it when the project is installed)", name)
    try:
        with build_lock(directory):
            sources = stage_sources(directory)
            module = build_extension(name=name, sources=[str(path) for path in sources], extra_cflags=flags)
    except OSError:  # the cache is read-only: no lock to take, and torch's loader rewrites build.ninja
        if built_from == stamp:
            return _import(name, library)
        raise
    if module.__file__ == str(library) and built_from != stamp:
        stamp_file.write_text(stamp)
    return module


def _import(name: str, library: Path):
    """Import a compiled extension module from its file."""
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load():
    """The compiled module, built (or loaded from the cache) on the first call; None where
    it cannot be, or when NMT_CPU_KERNELS=0."""
    global _module, _tried
    if _tried:  # called several times a decoder step: no lock, no environment lookup
        return _module
    with _lock:
        if not _tried:
            if os.environ.get("NMT_CPU_KERNELS", "1") == "0":
                log.info("CPU kernels off (NMT_CPU_KERNELS=0), using PyTorch ops")
            else:
                widths = _runnable_widths()
                for capability in widths:
                    try:
                        _module = _build(capability)
                        break
                    except Exception as error:  # no compiler, no ninja, read-only cache: run on PyTorch ops
                        if isinstance(error, OSError) and capability != widths[-1]:
                            continue  # a read-only cache without this width's build: a narrower one may be there
                        log.warning("CPU kernels unavailable, using PyTorch ops: %s", str(error).splitlines()[0])
                        break
            _tried = True
    return _module


def _runnable_widths() -> list[str]:
    """This CPU's vector width (torch's name for it), then the narrower ones it can also run."""
    capability = torch.backends.cpu.get_cpu_capability()
    return [capability] + (["AVX2"] if capability == "AVX512" else [])


def prebuild() -> list[str]:
    """Build the kernels for this CPU and for the narrower vector widths it can also run (an
    AVX-512 CPU: AVX2 too), so that an image built here finds a build for either kind of CPU
    when its cache is read-only. Returns the capabilities built."""
    built = _runnable_widths()
    for each in built:
        _build(each)
    return built


def available() -> bool:
    return load() is not None


def loaded():
    """The compiled module if load() has built or found it, else None. What the operations below
    use: they never start a build (Translator.load, quantize_linear_int8 and fuse call load())."""
    return _module


def int8_path() -> str | None:
    """The int8 product path in use ("avx512_vnni", "avx2" or "scalar"; model/kernels/int8.cpp): the
    fastest this CPU runs, or the one the environment variable NMT_INT8_PATH names; None without
    the kernels (Int8Linear then runs its PyTorch twin)."""
    module = load()
    return module.int8_path() if module is not None else None


_STORAGE = (torch.float32, torch.bfloat16, torch.float16)


def handles_attention(q: Tensor, k: Tensor, mask: Tensor | None) -> bool:
    """Whether `attention` takes this call: inference on the CPU, kernels built, few queries per
    head (a decoder step's), head size 1, 2, 4, 8 or 16 vector registers, contiguous within a head,
    and no mask or a float bias over keys only (B, 1, 1, Tk)."""
    module = loaded()
    if module is None or q.device.type != "cpu" or torch.is_grad_enabled() or q.size(-2) > 16:
        return False
    if mask is not None and not (mask.is_floating_point() and mask.size(1) == 1 and mask.size(2) == 1):
        return False
    Dh = q.size(-1)
    return (q.dtype in _STORAGE and q.stride(-1) == 1 and k.stride(-1) == 1 and Dh % module.vector_size == 0
            and Dh // module.vector_size in (1, 2, 4, 8, 16))


def handles_logits(logits: Tensor) -> bool:
    """Whether `row_top` takes these (N, V) logits: CPU, rows contiguous, kernels built."""
    return (logits.device.type == "cpu" and logits.dtype in _STORAGE and logits.stride(-1) == 1
            and not torch.is_grad_enabled() and loaded() is not None)


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, need_weights: bool, rows: Tensor | None = None):
    """softmax(q k^T / sqrt(Dh) + bias) v. q: (B, H, Tq, Dh); k, v: (B, H, Tk, Dh), any strides
    with Dh contiguous; bias: (B, 1, 1, Tk) additive or None. With rows (B, Tk), k and v hold
    slots instead, (slots, H, Tk, Dh), and key j of entry b is k[rows[b, j], :, j]. Returns
    (B, H, Tq, Dh) in q's dtype and, if asked, the weights (B, H, Tq, Tk) in float32."""
    B, Tk = q.size(0), k.size(2)
    flat_bias = None if bias is None else bias.reshape(bias.size(0), Tk).expand(B, Tk)
    out, weights = loaded().attention(q, k, v, flat_bias, need_weights, rows)
    return out, (weights if need_weights else None)


def packed_self_attention(qkv: Tensor, starts: Tensor, n_heads: int) -> Tensor:
    """An encoder's self-attention over packed sentences: qkv (T, 3 * D) float32, each row a
    token's q, k and v (MultiHeadAttention.qkv_proj's output), sentence b in rows starts[b] ..
    starts[b + 1] (B + 1,) int64; each token attends to its own sentence's tokens only (what a
    padding mask does, without computing the padding). Returns (T, D), heads side by side."""
    return loaded().packed_self_attention(qkv, starts, n_heads)


def row_top(logits: Tensor, m: int, banned: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(N, V) logits -> the m best log_softmax values of each row (float32, best first) and
    their columns; `banned` columns are never chosen but count in the normalisation."""
    values, indices = loaded().row_top(logits, m, list(banned))
    return values, indices


# --- the operations decoding takes, with their references' contracts ----------------------------------

def decoder_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool, dropout: float,
                      rows: Tensor | None = None):
    """transformer.attention, with the C++ kernel taking the calls it handles (a decoder step on the
    CPU: a few queries per head, a bias over keys or none); the reference takes the rest. A model
    built with it (Transformer(config, decoder_attention)) attends like the reference."""
    if dropout == 0.0 and handles_attention(q, k, mask):
        return attention(q, k, v, mask, need_weights, rows)
    return transformer.attention(q, k, v, mask, need_weights, dropout, rows)


def select(logits: Tensor, run_scores: Tensor, pool_scores: Tensor, pool_ref: Tensor, max_len: Tensor, t: int,
           banned: tuple[int, ...], eos_id: int, length_penalty: float, steps: Tensor | None = None
           ) -> tuple[search.Selection, bool, bool]:
    """search.select (beam search's step after the decoder) in one C++ call (search.cpp) for logits
    on the CPU; the reference for the rest."""
    if handles_logits(logits):
        out, any_done, in_place = loaded().beam_step(
            logits, run_scores, pool_scores, pool_ref, max_len, t, list(banned), eos_id, length_penalty, steps)
        return search.Selection(*out), any_done, in_place
    return search.select(logits, run_scores, pool_scores, pool_ref, max_len, t, banned, eos_id, length_penalty, steps)
