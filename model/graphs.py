"""Beam search as a CUDA graph: one replay and one host sync per step.

A step of beam search over a small Transformer launches ~15 kernels per decoder layer, the
output projection and ~35 kernels of selection; on a GPU, launching them costs more than running
them (bench/gpu.py --profile: 319 ms of CPU for 58 ms of GPU over 30 steps at batch 128, the
step kernel by kernel). A CUDA graph records one step once and replays it with a single launch.
That needs a step whose every shape and buffer address is the same each time:

- the self-attention keys/values of every layer live in one buffer allocated per bucket,
  `[layers, 2, rows, heads, capacity, Dh]`, written in place at each row's position, a tensor the
  step itself advances (never a Python int); every step attends over the whole capacity, the
  positions after a row's own masked out;
- encoder-decoder keys/values are computed once per sentence, and a sentence's beams attend to
  its one copy as queries of one batch entry (as `Transformer.decode_step` does);
- the search's state (beam scores, the pool of finished hypotheses, each sentence's own step
  count) lives in the same buffers, and each step writes its candidates into a history (a ring of
  `capacity` steps) the hypotheses are read back from when the search is over (model/search.py's
  `read_back`; model/running.py reads back each sentence as it leaves a running batch);
- the batch is padded up to its bucket (a power of two of sentences; source length and capacity
  rounded up to a few sizes) and never shrinks: a sentence that is done stops searching in place
  (its pool of finished hypotheses frozen, `live` false) and its rows run on, unread, until the
  bucket's last sentence is done. After each replay the host reads one status tensor (whether
  any sentence still searches, whether every beam continued itself, which slots are live) and,
  on the steps where beams switched, reorders the rows' filled keys/values by an in-place gather
  (outside the graph: the filled length changes every step, and gathering the whole capacity
  inside it would move up to twice the bytes of the step itself).

A running batch (model/running.py) fills free slots between steps with `join_step`, the encoder
and every write into the joiners' slots, also one replayed graph per number of joiners (rounded
up to a power of two, the last joiner repeated): eagerly, a join was ~150 kernel launches, two
thirds of a running step's time on an H200.

The step is `Transformer.decode_step` and `search.select_on_device`, so the search is the one in
model/search.py; `GraphedBeamSearch` runs its loop over these buffers. On a CPU (capture=False)
it runs the same steps eagerly: the twin the tests compare token for token with `beam_search`.

Shapes: L decoder layers, H heads, Dh head size, Bb sentences of the bucket, k beams, Nb = Bb * k
rows, Sb source positions, Tb target positions (the capacity), V vocabulary.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from model.config import ModelConfig
from model.search import Hypothesis, StepRecord, read_back, search_caps, select_on_device
from model.transformer import Transformer, attention, inference_attention_backends

log = logging.getLogger(__name__)

# lengths (source positions, target capacity) are rounded up to one of these, or to a multiple of
# the largest: few buckets (each one records its own graphs), multiples of 16 (the fused attention
# kernels' masks stay aligned); attending over up to twice the positions costs a GPU little
_LENGTHS = (32, 64, 128, 256, 512)
# bytes of free buffer sets kept for reuse (each with its graphs), least recently used dropped
# first: 2 GiB, or a sixteenth of a smaller GPU's memory
_KEEP_BYTES = 2 << 30


def round_up_length(n: int) -> int:
    return next((b for b in _LENGTHS if b >= n), -(-n // _LENGTHS[-1]) * _LENGTHS[-1])


def round_up_sentences(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class Bucket:
    sentences: int  # Bb
    beams: int  # k
    source_len: int  # Sb
    capacity: int  # Tb




def decoder_step(model: Transformer, buf: SearchBuffers, need_weights: bool) -> tuple[Tensor, Tensor | None]:
    """`Transformer.decode_step` over the bucket's buffers: each row's token at its position; the
    step writes its keys/values in place and advances the positions. Returns logits (Nb, V) and,
    if asked, encoder-decoder attention (L, Nb, H, Sb)."""
    c = model.config
    N, k, Tb = buf.rows, buf.bucket.beams, buf.bucket.capacity
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
            q, k_new, v_new = attn.qkv_proj(h).view(N, 3, H, Dh).unbind(1)  # 3 x (Nb, H, Dh)
            keys.scatter_(2, write_at, k_new[:, :, None])
            values.scatter_(2, write_at, v_new[:, :, None])
            out, _ = attention(q[:, :, None], keys, values, self_bias, False, 0.0)  # (Nb, H, 1, Dh)
            return attn.out_proj(attn.merge_heads(out)), None

        def cross_attention(h, attn=layer.cross_attn, kv=buf.cross_kv[i]):
            return attn.attend_per_source(h, kv[0], kv[1], buf.src_bias, k, need_weights, attention)

        x, weights = layer(x, self_attention, cross_attention)
        all_weights.append(weights)
    # a row of a sentence never passes its cap (< Tb); rows of empty slots (model/running.py) run
    # on unread and must stay within the buffers
    t.add_(1).clamp_(max=Tb - 1)
    logits = model.output_proj(model.decoder_norm(x[:, 0]))  # (Nb, V)
    return logits, (torch.stack(all_weights) if need_weights else None)


class SearchBuffers:
    """Everything one step of the search reads and writes, for one bucket, and the graphs
    recorded over these addresses (by whether attention is returned, and the banned tokens)."""

    def __init__(self, config: ModelConfig, bucket: Bucket, dtype: torch.dtype, device: torch.device):
        self.bucket = bucket
        L, H, Dh = config.decoder_layers, config.n_heads, config.d_model // config.n_heads
        Bb, k, Sb, Tb = bucket.sentences, bucket.beams, bucket.source_len, bucket.capacity
        Nb = Bb * k

        def zeros(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)

        # the decoder's
        self.tokens = zeros(Nb).fill_(config.decoder_start_id)  # each row's newest token
        self.position = zeros(Nb)  # each row's next position
        self.self_kv = zeros(L, 2, Nb, H, Tb, Dh, dtype=dtype)
        self.cross_kv = zeros(L, 2, Bb, H, Sb, Dh, dtype=dtype)
        self.src_bias = zeros(Bb, 1, 1, Sb, dtype=dtype)  # 0 or -inf (padding)
        # made once for the beam reorder and the step's flags: each row's own index, each sentence's first row
        self.own_rows = torch.arange(Nb, device=device)  # (Nb,)
        self.first_row = self.own_rows[::k, None]  # (Bb, 1)
        # the search's (model/search.py's names)
        self.step = zeros(1)  # steps run; the history keeps the last Tb, step s at s % Tb
        self.t = zeros(Bb)  # each sentence's own steps (its length so far)
        self.length_penalty = zeros(1, dtype=torch.float32)
        self.max_len = zeros(Bb)
        # what the host reads after each step, in one copy: any slot live, every live beam continued
        # itself (no reorder), then each slot's `live` (its sentence still searches: not done, not empty)
        self.status = zeros(2 + Bb, dtype=torch.bool)
        self.flags, self.live = self.status[:2], self.status[2:]
        self.run_scores = zeros(Bb, k, dtype=torch.float32)
        self.pool_scores = zeros(Bb, k, dtype=torch.float32)
        self.pool_ref = zeros(Bb, k)
        self.parents = zeros(Bb, k)  # the beam each beam continues (a done or empty slot: its own)
        # each step's candidates, for the read-back: (Tb, Bb, 2k), and keep (Tb, Bb, k)
        self.cand_scores = zeros(Tb, Bb, 2 * k, dtype=torch.float32)
        self.cand_row, self.cand_tok, self.keep = zeros(Tb, Bb, 2 * k), zeros(Tb, Bb, 2 * k), zeros(Tb, Bb, k)
        self.attention: Tensor | None = None  # (Tb, Bb, k, L, H, Sb), made when first asked for
        self.attention_shape = (Tb, Bb, k, L, H, Sb)
        self.graphs: dict[tuple[bool, tuple[int, ...]], torch.cuda.CUDAGraph] = {}
        self.eager = False  # a capture failed: this bucket's steps run eagerly
        # a running batch's joins (join_step), by joiners rounded up to a power of two: each its
        # inputs, (n, Sb + 2) = the sources, then each one's slot and cap, and its graph
        self.join_inputs: dict[int, Tensor] = {}
        self.join_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.eager_joins = False  # a join's capture failed: joins run eagerly
        self.join_pool = None  # the join graphs' one memory pool (record_join)
        # a pipelined search's copies of the flags on their way to the host (flags_later), by step parity
        self.flags_host = [torch.zeros(2, dtype=torch.bool, pin_memory=device.type == "cuda") for _ in range(2)]
        self.flags_copied = [torch.cuda.Event() for _ in range(2)] if device.type == "cuda" else []

    @property
    def rows(self) -> int:
        return self.tokens.size(0)

    @property
    def nbytes(self) -> int:
        tensors = [t for t in vars(self).values() if isinstance(t, Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def start(self, model: Transformer, memory: Tensor, src_mask: Tensor, max_len: Tensor,
              length_penalty: float) -> None:
        """A new search of B sentences: memory (B, S, D), src_mask (B, 1, 1, S), max_len (B,)."""
        B, S = src_mask.size(0), src_mask.size(-1)
        for i, layer in enumerate(model.decoder_layers):
            k, v = layer.cross_attn.memory_kv(memory)  # 2 x (B, H, S, Dh)
            self.cross_kv[i, 0, :B, :, :S] = k
            self.cross_kv[i, 1, :B, :, :S] = v
        self.src_bias.zero_()  # the bucket's spare sentences attend to zeros: finite, never read
        self.src_bias[:B, :, :, :S].masked_fill_(~src_mask, float("-inf"))
        self.src_bias[:B, :, :, S:] = float("-inf")
        self.tokens.fill_(model.config.decoder_start_id)
        self.position.zero_()
        self.step.zero_()
        self.t.zero_()
        self.length_penalty.fill_(length_penalty)
        self.max_len.fill_(int(max_len.max()))
        self.max_len[:B] = max_len
        self.live.zero_()
        self.live[:B] = True
        self.run_scores.zero_()
        self.run_scores[:, 1:] = -1e9  # all beams start equal: expand only the first
        self.pool_scores.fill_(float("-inf"))
        self.pool_ref.zero_()

    def prepare(self, model: Transformer, keys: list[tuple[bool, tuple[int, ...]]], eos_id: int, capture: bool) -> None:
        """Record the graphs of `keys` not recorded yet (before `start`: recording runs steps)."""
        for need_weights, _ in keys:
            if need_weights and self.attention is None:
                self.attention = torch.zeros(self.attention_shape, device=self.step.device)
        if not capture or self.eager:
            return
        for key in keys:
            if key in self.graphs:
                continue
            try:
                self.graphs[key] = self.record(model, *key, eos_id)
            except RuntimeError as e:  # a kernel that cannot be captured: correct, only slower
                log.warning("search step not captured as a CUDA graph (%s); running it eagerly", e)
                self.eager = True
                return

    def record(self, model: Transformer, need_weights: bool, banned: tuple[int, ...], eos_id: int):
        """PyTorch's recipe: warm up on a side stream, then capture (which runs nothing)."""
        self.step.zero_()  # the warm-up advances these; each search starts them anew
        self.position.zero_()
        self.t.zero_()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                search_step(model, self, need_weights, banned, eos_id)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            search_step(model, self, need_weights, banned, eos_id)
        return graph

    def run(self, model: Transformer, need_weights: bool, banned: tuple[int, ...], eos_id: int) -> None:
        graph = self.graphs.get((need_weights, banned))
        if graph is None:
            search_step(model, self, need_weights, banned, eos_id)
        else:
            graph.replay()

    def join(self, model: Transformer, sources: list[list[int]], slots: list[int], caps: list[int],
             capture: bool) -> None:
        """Sentences (EOS-terminated source ids, each at most Sb) into free slots of a running
        batch, each to write at most its cap of new tokens: `join_step` over inputs padded to a
        power of two of sentences with copies of the last one (the same values written twice into
        its slot), each source to Sb. On a GPU one replayed graph per size, recorded at its first
        join (recording runs the join, which writes the same values again), so a join costs one
        copy to the device and one launch instead of the encoder's and the writes' ~150."""
        Sb, n, pad = self.bucket.source_len, round_up_sentences(len(sources)), model.config.pad_id
        rows = [ids + [pad] * (Sb - len(ids)) + [slot, cap] for ids, slot, cap in zip(sources, slots, caps)]
        host = torch.tensor(rows + rows[-1:] * (n - len(rows)), dtype=torch.long)  # (n, Sb + 2): one tensor
        inputs = self.join_inputs.get(n)
        if inputs is None:
            inputs = self.join_inputs[n] = torch.empty_like(host, device=self.step.device)
        inputs.copy_(host)
        graph = self.join_graphs.get(n)
        if graph is None:
            with inference_attention_backends(self.step.device):  # what the graph records, or runs now
                if capture and not self.eager_joins:
                    try:
                        graph = self.join_graphs[n] = self.record_join(model, inputs)
                        return  # recording ran the join
                    except RuntimeError as e:  # as the step: correct, only slower
                        log.warning("running batch's join not captured as a CUDA graph (%s); running it eagerly", e)
                        self.eager_joins = True
                join_step(model, self, inputs)
        else:
            graph.replay()

    def record_join(self, model: Transformer, inputs: Tensor):
        """`record`'s recipe for join_step over `inputs`, which hold a real join: the warm-up runs
        write it (twice, the same values), the capture runs nothing."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                join_step(model, self, inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # one memory pool for all sizes: a join keeps nothing of its own (it writes the buffers
        # above), and joins run one after another, so each size's scratch memory is the others' too
        with torch.cuda.graph(graph, pool=self.join_pool):
            join_step(model, self, inputs)
        self.join_pool = self.join_pool or graph.pool()
        return graph

    def flags_later(self, step: int) -> Callable[[], list[bool]]:
        """The flags after this step, read when the returned function is called: on a GPU the copy
        to the host is queued behind the step and waited for only then, so that the next step can
        be queued meanwhile; elsewhere read now."""
        host = self.flags_host[step % 2]
        if not self.flags_copied:
            host.copy_(self.flags)
            return host.tolist
        copied = self.flags_copied[step % 2]
        host.copy_(self.flags, non_blocking=True)
        copied.record()
        return lambda: (copied.synchronize(), host.tolist())[1]

    def reorder(self, length: int) -> None:
        """Each row's first `length` keys/values become those of the beam it continues (`parents`)."""
        rows = (self.first_row + self.parents).view(-1)  # (Nb,)
        filled = self.self_kv[..., :length, :]  # (L, 2, Nb, H, length, Dh)
        filled.copy_(filled.index_select(2, rows))


