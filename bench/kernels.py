"""The CPU levers of a decoder step, one op at a time: ours (C++ kernels, prepacked weights)
against the PyTorch ops they replace, at the shapes of a beam 4 x 32 step of the shipped model
(128 decoder rows, 8 heads of 32, 30 cached positions, 25 source positions, 8k vocabulary).

    .venv/bin/python bench/kernels.py [--dtype bfloat16|float32|int8] [--rows 128] [--threads 1]

With --dtype int8: our int8 products (model/kernels/int8.cpp) against fbgemm's dynamic int8
(PyTorch's dynamic quantization, what Int8Linear ran before) and float32 F.linear; the encoder and
a whole decoder step of a random model of the shipped shape, fused (model/kernels/fused.cpp) against
PyTorch over the same int8 layers; and the search step after it (model/kernels/search.cpp) against
its PyTorch twin.

Prints microseconds per call (median of 7 runs of 200 calls) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model import kernels  # noqa: E402
from model.cpu.weights import PrepackedLinear, can_prepack_bf16  # noqa: E402
from model.search import rows_top  # noqa: E402


def per_call_us(fn, calls: int = 200, runs: int = 7) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "int8"])
    ap.add_argument("--rows", type=int, default=128, help="decoder rows (sentences x beams)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if kernels.load() is None:
        sys.exit("the CPU kernels did not build (see the warning above)")
    dt = torch.float32 if args.dtype == "int8" else getattr(torch, args.dtype)
    N, H, Dh, T, S, V, beams = args.rows, 8, 32, 30, 25, 8000, 4
    g = torch.Generator().manual_seed(0)
    rows = []

    def row(name, ours, theirs, what):
        with torch.inference_mode():
            a, b = per_call_us(ours), per_call_us(theirs)
        rows.append((name, what, a, b))

    # self-attention over the cache: (slots, capacity, layers, 2, H, Dh), read as strided views
    cache = torch.randn(N, 64, 2, 2, H, Dh, generator=g).to(dt)
    k, v = cache[:, :T, 0].transpose(1, 3).unbind(2)
    q = torch.randn(N, H, 1, Dh, generator=g).to(dt)
    table = torch.arange(N)[:, None].expand(N, T).contiguous()
    row("self-attention", lambda: kernels.attention(q, k, v, None, False, table),
        lambda: F.scaled_dot_product_attention(q, k, v), f"({N}, {H}, 1, {Dh}) over {T} cached positions; SDPA")
    # encoder-decoder attention: the beams of a sentence as queries of its source
    qc = torch.randn(N // beams, H, beams, Dh, generator=g).to(dt)
    kc, vc = torch.randn(2, N // beams, S, H, Dh, generator=g).to(dt).transpose(2, 3).unbind(0)
    bias = torch.zeros(N // beams, 1, 1, S, dtype=dt)
    row("encoder-decoder attention", lambda: kernels.attention(qc, kc, vc, bias, False),
        lambda: F.scaled_dot_product_attention(qc, kc, vc, attn_mask=bias),
        f"({N // beams}, {H}, {beams}, {Dh}) over {S} source positions; SDPA")
    # candidates: the 2k best log-probs of each row
    logits = (torch.randn(N, V, generator=g) * 3).to(dt)
    row("candidate selection", lambda: kernels.row_top(logits, 2 * beams, (0,)),
        lambda: rows_top(logits, 2 * beams, (0,)), f"({N}, {V}) logits, top {2 * beams}; log_softmax + top-k")
    if dt == torch.bfloat16 and can_prepack_bf16(torch.nn.Linear(1, 1).bfloat16()):
        for d_in, d_out in [(256, 768), (1024, 256), (256, V)]:
            linear = torch.nn.Linear(d_in, d_out).bfloat16()
            packed = PrepackedLinear(linear)
            x = torch.randn(N, d_in, generator=g).to(dt)
            row(f"Linear {d_in} -> {d_out}", lambda packed=packed, x=x: packed(x), lambda linear=linear, x=x: linear(x),
                "prepacked oneDNN weight; F.linear")
        ffn = torch.nn.Linear(256, 1024).bfloat16()
        fused = PrepackedLinear(ffn, "relu")
        x = torch.randn(N, 256, generator=g).to(dt)
        packed = PrepackedLinear(ffn)
        row("Linear 256 -> 1024 + ReLU", lambda: fused(x), lambda: F.relu(packed(x)), "ReLU fused; prepacked, then ReLU")

    if args.dtype == "int8":
        int8_rows(row, N, T, S, V, beams, g)

    print(f"{args.dtype}, {N} decoder rows, {args.threads} thread(s); microseconds per call, median of 7 x 200")
    print("| op | shape; what ours replaces | ours us | PyTorch us | PyTorch / ours |")
    print("|---|---|---:|---:|---:|")
    for name, what, ours, theirs in rows:
        print(f"| {name} | {what} | {ours:,.0f} | {theirs:,.0f} | {theirs / ours:.2f} |")


def int8_rows(row, N: int, T: int, S: int, V: int, beams: int, g: torch.Generator) -> None:
    import warnings

    from model.config import ModelConfig
    from model.cpu.fused import fuse
    from model.cpu.weights import Int8Linear, quantize_linear_int8
    from model.search import select
    from model.transformer import Transformer

    for d_in, d_out in [(256, 768), (1024, 256), (256, V)]:
        linear = torch.nn.Linear(d_in, d_out)
        ours = Int8Linear(linear, kernels.load())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao's deprecation notice
            fbgemm = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                            dtype=torch.qint8)
        x = torch.randn(N, d_in, generator=g)
        row(f"int8 Linear {d_in} -> {d_out}", lambda ours=ours, x=x: ours(x), lambda fbgemm=fbgemm, x=x: fbgemm(x),
            "fbgemm dynamic int8 (one scale a batch)")
        row(f"int8 Linear {d_in} -> {d_out}", lambda ours=ours, x=x: ours(x), lambda linear=linear, x=x: linear(x),
            "float32 F.linear")
    # the shipped model's shape, random weights: pre-norm, d 256, 8 heads, FFN 1024, 2 decoder layers
    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=256, n_heads=8, d_ff=1024, encoder_layers=6,
                         decoder_layers=2, norm="pre", share_embeddings=True)
    # as Translator.load builds it: the decoder's attention through the kernel
    model = quantize_linear_int8(Transformer(config, kernels.decoder_attention).eval())
    fused = fuse(model)  # the same modules; only its encode and decode_step differ
    src = torch.randint(4, V, (N // beams, S), generator=g)
    with torch.inference_mode():
        memory, mask = model.encode(src)
        row("encoder", lambda: fused.encode(src), lambda: model.encode(src),
            f"int8, 6 layers, {N // beams} x {S} tokens; the PyTorch encoder, same layers")
    tokens = torch.randint(4, V, (N,), generator=g)

    def step(m):
        cache = m.start_cache(memory, mask, group=beams, capacity=T + 1)
        cache.table[:, :T] = torch.arange(N)[:, None]
        cache.length = T  # a step at position T, over T cached positions
        return lambda: (setattr(cache, "length", T), m.decode_step(tokens, cache))

    with torch.inference_mode():
        row("decoder step", step(fused), step(model), f"int8, {T} cached positions; the PyTorch step, same layers")
    logits = torch.randn(N, V, generator=g) * 3
    state = (torch.randn(N // beams, beams, generator=g), torch.full((N // beams, beams), float("-inf")),
             torch.zeros(N // beams, beams, dtype=torch.long), torch.full((N // beams,), 100), 5, (0,), 2, 1.0)
    row("search step", lambda: kernels.select(logits, *state), lambda: select(logits, *state),
        f"beam {beams}: candidates, pool, beams kept; PyTorch ops")


if __name__ == "__main__":
    main()
