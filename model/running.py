"""A running batch that sentences join and leave at step boundaries (iteration-level scheduling).

A batch decoded as a whole makes every sentence wait for the longest one in it, and a sentence
that arrives meanwhile wait for the whole batch. Here each slot of a bucket (model/graphs.py's
buffers: one sentence and its k beams) is filled and emptied on its own: after each step the
sentences that are done leave with their hypotheses, and newly encoded sentences take the free
slots, their keys/values written into the slot, their rows starting at position 0. The step is
the graphed search's (`graphs.search_step`: one CUDA graph replay on a GPU, the same step run
eagerly on a CPU); each sentence counts its own steps (length penalty, cap), and the history of
candidates is a ring of `capacity` steps, which no sentence outlives.

    batch = RunningBatch(GraphedBeamSearch(model), slots=32, beam_size=4, source_len=64, capacity=128)
    batch.admit([("a", ids_a, 40), ("b", ids_b, 25)])      # (key, EOS-terminated source ids, cap)
    while batch.running:
        for key, hypotheses in batch.step():                # the sentences that finished this step
            ...
        batch.admit(arrived_meanwhile[: batch.free])

Each sentence's hypotheses are those `beam_search` gives it alone (tests/test_running.py).

Two kinds, one use: `RunningBatch` over the GPU's fixed-shape step (every slot computed, which a
CUDA graph replays at the cost of one launch), and `EagerRunningBatch` over the CPU engine's own
decoder step (only the running sentences' rows: the fused int8 step or the model's, the C++
attention and search step, the vocabulary shortlist), whose rows sit at their own positions in
a shared cache (transformer.DecoderCache.position). `RunningBatches` keeps one per decoding
shape for a worker.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

from model.graphs import Bucket, GraphedBeamSearch, SearchBuffers, round_up_length, round_up_sentences
from model.options import DecodingOptions
from model.pipeline import Decoded
from model.search import (
    Hypothesis,
    IncrementalDecoder,
    SelectFn,
    columns_of,
    encode_by_length,
    hypothesis_at,
    padded,
    select,
)
from model.shortlist import Shortlist
from model.transformer import DecoderCache, inference_attention_backends
from model.translator import as_decoded


class RunningBatch:
    @torch.inference_mode()  # as GraphedBeamSearch's searches: their buffers are shared, and capture runs steps
    def __init__(self, search: GraphedBeamSearch, slots: int, beam_size: int, source_len: int, capacity: int,
                 length_penalty: float = 1.0, attention: bool = False):
        """Room for `slots` sentences of up to `source_len` source tokens and `capacity` new tokens."""
        c = search.config
        if capacity > c.max_positions:
            raise ValueError(f"{capacity} target positions asked; the model accepts at most {c.max_positions}")
        self.search, self.k, self.attention = search, beam_size, attention
        self.bucket = Bucket(round_up_sentences(slots), beam_size, round_up_length(source_len),
                             min(round_up_length(capacity), c.max_positions))
        self.buf = search.take_buffers(self.bucket)
        self.banned = (c.pad_id,)  # the decoder never emits PAD
        self.buf.prepare(search.model, [(attention, self.banned)], c.eos_id, search.capture)
        b = self.buf
        b.live.zero_()
        b.step.zero_()
        b.position.zero_()
        b.t.zero_()
        b.length_penalty.fill_(length_penalty)
        b.run_scores.zero_()
        b.pool_scores.fill_(float("-inf"))
        self.steps = 0  # steps run
        # per slot, on the host: its sentence's key, the step it joined at, its source length
        self.key: list[Hashable | None] = [None] * self.bucket.sentences
        self.joined = [0] * self.bucket.sentences
        self.source_len = [0] * self.bucket.sentences
        self.wanted = [beam_size] * self.bucket.sentences  # hypotheses its sentence returns

    @property
    def free(self) -> int:
        return self.key.count(None)

    @property
    def running(self) -> int:
        return len(self.key) - self.free

    @torch.inference_mode()
    def admit(self, items: list[tuple[Hashable, list[int], int]], n_best: list[int] | None = None) -> None:
        """Sentences (key, EOS-terminated source ids, most new tokens) into free slots, encoded now
        (SearchBuffers.join: on a GPU one replayed graph); n_best: how many hypotheses each
        returns (default all beam_size)."""
        if len(items) > self.free:
            raise ValueError(f"{len(items)} sentences for {self.free} free slots")
        if not items:
            return
        if self.bucket.source_len < max(len(ids) for _, ids, _ in items) or \
                max(cap for *_, cap in items) > self.bucket.capacity:
            raise ValueError(f"a sentence longer than this batch takes ({self.bucket.source_len} source tokens, "
                             f"{self.bucket.capacity} new ones)")
        slots = [j for j, key in enumerate(self.key) if key is None][: len(items)]
        self.buf.join(self.search.model, [ids for _, ids, _ in items], slots, [cap for *_, cap in items],
                      self.search.capture)
        for j, (key, ids, _), wanted in zip(slots, items, n_best or [self.k] * len(items)):
            self.key[j], self.joined[j], self.source_len[j], self.wanted[j] = key, self.steps, len(ids), wanted

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """One step of every running sentence; returns those that finished, with their hypotheses
        (best first, as many as each wants), and frees their slots."""
        if not self.running:
            return []
        b = self.buf
        b.run(self.search.model, self.attention, self.banned, self.search.config.eos_id)
        self.steps += 1
        _, in_place, *live = b.status.tolist()  # the step's host sync; it stopped the sentences done
        done = [j for j, key in enumerate(self.key) if key is not None and not live[j]]
        if not in_place:  # queued before the read-back, which does not read the keys/values
            b.reorder(max((self.steps - self.joined[j] for j, key in enumerate(self.key)
                           if key is not None and live[j]), default=0))
        if not done:
            return []
        # the finished sentences' history and pools, gathered on the device and copied to the host
        # together: one more sync, not one per tensor
        at = torch.tensor(done, device=b.status.device)  # (n,)
        copies = [h.index_select(1, at).to("cpu", non_blocking=True) for h in (b.cand_scores, b.cand_row,
                                                                                 b.cand_tok, b.keep)]
        copies += [h.index_select(0, at).to("cpu", non_blocking=True) for h in (b.pool_scores, b.pool_ref)]
        if at.is_cuda:
            torch.cuda.current_stream(at.device).synchronize()
        *history, pool_scores, pool_ref = copies  # 4 x (Tb, n, .), 2 x (n, k)
        pool_scores, pool_ref = pool_scores.tolist(), pool_ref.tolist()
        finished = []
        for n, j in enumerate(done):
            wanted = self.wanted[j]
            finished.append((self.key[j], self.read_back(j, [h[:, n] for h in history], pool_scores[n][:wanted],
                                                         pool_ref[n][:wanted])))
            self.key[j] = None
        return finished

    @torch.inference_mode()
    def drop(self, keys: set[Hashable]) -> None:
        """Sentences nobody waits for any more leave their slots now, unfinished."""
        slots = [j for j, key in enumerate(self.key) if key is not None and key in keys]
        for j in slots:
            self.key[j] = None
        if slots:
            self.buf.live[slots] = False

    def read_back(self, j: int, history: list[torch.Tensor], pool_scores: list[float],
                  pool_ref: list[int]) -> list[Hypothesis]:
        """The pool of slot j's sentence, done at this step, as hypotheses: each followed back
        through the ring of candidates to the step the sentence joined at. history: the slot's
        candidate scores, rows, tokens (Tb, 2k) and keep (Tb, k), on the host."""
        b, Tb, n_cand, eos_id = self.buf, self.bucket.capacity, 2 * self.k, self.search.config.eos_id
        first, last = self.joined[j], self.steps - 1  # its steps, as counted by this batch
        ring = torch.tensor([s % Tb for s in range(first, last + 1)])
        scores, row, token, keep = (h.index_select(0, ring).tolist() for h in history)
        hypotheses, paths = [], []
        for score, ref in zip(pool_scores, pool_ref):
            if score == float("-inf"):
                break  # fewer hypotheses than beams (tiny vocabularies)
            at, cand = divmod(ref, n_cand)
            s = last - first - (last - at) % Tb  # the ring slot `at` holds this sentence's step s
            log_prob, ids, beams = scores[s][cand], [], []
            for step in range(s, -1, -1):
                ids.append(token[step][cand])
                beams.append(row[step][cand])
                if step > 0:
                    cand = keep[step - 1][row[step][cand]]
            ids.reverse()
            beams.reverse()
            ended = ids[-1] == eos_id
            hypotheses.append(Hypothesis(ids[:-1] if ended else ids, score, log_prob, ended))
            paths.append(beams)
        if b.attention is not None and self.attention and paths:  # one gather for all its hypotheses
            steps = torch.tensor([(first + step) % Tb for path in paths for step in range(len(path))],
                                 device=b.attention.device)
            rows = torch.tensor([beam for path in paths for beam in path], device=b.attention.device)
            gathered = b.attention[steps, j, rows, :, :, : self.source_len[j]].float().cpu()  # (sum T, L, H, S)
            for h, part in zip(hypotheses, gathered.split([len(path) for path in paths])):
                h.attention = part.permute(1, 2, 0, 3).contiguous()  # (L, H, T, S)
        return hypotheses

    def close(self) -> None:
        """Give the buffers back to the search (for the next batch of this shape)."""
        self.search.give_back(self.buf)


class EagerRunningBatch:
    """A running batch over the CPU engine's own decoder step (the fused int8 step or the model's,
    the C++ attention and search step, and the vocabulary shortlist), where RunningBatch above
    runs the GPU's fixed-shape step. Its rows are the running sentences' beams only, so a step
    costs what these sentences cost: sentences join at a step boundary (encoded on admission,
    their encoder-decoder keys/values put into the cache) and leave when done, as in beam_search,
    whose hypotheses each gets (tests/test_running.py). Rows sit at their own positions: a
    sentence that joins writes its positions from 0 in its rows' slots of the self-attention
    buffer, and each row reads its own positions only (transformer.DecoderCache: `position`);
    its encoder-decoder keys/values go into a free entry of a pool (`entry`), so that nothing of
    the others moves when it joins or leaves.

    Same use as RunningBatch: `admit` (up to `free` sentences), `step`, `drop`, `close`.
    """

    def __init__(self, decoder: IncrementalDecoder, slots: int, beam_size: int, length_penalty: float = 1.0,
                 attention: bool = False, shortlist: Shortlist | None = None, select_fn: SelectFn = select):
        """decoder: a Transformer, or the fused int8 one (model/cpu/fused.py): its decode_step reads
        the cache's per-row positions."""
        self.decoder, self.view = decoder, decoder  # view: the decoder over this batch's shortlist
        self.slots, self.k, self.length_penalty, self.attention = slots, beam_size, length_penalty, attention
        self.shortlist, self.select_fn = shortlist, select_fn
        c = self.config = decoder.config
        self.columns: Tensor | None = None  # the target ids of the logits' columns (with a shortlist)
        self.chosen: Tensor | None = None  # (V,) bool: those ids as a mask
        self.left = 0  # sentences gone since the columns were computed anew
        self.banned, self.eos_col = (c.pad_id,), c.eos_id
        self.cache: DecoderCache | None = None
        self.free_slots: list[int] = []  # of the cache's self-attention buffer
        self.steps = 0  # steps run: the history's index
        # per running sentence, in the cache's source order
        self.key: list[Hashable] = []
        self.ids: list[list[int]] = []
        self.joined: list[int] = []  # the step it joined at
        self.cap: list[int] = []  # most new tokens, EOS included
        self.wanted: list[int] = []  # hypotheses it returns
        self.tokens = torch.empty(0, dtype=torch.long)  # (N,) each row's newest token
        self.run_scores = torch.empty(0, beam_size)  # (B, k)
        self.pool_scores = torch.empty(0, beam_size)  # (B, k) hypotheses set aside, best first
        self.pool_ref = torch.empty(0, beam_size, dtype=torch.long)  # (B, k) step * 2k + candidate
        self.max_len = torch.empty(0, dtype=torch.long)  # (B,)
        self.own_steps = torch.empty(0, dtype=torch.long)  # (B,) steps each sentence has run
        # per step still read by a running sentence: its records on the host (search.hypothesis_at's)
        # and, with attention, the beams' encoder-decoder attention (B, k, L, H, S)
        self.history: dict[int, tuple] = {}
        self.attention_of: dict[int, Tensor] = {}
        self.where: dict[Hashable, int] = {}  # the running sentences' places, shared by steps until it changes

    @property
    def free(self) -> int:
        return self.slots - len(self.key)

    @property
    def running(self) -> int:
        return len(self.key)

    @torch.inference_mode()
    def admit(self, items: list[tuple[Hashable, list[int], int]], n_best: list[int] | None = None) -> None:
        """Sentences (key, EOS-terminated source ids, most new tokens) join now, encoded now;
        n_best: how many hypotheses each returns (default all beam_size)."""
        if len(items) > self.free:
            raise ValueError(f"{len(items)} sentences for {self.free} free slots")
        if not items:
            return
        c, k, n = self.config, self.k, len(items)
        if max(len(ids) for _, ids, _ in items) > c.max_positions or max(cap for *_, cap in items) > c.max_positions:
            raise ValueError(f"a sentence longer than the model takes ({c.max_positions} positions)")
        src = padded([ids for _, ids, _ in items], c.pad_id)  # (n, S)
        memory, src_mask = encode_by_length(self.decoder, src)  # (n, S, D), (n, 1, 1, S)
        theirs = self.decoder.start_cache(memory, src_mask, group=k, capacity=1)  # their encoder-decoder keys/values
        cap = max(cap for *_, cap in items)
        if self.cache is None:  # the first sentences: a buffer with room for as many again (as the batch
            # takes at most), and for longer ones
            rows = min(2 * n, self.slots) * k
            self.cache = theirs
            self.cache.at_own_positions()
            self.cache.resize(rows, 2 * cap)
            self.free_slots = list(range(n * k, rows))
        else:
            self._make_room(n * k, cap)
            slots, self.free_slots = self.free_slots[: n * k], self.free_slots[n * k:]
            self.cache.join(theirs, torch.tensor(slots))
        start = torch.full((n, k), -1e9)
        start[:, 0] = 0.0  # all beams start equal: expand only the first
        self.tokens = torch.cat([self.tokens, torch.full((n * k,), c.decoder_start_id, dtype=torch.long)])
        self.run_scores = torch.cat([self.run_scores, start])
        self.pool_scores = torch.cat([self.pool_scores, torch.full((n, k), float("-inf"))])
        self.pool_ref = torch.cat([self.pool_ref, torch.zeros(n, k, dtype=torch.long)])
        self.max_len = torch.cat([self.max_len, torch.tensor([cap for *_, cap in items])])
        self.own_steps = torch.cat([self.own_steps, torch.zeros(n, dtype=torch.long)])
        for (key, ids, cap), wanted in zip(items, n_best or [k] * n):
            self.wanted.append(wanted)
            self.key.append(key)
            self.ids.append(ids)
            self.joined.append(self.steps)
            self.cap.append(cap)
        self.where = {key: i for i, key in enumerate(self.key)}
        if self.shortlist is not None:
            self._shortlist([ids for _, ids, _ in items])

    def _make_room(self, rows: int, cap: int) -> None:
        """Free slots for `rows` more rows, and positions for a new sentence of `cap` new tokens:
        the buffer grows, by half at least (each growth copies it)."""
        cache = self.cache
        slots = cache.self_kv.size(0)
        if len(self.free_slots) < rows or cap > cache.capacity:
            grown = slots if len(self.free_slots) >= rows else max(min(2 * slots, self.slots * self.k),
                                                                    slots - len(self.free_slots) + rows)
            cache.resize(grown, cache.capacity if cap <= cache.capacity else max(cap, cache.capacity * 3 // 2))
            self.free_slots += range(slots, grown)

    def _shortlist(self, joining: list[list[int]]) -> None:
        """The logits' columns: the target pieces any running sentence may write (a mask over the
        target vocabulary). Joining sentences add theirs; the set is computed anew (dropping the
        pieces of sentences gone) once half the sentences it was computed for have left."""
        c = self.config
        if self.columns is None or self.left >= max(4, len(self.key) // 2):
            self.chosen, self.left, joining = torch.zeros(c.tgt_vocab_size, dtype=torch.bool), 0, self.ids
        self.shortlist.mark(joining, self.chosen, always=[c.eos_id])
        columns = self.chosen.nonzero()[:, 0]
        if self.columns is not None and torch.equal(columns, self.columns):
            return
        self.columns, self.view = columns, self.decoder.shortlisted(columns)
        pad_col, self.eos_col = columns_of(columns, (c.pad_id, c.eos_id))
        self.banned = (pad_col,) if pad_col >= 0 else ()

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """One step of every running sentence; returns those that finished, with their hypotheses
        (best first, as many as each wants)."""
        if not self.key:
            return []
        B, k, t = len(self.key), self.k, self.steps
        logits, attn = self.view.decode_step(self.tokens, self.cache, need_weights=self.attention)  # (N, V')
        chosen, any_done, in_place = self.select_fn(logits, self.run_scores, self.pool_scores, self.pool_ref,
                                                    self.max_len, t, self.banned, self.eos_col, self.length_penalty,
                                                    steps=self.own_steps)
        cand_tok, tokens = chosen.cand_tok, chosen.tokens
        if self.columns is not None:  # column -> target id
            cand_tok, tokens = self.columns[cand_tok], self.columns[tokens]
        self.history[t] = (self.where, chosen.cand_scores.tolist(), chosen.cand_row.tolist(), cand_tok.tolist(),
                           chosen.keep.tolist())
        if attn is not None:  # (L, N, H, S) -> (B, k, L, H, S)
            self.attention_of[t] = attn.transpose(0, 1).reshape(B, k, attn.size(0), *attn.shape[2:])
        self.steps += 1
        self.tokens, self.run_scores = tokens, chosen.run_scores
        self.pool_scores, self.pool_ref, self.own_steps = chosen.pool_scores, chosen.pool_ref, self.own_steps + 1
        finished = []
        if any_done:
            done = chosen.done.nonzero()[:, 0].tolist()
            scores, refs = self.pool_scores[done].tolist(), self.pool_ref[done].tolist()
            for i, pool_scores, pool_ref in zip(done, scores, refs):
                finished.append((self.key[i], self.read_back(i, pool_scores, pool_ref)))
            self._leave(done, chosen.parents)
        elif not in_place:
            self.cache.reorder((torch.arange(B)[:, None] * k + chosen.parents).view(-1))
        self._forget()
        return finished

    def read_back(self, i: int, pool_scores: list[float], pool_ref: list[int]) -> list[Hypothesis]:
        """Sentence i's pool, done at this step, as its best hypotheses, each followed back to the
        step the sentence joined at; with attention, each one's along its beams (L, H, T, source length)."""
        key, first, n_cand, S = self.key[i], self.joined[i], 2 * self.k, len(self.ids[i])
        hypotheses = []
        for score, ref in list(zip(pool_scores, pool_ref))[: self.wanted[i]]:
            if score == float("-inf"):
                break  # fewer hypotheses than beams (tiny vocabularies)
            h, beams = hypothesis_at(self.history, key, *divmod(ref, n_cand), score, self.config.eos_id, first)
            if self.attention:
                along = [self.attention_of[s][place, beam, :, :, :S] for s, place, beam in reversed(beams)]
                h.attention = torch.stack(along, 2).float()  # (L, H, T, S)
            hypotheses.append(h)
        return hypotheses

    def drop(self, keys: set[Hashable]) -> None:
        """Sentences nobody waits for any more leave now, unfinished."""
        gone = [i for i, key in enumerate(self.key) if key in keys]
        if gone:
            self._leave(gone, torch.arange(self.k).expand(len(self.key), -1))
            self._forget()

    def _leave(self, gone: list[int], parents: Tensor) -> None:
        """Sentences `gone` (places) out of the batch, their slots free; the others' beams
        continue `parents` (B, k)."""
        B, k = len(self.key), self.k
        leaving = set(gone)
        kept = [i for i in range(B) if i not in leaving]
        self.left += len(gone)
        self.free_slots += self.cache.slot.view(B, k)[gone].flatten().tolist()
        alive = torch.tensor(kept, dtype=torch.long)
        self.cache.reorder((alive[:, None] * k + parents[alive]).view(-1), sources=alive)
        self.tokens = self.tokens.view(B, k)[alive].view(-1)
        self.run_scores, self.pool_scores, self.pool_ref = (x[alive] for x in (self.run_scores, self.pool_scores,
                                                                                self.pool_ref))
        self.max_len, self.own_steps = self.max_len[alive], self.own_steps[alive]
        for name in ("key", "ids", "joined", "cap", "wanted"):
            setattr(self, name, [getattr(self, name)[i] for i in kept])
        self.where = {key: i for i, key in enumerate(self.key)}
        if not self.key:  # the next sentences start a cache of their own size
            self.cache, self.free_slots, self.columns = None, [], None
        else:  # no more source positions than the longest source left
            self.cache.cut_sources(max(len(ids) for ids in self.ids))

    def _forget(self) -> None:
        """The history before the oldest running sentence joined: nobody reads it any more."""
        first = min(self.joined, default=self.steps)
        for s in [s for s in self.history if s < first]:
            del self.history[s]
            self.attention_of.pop(s, None)

    def close(self) -> None:
        """Nothing to give back: its buffers go with it."""
        self.cache = None


@dataclass(frozen=True)
class Shape:
    """What sentences must share to run in one running batch: how they are searched, and a size."""

    beam_size: int
    length_penalty: float
    attention: bool  # whether the batch records the attention (a sentence's text pipeline or its client asks)
    source_len: int  # source positions, rounded up (graphs.round_up_length)
    capacity: int  # new tokens at most, for the longest source of the batch


# an eager batch's cache keeps room for twice its sentences at twice their length (it grows by
# copying): the budget counts each sentence in it as that many times its own buffers
EAGER_ROOM = 4


def default_running_bytes(device: torch.device) -> int:
    """The running batches' default budget: a quarter of the GPU's memory, or 2 GiB on a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 4
    return 2 << 30


@dataclass
class _Sentence:
    tag: Hashable
    shape: Shape
    ids: list[int]
    cap: int  # most new tokens, EOS included
    n_best: int
    attention: bool  # its client asked for the attention itself, not only its mean
    added: int  # RunningBatches.steps when it was added
    number: int  # how many were added before it
    nbytes: int = 0  # what the budget counts for it in an eager batch


class RunningBatches:
    """A Translator's sentences decoded in running batches, one per Shape: a sentence waits for a
    free slot in its shape's batch and joins it at a step boundary; `step` advances every batch by
    one step and returns the sentences that finished, each as soon as it is done, as
    model/pipeline.Decoded (what a worker sends back). The search is the Translator's graphed one
    (a CUDA graph per step on a GPU; on a CPU the same step eagerly, the twin the tests read).

        batches = RunningBatches(translator, slots=64)
        batches.add(("job 7", 0), ids, options)            # any time, from any request
        while batches.busy:
            for tag, hypotheses in batches.step():          # (tag, list[Decoded] | Exception)
                ...

    Options a running batch cannot take (`takes`: a minimum length, a repetition penalty) are
    for Translator.decode_all.

    Every shape has a batch of its own, and clients choose the shapes (beam size, length penalty,
    lengths): the batches together keep within `max_bytes` of buffers. A fixed-shape batch takes
    its bucket's buffers when it starts (slots x beams x its lengths); an eager one grows as
    sentences join, each counted as EAGER_ROOM times its own buffers.
    Past the budget a shape waits for others to close, and so do the shapes whose sentences came
    after it (the oldest waiting sentence goes first, so a large shape is not starved by small
    ones); with nothing running, one batch starts whatever it needs.
    """

    def __init__(self, translator, slots: int = 64, fixed_shape: bool | None = None, join_group: int = 1,
                 join_wait: int = 0, max_bytes: int | None = None):
        """fixed_shape: RunningBatch over the graphed search's fixed-shape step (default on a GPU),
        else EagerRunningBatch over the model's own step (default on a CPU).

        Sentences join a batch that runs in groups: when `join_group` of them wait (or as many as
        it has free slots), or once `join_wait` steps ran without the first; a batch with nothing
        running takes them at once. An encoder call costs a fixed part (on a 2-core Xeon ~2.3 ms,
        against ~0.35 ms a sentence), which a group shares (`bench/running.py --join` measures
        it). The default, 1 and 0, joins every sentence at the next step.

        max_bytes: the running batches' buffers together (None: a quarter of the GPU's memory, or
        2 GiB on a CPU; 0: no limit)."""
        self.translator, self.slots = translator, slots
        self.max_bytes = default_running_bytes(translator.device) if max_bytes is None else max_bytes
        self._bucket_bytes: dict[tuple, int] = {}  # buffer bytes by (Bucket, attention), computed once
        self.join_group, self.join_wait = join_group, join_wait
        self.steps = 0
        self.fixed_shape = translator.device.type == "cuda" if fixed_shape is None else fixed_shape
        self.search = None
        if self.fixed_shape:
            self.search = translator.graphed_search or GraphedBeamSearch(translator.model, capture=False)
        self.batches: dict[Shape, RunningBatch] = {}
        self.waiting: dict[Shape, deque[_Sentence]] = {}
        self.sentences: dict[Hashable, _Sentence] = {}  # in a batch now, by tag
        self._numbers = itertools.count()  # the sentences' order of arrival

    @staticmethod
    def takes(options: DecodingOptions) -> bool:
        """Whether a running batch decodes as these options say (its step bans only PAD, and has
        no repetition penalty)."""
        return options.min_length == 0 and options.repetition_penalty == 1.0

    @property
    def busy(self) -> bool:
        return bool(self.sentences) or any(self.waiting.values())

    def add(self, tag: Hashable, ids: list[int], options: DecodingOptions, weights: bool = False) -> None:
        """A sentence (EOS-terminated source ids) to decode as `options` say; `weights`: its
        hypotheses carry their attention's mean (the text pipeline's repair or placement)."""
        if not self.takes(options):
            raise ValueError("a running batch has no minimum length and no repetition penalty: use decode_all")
        t = self.translator
        length_penalty = t.length_penalty if options.length_penalty is None else options.length_penalty
        source_len = capacity = 0  # an eager batch takes sentences of any length
        if self.fixed_shape:
            source_len = round_up_length(len(ids))
            capacity = round_up_length(t.length_cap(source_len, options.max_length))
        shape = Shape(options.beam_size, length_penalty, options.attention or weights, source_len, capacity)
        cap = t.length_cap(len(ids), options.max_length)
        nbytes = 0  # an eager batch's sentence: EAGER_ROOM times its own buffers (a fixed-shape batch counts its bucket)
        if not self.fixed_shape:
            nbytes = EAGER_ROOM * self.bucket_bytes(Bucket(1, shape.beam_size, len(ids), cap), shape.attention)
        sentence = _Sentence(tag, shape, ids, cap, options.n_best, options.attention, self.steps, next(self._numbers),
                             nbytes)
        self.waiting.setdefault(shape, deque()).append(sentence)

    def bucket_bytes(self, bucket: Bucket, attention: bool) -> int:
        """Bytes of a bucket's search buffers (SearchBuffers, measured on the meta device: nothing
        allocated), with its attention's when recorded."""
        found = self._bucket_bytes.get((bucket, attention))
        if found is None:
            weight = self.translator.model.tgt_embed.weight
            dtype = weight.dtype if weight.dtype.is_floating_point else torch.float32
            buffers = SearchBuffers(self.translator.model.config, bucket, dtype, torch.device("meta"))
            found = buffers.nbytes + (math.prod(buffers.attention_shape) * 4 if attention else 0)  # float32
            self._bucket_bytes[(bucket, attention)] = found
        return found

    def bytes_in_use(self) -> int:
        """What the running batches' buffers take now, as the budget counts them."""
        if self.fixed_shape:
            return sum(self._batch_bytes(shape) for shape in self.batches)
        return sum(s.nbytes for s in self.sentences.values())

    def _batch_bytes(self, shape: Shape) -> int:
        return self.bucket_bytes(Bucket(self.slots, shape.beam_size, shape.source_len, shape.capacity), shape.attention)

    def step(self) -> list[tuple[Hashable, list[Decoded] | Exception]]:
        """One step of every running batch, after the waiting sentences took the free slots; the
        sentences that finished (or whose batch failed: the exception)."""
        finished: list[tuple[Hashable, list[Decoded] | Exception]] = []
        # the shape whose waiting sentence is oldest joins first; once one waits for the budget, the
        # shapes after it wait too (what they would take is what it waits for)
        oldest_first = sorted(self.batches.keys() | self.waiting.keys(),
                              key=lambda shape: self.waiting[shape][0].number if self.waiting.get(shape) else -1)
        joins = True
        with inference_attention_backends(self.translator.device):  # the encoder's shapes change at every join
            for shape in oldest_first:
                done, joins = self._step(shape, joins)
                finished += done
        self.steps += 1
        return finished

    def _step(self, shape: Shape, joins: bool) -> tuple[list[tuple[Hashable, list[Decoded] | Exception]], bool]:
        """Sentences waiting for the batch of `shape` join it (if `joins` and the budget lets
        them), it runs one step; those finished, and whether the next shapes may join."""
        queue = self.waiting.get(shape, deque())
        try:
            batch = self.batches.get(shape)
            if batch is None:
                if not joins or (self.fixed_shape and self.sentences and self._batch_bytes(shape) > self._room()):
                    return [], False  # it waits, and the shapes after it (with nothing running, it starts)
                batch = self.batches[shape] = self._batch(shape)
            if joins and self._joins(batch, queue):
                joining = [queue[i] for i in range(min(batch.free, len(queue)))]
                if not self.fixed_shape:  # an eager batch: as many as the budget takes, in order
                    room, taken = self._room(), 0
                    while taken < len(joining) and (joining[taken].nbytes <= room or not (self.sentences or taken)):
                        room -= joining[taken].nbytes
                        taken += 1
                    joins, joining = taken == len(joining), joining[:taken]
                for _ in joining:
                    queue.popleft()
                if joining:
                    self.sentences.update((s.tag, s) for s in joining)
                    batch.admit([(s.tag, s.ids, s.cap) for s in joining], [s.n_best for s in joining])
            if not batch.running:  # nothing joined it: its buffers back, while its sentences (if any) wait
                self._close(shape, queue)
                return [], joins
            done = batch.step()
        except Exception as e:
            return self._fail(shape, e), joins
        finished = []
        for tag, hypotheses in done:
            sentence = self.sentences.pop(tag)
            finished.append((tag, [as_decoded(h, sentence.attention) for h in hypotheses[: sentence.n_best]]))
        if not batch.running and not queue:
            self._close(shape, queue)
        return finished, joins

    def _close(self, shape: Shape, queue: deque[_Sentence]) -> None:
        """The batch of `shape` ends, its buffers (and graphs) back to the search for the next; its
        queue goes too when empty."""
        self.batches.pop(shape).close()
        if not queue:
            self.waiting.pop(shape, None)

    def _room(self) -> float:
        """Bytes the budget has left now."""
        return self.max_bytes - self.bytes_in_use() if self.max_bytes else math.inf

    def _joins(self, batch: RunningBatch | EagerRunningBatch, queue: deque[_Sentence]) -> bool:
        """Whether the sentences waiting for `batch` join it at this step."""
        return bool(queue) and batch.free > 0 and (
            not batch.running or len(queue) >= min(self.join_group, batch.free)
            or self.steps - queue[0].added >= self.join_wait)

    def _batch(self, shape: Shape) -> RunningBatch | EagerRunningBatch:
        if self.fixed_shape:
            return RunningBatch(self.search, self.slots, shape.beam_size, shape.source_len, shape.capacity,
                                shape.length_penalty, shape.attention)
        t = self.translator
        return EagerRunningBatch(t.decoder, self.slots, shape.beam_size, shape.length_penalty, shape.attention,
                                 t.shortlist, t.select_fn)

    def cancel(self, tags: set[Hashable]) -> None:
        """Sentences nobody waits for any more: out of the queues and of their batches' slots."""
        for shape, queue in self.waiting.items():
            self.waiting[shape] = deque(s for s in queue if s.tag not in tags)
        for batch in self.batches.values():
            batch.drop(tags)
        for tag in tags:
            self.sentences.pop(tag, None)

    def _fail(self, shape: Shape, error: Exception) -> list[tuple[Hashable, Exception]]:
        """A batch that raised: its sentences and those waiting for it fail; its buffers are dropped."""
        self.batches.pop(shape, None)
        failed = [s.tag for s in self.sentences.values() if s.shape == shape]
        failed += [s.tag for s in self.waiting.pop(shape, ())]
        for tag in failed:
            self.sentences.pop(tag, None)
        return [(tag, error) for tag in failed]