def search_step(model: Transformer, buf: SearchBuffers, need_weights: bool, banned: tuple[int, ...],
                eos_id: int) -> None:
    """One step of beam search over the bucket, in place: the decoder step, the selection
    (search.select_on_device), this step's candidates into the history, and the status the host
    reads. A sentence that is done (or a slot without one) keeps its pool and its rows. No host
    sync, no Python value that changes between steps."""
    (Bb, k), s = buf.run_scores.shape, buf.step
    at = s.remainder(buf.bucket.capacity)  # (1,) where this step goes in the history
    logits, attn = decoder_step(model, buf, need_weights)  # (Nb, V), (L, Nb, H, Sb)
    chosen = select_on_device(logits, buf.run_scores, buf.pool_scores, buf.pool_ref, buf.max_len, buf.t, banned,
                              eos_id, buf.length_penalty, history_step=at)
    for history, now in ((buf.cand_scores, chosen.cand_scores), (buf.cand_row, chosen.cand_row),
                         (buf.cand_tok, chosen.cand_tok), (buf.keep, chosen.keep)):
        history.index_copy_(0, at, now[None])
    if need_weights:
        buf.attention.index_copy_(0, at, attn.transpose(0, 1).reshape(1, Bb, k, *attn.shape[:1], *attn.shape[2:]))
    live = buf.live[:, None]  # (Bb, 1)
    # the pool of a sentence done at an earlier step is what the read-back reads: kept as it was
    buf.pool_scores.copy_(torch.where(live, chosen.pool_scores, buf.pool_scores))
    buf.pool_ref.copy_(torch.where(live, chosen.pool_ref, buf.pool_ref))
    for state, now in ((buf.run_scores, chosen.run_scores), (buf.tokens, chosen.tokens)):
        state.copy_(now)
    buf.live.logical_and_(~chosen.done)
    # the beam each beam continues; a slot whose sentence is done (now or before), or empty, keeps its rows
    buf.parents.copy_(torch.where(buf.live[:, None], chosen.parents, buf.own_rows[:k]))
    buf.flags.copy_(torch.stack([buf.live.any(), (buf.parents == buf.own_rows[:k]).all()]))
    buf.t.add_(1)
    s.add_(1)


