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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from model.graphs import Bucket, GraphedBeamSearch, round_up_length, round_up_sentences
from model.options import DecodingOptions
from model.pipeline import Decoded
from model.search import Hypothesis
from model.translator import as_decoded


class RunningBatch:
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

    @property
    def free(self) -> int:
        return self.key.count(None)

    @property
    def running(self) -> int:
        return len(self.key) - self.free

    @torch.inference_mode()
    def admit(self, items: list[tuple[Hashable, list[int], int]]) -> None:
        """Sentences (key, EOS-terminated source ids, most new tokens) into free slots, encoded now."""
        if len(items) > self.free:
            raise ValueError(f"{len(items)} sentences for {self.free} free slots")
        if not items:
            return
        c, b, k, model = self.search.config, self.buf, self.k, self.search.model
        S = max(len(ids) for _, ids, _ in items)
        if self.bucket.source_len < S or max(cap for *_, cap in items) > self.bucket.capacity:
            raise ValueError(f"a sentence longer than this batch takes ({self.bucket.source_len} source tokens, "
                             f"{self.bucket.capacity} new ones)")
        device = b.tokens.device
        src = torch.full((len(items), S), c.pad_id, dtype=torch.long)
        for i, (_, ids, _) in enumerate(items):
            src[i, : len(ids)] = torch.tensor(ids)
        memory, src_mask = model.encode(src.to(device))  # (n, S, D), (n, 1, 1, S)
        slots = [j for j, key in enumerate(self.key) if key is None][: len(items)]
        at = torch.tensor(slots, device=device)  # (n,)
        for i, layer in enumerate(model.decoder_layers):
            keys, values = layer.cross_attn.memory_kv(memory)  # 2 x (n, H, S, Dh)
            b.cross_kv[i, 0, at, :, :S] = keys
            b.cross_kv[i, 1, at, :, :S] = values
        bias = torch.zeros(len(items), 1, 1, self.bucket.source_len, dtype=b.src_bias.dtype, device=device)
        bias[..., :S].masked_fill_(~src_mask, float("-inf"))
        bias[..., S:] = float("-inf")
        b.src_bias[at] = bias
        rows = (at[:, None] * k + torch.arange(k, device=device)).view(-1)  # (n * k,)
        b.position[rows] = 0
        b.tokens[rows] = c.decoder_start_id
        start = torch.full((k,), -1e9, device=device)
        start[0] = 0.0  # all beams start equal: expand only the first
        b.run_scores[at] = start
        b.pool_scores[at] = float("-inf")
        b.pool_ref[at] = 0
        b.max_len[at] = torch.tensor([cap for *_, cap in items], device=device)
        b.t[at] = 0
        b.live[at] = True
        for j, (key, ids, _) in zip(slots, items):
            self.key[j], self.joined[j], self.source_len[j] = key, self.steps, len(ids)

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """One step of every running sentence; returns those that finished, with their hypotheses
        (best first, all beam_size of them), and frees their slots."""
        if not self.running:
            return []
        b, k = self.buf, self.k
        b.run(self.search.model, self.attention, self.banned, self.search.config.eos_id)
        self.steps += 1
        any_done, in_place = b.flags.tolist()  # the step's one host sync
        finished = []
        if any_done:
            done = (b.done & b.live).nonzero()[:, 0].tolist()
            # the finished sentences' history and pools on the host in one copy each, not one per sentence
            host = [h[:, done].cpu() for h in (b.cand_scores, b.cand_row, b.cand_tok, b.keep)]
            pools = b.pool_scores[done].tolist(), b.pool_ref[done].tolist()
            for n, j in enumerate(done):
                finished.append((self.key[j], self.read_back(j, [h[:, n] for h in host], pools[0][n], pools[1][n])))
                self.key[j] = None
            b.live[done] = False
        if not in_place:
            parents = torch.where(b.live[:, None], b.parents, b.own_rows[:k])  # (Bb, k); a free slot keeps its rows
            longest = max((self.steps - self.joined[j] for j, key in enumerate(self.key) if key is not None), default=0)
            b.reorder((b.first_row + parents).view(-1), longest)
        return finished

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


@dataclass(frozen=True)
class Shape:
    """What sentences must share to run in one running batch: how they are searched, and a size."""

    beam_size: int
    length_penalty: float
    attention: bool  # whether the batch records the attention (a sentence's text pipeline or its client asks)
    source_len: int  # source positions, rounded up (graphs.round_up_length)
    capacity: int  # new tokens at most, for the longest source of the batch


@dataclass
class _Sentence:
    tag: Hashable
    shape: Shape
    ids: list[int]
    cap: int  # most new tokens, EOS included
    n_best: int
    attention: bool  # its client asked for the attention itself, not only its mean


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
    """

    def __init__(self, translator, slots: int = 64):
        self.translator, self.slots = translator, slots
        self.search = translator.graphed_search or GraphedBeamSearch(translator.model, capture=False)
        self.batches: dict[Shape, RunningBatch] = {}
        self.waiting: dict[Shape, deque[_Sentence]] = {}
        self.sentences: dict[Hashable, _Sentence] = {}  # in a batch now, by tag

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
        source_len = round_up_length(len(ids))
        capacity = round_up_length(t.length_cap(source_len, options.max_length))
        shape = Shape(options.beam_size, length_penalty, options.attention or weights, source_len, capacity)
        sentence = _Sentence(tag, shape, ids, t.length_cap(len(ids), options.max_length), options.n_best,
                             options.attention)
        self.waiting.setdefault(shape, deque()).append(sentence)

    def step(self) -> list[tuple[Hashable, list[Decoded] | Exception]]:
        """One step of every running batch, after the waiting sentences took the free slots; the
        sentences that finished (or whose batch failed: the exception)."""
        finished: list[tuple[Hashable, list[Decoded] | Exception]] = []
        for shape in list(self.batches.keys() | self.waiting.keys()):
            queue = self.waiting.get(shape, deque())
            try:
                batch = self.batches.get(shape)
                if batch is None:
                    batch = self.batches[shape] = RunningBatch(
                        self.search, self.slots, shape.beam_size, shape.source_len, shape.capacity,
                        shape.length_penalty, shape.attention)
                joining = [queue.popleft() for _ in range(min(batch.free, len(queue)))]
                self.sentences.update((s.tag, s) for s in joining)
                batch.admit([(s.tag, s.ids, s.cap) for s in joining])
                done = batch.step()
            except Exception as e:
                finished += self._fail(shape, e)
                continue
            for tag, hypotheses in done:
                sentence = self.sentences.pop(tag)
                finished.append((tag, [as_decoded(h, sentence.attention) for h in hypotheses[: sentence.n_best]]))
            if not batch.running and not queue:  # its buffers (and graphs) back to the search, for the next
                batch.close()
                del self.batches[shape]
                self.waiting.pop(shape, None)
        return finished

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
