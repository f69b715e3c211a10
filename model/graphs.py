"""A decoder step a CUDA graph can replay: fixed shapes, fixed addresses, no host in the loop.

A decoder step of a small Transformer launches ~15 kernels a layer plus the output projection;
on a GPU, launching them costs more than running them (bench/gpu.py --profile, before this
module: 319 ms of CPU for 58 ms of GPU over 30 steps at batch 128). A CUDA graph records one
step's kernels once and replays them with a single launch. That needs a step whose every shape
and buffer address is the same each time:

- the self-attention keys/values of every layer live in one buffer allocated for the search,
  `[layers, 2, rows, heads, capacity, Dh]`, written in place at each row's position, which is a
  tensor the step itself advances (never a Python int);
- every step attends over the whole capacity, the positions after a row's own masked out;
- encoder-decoder keys/values are computed once per sentence, and a sentence's beams attend to
  its one copy as queries of one batch entry (as `Transformer.decode_step` does);
- the batch is padded up to its bucket (a power of two of sentences; source length and capacity
  rounded up to a few sizes) and never shrinks: when sentences finish, the rows kept move to the
  front by an in-place gather and the rest of the bucket runs on, unread; beams reorder by the
  same gather of the rows' filled positions.

`GraphedDecoder` is beam search's IncrementalDecoder (model/search.py) over a `Transformer`, so
the search is the same code with either. On a CPU (`capture=False`) it runs the same step
eagerly: the twin the tests compare token for token with the Transformer's own step.

Shapes: L decoder layers, H heads, Dh head size, Bb sentences of the bucket, g rows per sentence
(beams), Nb = Bb * g rows, Sb source positions, Tb target positions, V vocabulary.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from model.config import ModelConfig
from model.transformer import Transformer, attention

log = logging.getLogger(__name__)

# lengths (source positions, target capacity) are rounded up to one of these, or to a multiple of
# the largest; multiples of 16 keep the fused attention kernels' masks aligned
_LENGTHS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# free buffer sets (each with its graphs) kept for reuse, least recently used dropped first
_KEEP_BUFFERS = 12


def round_up_length(n: int) -> int:
    return next((b for b in _LENGTHS if b >= n), -(-n // _LENGTHS[-1]) * _LENGTHS[-1])


def round_up_sentences(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class Bucket:
    sentences: int  # Bb
    group: int  # g
    source_len: int  # Sb
    capacity: int  # Tb


class StepBuffers:
    """Everything one decoder step reads and writes, for one bucket, and the graphs recorded over
    these addresses (one with attention weights, one without)."""

    def __init__(self, config: ModelConfig, bucket: Bucket, dtype: torch.dtype, device: torch.device):
        self.bucket = bucket
        L, H, Dh = config.decoder_layers, config.n_heads, config.d_model // config.n_heads
        Bb, g, Sb, Tb = bucket.sentences, bucket.group, bucket.source_len, bucket.capacity
        self.tokens = torch.full((Bb * g,), config.decoder_start_id, dtype=torch.long, device=device)  # (Nb,)
        self.position = torch.zeros(Bb * g, dtype=torch.long, device=device)  # (Nb,) each row's next position
        self.self_kv = torch.zeros(L, 2, Bb * g, H, Tb, Dh, dtype=dtype, device=device)
        self.cross_kv = torch.zeros(L, 2, Bb, H, Sb, Dh, dtype=dtype, device=device)
        self.src_bias = torch.zeros(Bb, 1, 1, Sb, dtype=dtype, device=device)  # 0 or -inf (padding)
        self.graphs: dict[bool, tuple[torch.cuda.CUDAGraph, tuple[Tensor, Tensor | None]]] = {}
        self.eager = False  # capture failed once: run this bucket's steps eagerly

    @property
    def rows(self) -> int:
        return self.tokens.size(0)

    def fill(self, model: Transformer, memory: Tensor, src_mask: Tensor) -> None:
        """A new search: the encoder's keys/values per layer, the padding bias, positions at 0.
        memory: (B, S, D); src_mask: (B, 1, 1, S)."""
        B, S = src_mask.size(0), src_mask.size(-1)
        for i, layer in enumerate(model.decoder_layers):
            k, v = layer.cross_attn.memory_kv(memory)  # 2 x (B, H, S, Dh)
            self.cross_kv[i, 0, :B, :, :S] = k
            self.cross_kv[i, 1, :B, :, :S] = v
        self.src_bias.zero_()  # the bucket's spare sentences attend to zeros: finite, never read
        self.src_bias[:B, :, :, :S].masked_fill_(~src_mask, float("-inf"))
        self.src_bias[:B, :, :, S:] = float("-inf")
        self.position.zero_()

    def run(self, model: Transformer, need_weights: bool, capture: bool) -> tuple[Tensor, Tensor | None]:
        """One decoder step over the whole bucket: logits (Nb, V), and attention (L, Nb, H, Sb)."""
        if not capture or self.eager:
            return decoder_step(model, self, need_weights)
        if need_weights not in self.graphs:
            try:
                self.graphs[need_weights] = self.record(model, need_weights)
            except RuntimeError as e:  # a kernel that cannot be captured: correct, only slower
                log.warning("decoder step not captured as a CUDA graph (%s); running it eagerly", e)
                self.eager = True
                return decoder_step(model, self, need_weights)
        graph, outputs = self.graphs[need_weights]
        graph.replay()
        return outputs

    def record(self, model: Transformer, need_weights: bool):
        """PyTorch's recipe: warm up on a side stream, then capture. The warm-up steps write keys
        at positions not yet attended to and advance the positions, which are then put back."""
        position = self.position.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                decoder_step(model, self, need_weights)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = decoder_step(model, self, need_weights)
        self.position.copy_(position)
        return graph, outputs


def decoder_step(model: Transformer, buf: StepBuffers, need_weights: bool) -> tuple[Tensor, Tensor | None]:
    """`Transformer.decode_step` over fixed-shape buffers: each row's token at its position; the
    step writes its keys/values in place and advances the positions. Returns logits (Nb, V) and,
    if asked, encoder-decoder attention (L, Nb, H, Sb)."""
    c = model.config
    N, g, Tb = buf.rows, buf.bucket.group, buf.bucket.capacity
    H, Dh = c.n_heads, c.d_model // c.n_heads
    t = buf.position  # (Nb,)
    x = model.tgt_embed(buf.tokens) * model.embed_scale + model.positions.index_select(0, t)  # (Nb, D)
    x = x[:, None]  # (Nb, 1, D)
    # each row sees its positions up to its own: an additive bias (Nb, 1, 1, Tb)
    visible = torch.arange(Tb, device=t.device) <= t[:, None]  # (Nb, Tb)
    self_bias = torch.zeros(N, 1, 1, Tb, dtype=x.dtype, device=x.device).masked_fill_(~visible[:, None, None],
                                                                                        float("-inf"))
    write_at = t.view(N, 1, 1, 1).expand(N, H, 1, Dh)
    all_weights = []
    for i, layer in enumerate(model.decoder_layers):
        keys, values = buf.self_kv[i]  # 2 x (Nb, H, Tb, Dh)

        def self_attention(h, attn=layer.self_attn, keys=keys, values=values):
            q, k, v = attn.qkv_proj(h).view(N, 3, H, Dh).unbind(1)  # 3 x (Nb, H, Dh)
            keys.scatter_(2, write_at, k[:, :, None])
            values.scatter_(2, write_at, v[:, :, None])
            out, _ = attention(q[:, :, None], keys, values, self_bias, False, 0.0)  # (Nb, H, 1, Dh)
            return attn.out_proj(attn.merge_heads(out)), None

        def cross_attention(h, attn=layer.cross_attn, kv=buf.cross_kv[i]):
            # the g rows of one sentence are g queries against that sentence's keys
            q = attn.q_proj(h).view(N // g, g, H, Dh).transpose(1, 2)  # (Bb, H, g, Dh)
            out, w = attention(q, kv[0], kv[1], buf.src_bias, need_weights, 0.0)
            out = out.transpose(1, 2).reshape(N, 1, H * Dh)
            if w is not None:
                w = w.transpose(1, 2).reshape(N, H, -1)  # (Nb, H, Sb)
            return attn.out_proj(out), w

        x, weights = layer(x, self_attention, cross_attention)
        all_weights.append(weights)
    t.add_(1)
    logits = model.output_proj(model.decoder_norm(x[:, 0]))  # (Nb, V)
    return logits, (torch.stack(all_weights) if need_weights else None)


class StaticCache:
    """The search's view of a bucket's buffers: its first `sentences` sentences are real. Has
    `DecoderCache`'s interface for beam search (`reorder`, `length`, `capacity`, `group`)."""

    def __init__(self, buffers: StepBuffers, sentences: int, source_len: int, group: int, capacity: int):
        self.buffers, self.sentences, self.source_len = buffers, sentences, source_len
        self.group, self.capacity = group, capacity
        self.length = 0  # positions filled so far

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Row r becomes old row rows[r]; with `sources`, only those sentences are kept (the rows
        list theirs alone, source-major) and move to the front of the bucket."""
        buf = self.buffers
        padded = torch.cat([rows, torch.arange(rows.numel(), buf.rows, device=rows.device)])  # (Nb,)
        filled = buf.self_kv[..., : self.length, :]  # (L, 2, Nb, H, length, Dh)
        filled.copy_(filled.index_select(2, padded))
        if sources is not None:
            Bb = buf.bucket.sentences
            kept = torch.cat([sources, torch.arange(sources.numel(), Bb, device=sources.device)])  # (Bb,)
            buf.cross_kv.copy_(buf.cross_kv.index_select(2, kept))
            buf.src_bias.copy_(buf.src_bias.index_select(0, kept))
            self.sentences = sources.numel()


class GraphedDecoder:
    """Beam search's IncrementalDecoder over a Transformer, each decoder step a replayed CUDA
    graph (capture=True, on a GPU) or the same fixed-shape step run eagerly (capture=False)."""

    def __init__(self, model: Transformer, capture: bool | None = None):
        self.model, self.config = model, model.config
        self.columns = None  # no vocabulary shortlist (a CPU speed-up)
        self.device = model.tgt_embed.weight.device
        self.dtype = model.tgt_embed.weight.dtype
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        # free buffer sets by bucket, least recently used first; a search takes one and gives it
        # back when its cache is collected, so concurrent searches never share buffers
        self._free: OrderedDict[Bucket, list[StepBuffers]] = OrderedDict()
        self._lock = threading.Lock()

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.encode(src)

    def start_cache(self, memory: Tensor, src_mask: Tensor, group: int, capacity: int) -> StaticCache:
        if capacity > self.config.max_positions:
            raise ValueError(f"{capacity} target positions asked; the model accepts at most {self.config.max_positions}")
        B, S = src_mask.size(0), src_mask.size(-1)
        bucket = Bucket(round_up_sentences(B), group, round_up_length(S),
                        min(round_up_length(capacity), self.config.max_positions))
        buffers = self._take(bucket)
        buffers.fill(self.model, memory, src_mask)
        cache = StaticCache(buffers, B, S, group, capacity)
        weakref.finalize(cache, self._give_back, buffers)
        return cache

    def decode_step(self, tokens: Tensor, cache: StaticCache, need_weights: bool = False):
        """tokens: (N,), N <= the bucket's rows. Returns logits (N, V) for the next token (valid
        until the next step) and, if asked, encoder-decoder attention (L, N, H, S)."""
        if cache.length >= cache.capacity:
            raise ValueError(f"decoder cache is full ({cache.capacity} positions)")
        buf, n = cache.buffers, tokens.size(0)
        buf.tokens[:n].copy_(tokens)
        logits, weights = buf.run(self.model, need_weights, self.capture)
        cache.length += 1
        return logits[:n], (weights[:, :n, :, : cache.source_len].clone() if need_weights else None)

    def _take(self, bucket: Bucket) -> StepBuffers:
        with self._lock:
            free = self._free.get(bucket)
            if free:
                self._free.move_to_end(bucket)
                return free.pop()
        return StepBuffers(self.config, bucket, self.dtype, self.device)

    def _give_back(self, buffers: StepBuffers) -> None:
        with self._lock:
            self._free.setdefault(buffers.bucket, []).append(buffers)
            self._free.move_to_end(buffers.bucket)
            while sum(len(v) for v in self._free.values()) > _KEEP_BUFFERS:
                oldest = next(iter(self._free))
                self._free[oldest].pop(0)
                if not self._free[oldest]:
                    del self._free[oldest]