def join_step(model: Transformer, buf: SearchBuffers, inputs: Tensor) -> None:
    """Sentences into slots of a running batch, in place: each encoded, its encoder-decoder
    keys/values and source padding into its slot, its k rows at position 0 with the start token,
    its search state new (all beams equal, empty pool, its cap, live). inputs: (n, Sb + 2), each
    sentence's PAD-padded source ids, slot, cap. Every write sets values from `inputs` alone, so
    running it twice writes the same; no host sync, no Python value that changes between joins."""
    Sb, k = buf.bucket.source_len, buf.bucket.beams
    S = min(Sb, model.config.max_positions)  # the positions a source can have (Sb rounds up past them)
    src, at, cap = inputs[:, :S], inputs[:, Sb], inputs[:, Sb + 1]  # (n, S), (n,), (n,)
    memory, src_mask = model.encode(src)  # (n, S, D), (n, 1, 1, S)
    for i, layer in enumerate(model.decoder_layers):
        keys, values = layer.cross_attn.memory_kv(memory)  # 2 x (n, H, S, Dh)
        buf.cross_kv[i, 0, :, :, :S].index_copy_(0, at, keys)
        buf.cross_kv[i, 1, :, :, :S].index_copy_(0, at, values)
    bias = torch.full((at.size(0), 1, 1, Sb), float("-inf"), dtype=buf.src_bias.dtype, device=src.device)
    bias[..., :S].masked_fill_(src_mask, 0.0)  # (n, 1, 1, Sb): 0 on each source's tokens, -inf elsewhere
    buf.src_bias.index_copy_(0, at, bias)
    rows = (at[:, None] * k + buf.own_rows[:k]).view(-1)  # (n * k,) the slots' rows
    buf.position.index_fill_(0, rows, 0)
    buf.tokens.index_fill_(0, rows, model.config.decoder_start_id)
    start = torch.full((at.size(0), k), -1e9, device=src.device)  # (n, k) all beams start equal: expand only the first
    buf.run_scores.index_copy_(0, at, start.index_fill_(1, buf.own_rows[:1], 0.0))
    buf.pool_scores.index_fill_(0, at, float("-inf"))
    buf.pool_ref.index_fill_(0, at, 0)
    buf.max_len.index_copy_(0, at, cap)
    buf.t.index_fill_(0, at, 0)
    buf.live.index_fill_(0, at, True)


class GraphedBeamSearch:
    """model/search.py's beam_search (same arguments, same hypotheses) over a Transformer, each
    step a replayed CUDA graph (capture=True, on a GPU) or the same fixed-shape step run eagerly
    (capture=False)."""

    def __init__(self, model: Transformer, capture: bool | None = None):
        self.model, self.config = model, model.config
        self.device = model.tgt_embed.weight.device
        self.dtype = model.tgt_embed.weight.dtype
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        # free buffer sets by bucket, least recently used first: a search takes one and gives it
        # back when it ends, so concurrent searches never share buffers
        self._free: OrderedDict[Bucket, list[SearchBuffers]] = OrderedDict()
        self._lock = threading.Lock()
        # pipelined: the host reads a step's flags while the next step runs (one step may run after
        # the search ended), instead of waiting for each step before queueing the next; off by default
        # until a GPU run measures it (bench/gpu.py's "ours-pipelined")
        self.pipelined = False
        self.keep_bytes = _KEEP_BYTES
        if self.device.type == "cuda":
            self.keep_bytes = min(_KEEP_BYTES, torch.cuda.get_device_properties(self.device).total_memory // 16)

    @torch.inference_mode()
    def __call__(self, src: Tensor, beam_size: int = 4, n_best: int = 1, length_penalty: float = 1.0,
                 max_new_tokens: Tensor | int = 128, return_attention: bool = False,
                 min_new_tokens: int = 0) -> list[list[Hypothesis]]:
        c, k, device = self.config, beam_size, src.device
        B = src.size(0)
        max_len = search_caps(src, beam_size, n_best, max_new_tokens)  # (B,)
        T_cap = int(max_len.max())
        if T_cap > c.max_positions:
            raise ValueError(f"{T_cap} target positions asked; the model accepts at most {c.max_positions}")
        memory, src_mask = self.model.encode(src)
        S = src_mask.size(-1)
        source_len = src_mask.view(B, -1).sum(-1).tolist()
        # the decoder never emits PAD; EOS is banned before min_new_tokens
        banned_late, banned_early = (c.pad_id,), (c.pad_id, c.eos_id)
        keys = [(return_attention, banned_late)] + ([(return_attention, banned_early)] if min_new_tokens else [])

        bucket = Bucket(round_up_sentences(B), k, round_up_length(S), min(round_up_length(T_cap), c.max_positions))
        buf = self.take_buffers(bucket)
        try:
            buf.prepare(self.model, keys, c.eos_id, self.capture)
            buf.start(self.model, memory, src_mask, max_len, length_penalty)
            steps, previous = 0, None
            for t in range(T_cap):
                buf.run(self.model, return_attention, banned_late if t >= min_new_tokens else banned_early, c.eos_id)
                steps += 1
                if self.pipelined:
                    # the host waits for the step before while this one runs: it reorders every step
                    # (in place, a copy of the rows onto themselves), and a step queued after the search
                    # ended changes nothing (done sentences keep their pools and rows)
                    buf.reorder(t + 1)
                    flags = buf.flags_later(t)
                    if previous is not None and not previous()[0]:
                        break
                    previous = flags
                    continue
                searching, in_place = buf.flags.tolist()  # the step's one host sync
                if not searching:
                    break
                if not in_place:
                    buf.reorder(t + 1)
            every = torch.arange(B, device=device)  # each step's sentences, in bucket order: all of them
            finished = [(every, buf.pool_scores[:B], buf.pool_ref[:B])]
            return read_back(self.history(buf, [every] * steps), finished, n_best, 2 * k, c.eos_id, source_len, B)
        finally:
            self.give_back(buf)

    @staticmethod
    def history(buf: SearchBuffers, running: list[Tensor]) -> list[StepRecord]:
        """Each step's candidates over its running sentences, copied to the host at once."""
        T = len(running)
        scores, row, token, keep = (h[:T].cpu() for h in (buf.cand_scores, buf.cand_row, buf.cand_tok, buf.keep))
        steps = []
        for s, sent in enumerate(running):
            n = sent.numel()
            step = StepRecord(sent, scores[s, :n], row[s, :n], token[s, :n], keep[s, :n])
            if buf.attention is not None:
                step.attention = buf.attention[s, :n]  # (n, k, L, H, Sb): read back before the buffers are reused
            steps.append(step)
        return steps

    def release(self) -> None:
        """Drop the free buffer sets and their graphs (after running out of memory, say)."""
        with self._lock:
            self._free.clear()

    def take_buffers(self, bucket: Bucket) -> SearchBuffers:
        """A free buffer set of this bucket (with its graphs), or a new one; this caller's alone
        until it gives it back."""
        with self._lock:
            free = self._free.get(bucket)
            if free:
                self._free.move_to_end(bucket)
                return free.pop()
        return SearchBuffers(self.config, bucket, self.dtype, self.device)

    def give_back(self, buffers: SearchBuffers) -> None:
        """Buffers taken with take_buffers, free again (kept while they fit the byte budget)."""
        with self._lock:
            self._free.setdefault(buffers.bucket, []).append(buffers)
            self._free.move_to_end(buffers.bucket)
            while sum(b.nbytes for free in self._free.values() for b in free) > self.keep_bytes:
                oldest = next(iter(self._free))
                self._free[oldest].pop(0)
                if not self._free[oldest]:
                    del self._free[oldest]
