"""Dynamic batching: which items run together, and when.

A request becomes a Job of items (one per text). Items wait in one FIFO per BatchKey (the model
and every decoding option, because only items decoded the same way can share a beam search).
When a worker slot is free, a key that holds a full token budget, or whose oldest item has
waited long enough (on an idle server not at all, while a batch runs max_wait), starts a batch;
with a hold (off by default), right after a batch of a closed loop of clients ends, not before as
many new items came as it answered or the hold passed (its clients' next requests: `_end_batch`).
A batch starts from the oldest item of the job whose client has the fewest items in batches in
flight (counting the batch that just ended), and among those of the job that has had the fewest
items in batches so far (of all ready keys), and takes the items closest to it in length (where it
starts a job, none of another job too long for one batch), up to the budget and, where the queue
is short, to its share of it (`share_among` workers: with two, a batch takes at most half of a
queue of up to 8 items). With one text a request from one client that is the oldest item. A
client that sends many requests at once does not hold back another client's request behind all
of them: that one starts the next batch. A request of many texts (a file's sentences, a catalog)
has its first batch at once and then goes on filling batches, but a request that comes after it
starts the next batch instead of waiting for all of it; where asked (long_job_items), its batches
are short, so that such a request waits for a short batch to end. So one job's items may run in
several batches, even on several workers at once, and each result is put back at its item's
index: a job resolves with its own results, in order.
A batch that fails is retried request by request, so one bad input fails only its own request.

The scheduler knows nothing of models or processes: it awaits `run_batch(key, sources, weights,
deliver)`, which must return one result per source, and may hand a source's result to
`deliver(index, result)` before (a worker with running batches answers each sentence when it is
done: its request need not wait for the rest of its batch). Tested alone with a fake run_batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from model.options import DecodingOptions

# a queue of up to this many items a worker is shared among the workers (Scheduler._dispatch)
SHARED_QUEUE = 4
# a job none of whose items went into a batch for this long starts the next batch, as a job not yet
# started would (Scheduler._first): under a load that never lets up, no job waits for ever
PATIENCE_S = 1.0
# a batch answering fewer items is no closed loop worth a hold (Scheduler._end_batch): a few
# clients alone gain little from sharing a batch and never wait for each other
CLOSED_LOOP_ITEMS = 8


@dataclass(frozen=True)
class BatchKey:
    """What items must share to be decoded in one batch: the model, and how to decode."""

    model: str
    options: DecodingOptions = DecodingOptions()

    def decoded(self, **changes) -> BatchKey:
        """This key with some decoding options changed."""
        return BatchKey(self.model, replace(self.options, **changes))


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


class Job:
    """One request's items; `future` resolves to their results in order, or to the batch's error."""

    def __init__(self, key: BatchKey, sources: list[list[int]], weights: list[bool] | None = None, client: str = ""):
        self.key, self.sources, self.client = key, sources, client  # client: who sent it (an address)
        self.tokens = sum(map(len, sources))  # source tokens, all items
        self.weights = weights or [False] * len(sources)  # whose attention weights the text pipeline reads
        self.results: list[Any] = [None] * len(sources)
        self.remaining = len(sources)
        self.future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.arrived = time.monotonic()
        self.dispatched = 0  # its items taken into batches so far
        self.last_taken = self.arrived  # when the last of them was taken (or it arrived)
        self.started: float | None = None  # when its first batch began
        self.finished: float | None = None

    @property
    def done(self) -> bool:
        return self.future.done()

    def deliver(self, index: int, result: Any) -> None:
        if self.done or self.results[index] is not None:  # cancelled or failed meanwhile, or delivered
            return
        self.results[index] = result
        self.remaining -= 1
        if not self.remaining:
            self.finished = time.monotonic()
            self.future.set_result(self.results)

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.finished = time.monotonic()
            self.future.set_exception(error)


@dataclass
class _Item:
    job: Job
    index: int
    cost: int  # source tokens x beams

    @property
    def length(self) -> int:
        return len(self.job.sources[self.index])


def closed_loop(levels: deque[int], level: int, answered: int) -> bool:
    """Whether the batch that just ended, with `level` items queued or in flight at its end and
    `answered` items of requests it completed, looks like a closed loop of clients: at least 8
    answered, and the level the same as at the batch before and as high as at any of `levels` (the
    last batches' ends). A closed loop keeps its clients' count; requests arriving at random come
    and go in number, and rarely match their highest twice in a row."""
    return answered >= CLOSED_LOOP_ITEMS and bool(levels) and level == levels[-1] >= max(levels)


class Scheduler:
    def __init__(self, run_batch: Callable[..., Awaitable[list[Any]]], slots: int,
                 batch_tokens: int, max_wait_s: float, max_queue_items: int = 1 << 30,
                 on_batch: Callable[[BatchKey, int, int], None] | None = None, cancel_in_flight: bool = False,
                 share_among: int = 1, long_job_items: int = 0, hold_s: float = 0.0):
        """cancel_in_flight: a batch whose every request is gone is cancelled while it runs (its
        run_batch task; a worker with running batches then drops it), not only before.
        share_among: a batch takes at most 1/share_among of its key's queue (rounded up), as it
        stood when the batch's worker freed (see _dispatch). long_job_items: a job too long for one
        batch (its source tokens x beams over the budget) runs in batches of at most this many
        items, and none of its items goes in a batch that another job starts (0: no limit, and
        such items may fill another job's batch), so that a request sent while it runs waits for a
        short batch to end, and runs in a batch of its own kind. hold_s: the longest the next batch
        waits after a batch ends for as many new items as that batch answered (`_end_batch`), with
        one slot only."""
        self.run_batch, self.slots, self.cancel_in_flight = run_batch, slots, cancel_in_flight
        self.share_among, self.long_job_items = share_among, long_job_items
        self.batch_tokens, self.max_wait_s, self.max_queue_items = batch_tokens, max_wait_s, max_queue_items
        # with several slots batches overlap, and a free slot takes what queued while another runs:
        # holding it only delays that (bench/batch_hold.py --workers 2: 7% fewer sentences/s at 256 clients)
        self.hold_s = hold_s if slots == 1 else 0.0
        self.on_batch = on_batch  # (key, items, padded tokens) of every batch started
        self.queues: dict[BatchKey, deque[_Item]] = {}
        self.queued_cost: dict[BatchKey, int] = {}
        self.queued = 0
        self.in_flight = 0
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None
        self._running: dict[asyncio.Task, list[_Item]] = {}  # batches in flight
        self.client_in_flight: Counter[str] = Counter()  # items in batches in flight, by client
        # the hold (_end_batch): items submitted so far; the count the next batch waits for and until
        # when; items queued or in flight at the last batches' ends; since when the last batch's
        # clients are awaited (None: all back), and how long they took to come back the last time
        self.arrivals = 0
        self._awaited, self._hold_until = 0, 0.0
        self._levels: deque[int] = deque(maxlen=16)
        self._since_end: float | None = None
        self._return_s = float("inf")

    def submit(self, key: BatchKey, sources: list[list[int]], weights: list[bool] | None = None,
               client: str = "") -> Job:
        """Queue a request's sources (token ids); `weights`: per source, whether its hypotheses
        must come with their attention weights (model/pipeline.py: a repair or a placement);
        `client`: who sent it (the batches start from the client with the fewest items in flight)."""
        if self._closing:
            raise ShuttingDown("the server is shutting down")
        if self.queued + len(sources) > self.max_queue_items:
            raise QueueFull(f"{self.queued} items are waiting (limit {self.max_queue_items}); retry later")
        job = Job(key, sources, weights, client)
        queue = self.queues.setdefault(key, deque())
        for i, s in enumerate(sources):
            item = _Item(job, i, len(s) * key.options.beam_size)
            queue.append(item)
            self.queued_cost[key] = self.queued_cost.get(key, 0) + item.cost
        self.queued += len(sources)
        self.arrivals += len(sources)
        if self._since_end is not None and self.arrivals >= self._awaited:  # the last batch's clients are back
            self._return_s, self._since_end = time.monotonic() - self._since_end, None
        self._wake.set()
        return job

    def cancel(self, job: Job) -> None:
        """Drop a job (deadline passed, client gone): its queued items are never computed; with
        cancel_in_flight, a batch in flight that no other job waits for stops too."""
        job.future.cancel()
        self._drop_queued(job)
        if self.cancel_in_flight:
            for task, batch in list(self._running.items()):
                if all(item.job.done for item in batch):
                    task.cancel()

    def _drop_queued(self, job: Job) -> None:
        queue = self.queues.get(job.key)
        if not queue:
            return
        kept = deque(item for item in queue if item.job is not job)
        self.queued -= len(queue) - len(kept)
        self.queued_cost[job.key] = sum(item.cost for item in kept)
        if kept:
            self.queues[job.key] = kept
        else:
            del self.queues[job.key], self.queued_cost[job.key]

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="scheduler")

    async def stop(self, timeout: float) -> None:
        """Run what is queued and in flight (for at most timeout seconds), then fail the rest."""
        self._closing = True
        self._wake.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
            for task in list(self._running):
                task.cancel()
            for queue in self.queues.values():
                for item in queue:
                    item.job.fail(ShuttingDown("the server shut down before this request ran"))
            self.queues.clear()
            self.queued_cost.clear()
            self.queued = 0

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            self._dispatch(now)
            if self._closing and not self.queues and not self.in_flight:
                return
            timeout = None
            if self.queues and self.in_flight < self.slots:
                oldest = min(q[0].job.arrived for q in self.queues.values())
                timeout = max(0.0, oldest + self._wait_s() - now, self._hold_until - now if self._hold(now) else 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _dispatch(self, now: float) -> None:
        """Launch batches while a slot is free and a key is ready, each with at most its share of
        the queue as it stood before this round (share_among).

        Where batching saves little (a CPU core translates a batch of 2-6 sentences in ~0.9 of
        their times one by one, and every sentence of a batch waits for all of it), a worker that
        frees while the other is busy does better to take half of a short queue and leave the rest
        to the other worker when it frees than to take all of it: under light load each sentence
        then waits for one or two others, not for everything that came in meanwhile. A long queue
        (load) still goes whole, and with one worker nothing changes."""
        shares: dict[BatchKey, int] = {}
        while self.in_flight < self.slots and (ready := self._ready_key(now)) is not None:
            key, first = ready
            share = shares.setdefault(key, self._share(len(self.queues[key])))
            self._launch(key, self._take(key, first, share, now))

    def _share(self, queued: int) -> int:
        """The most items one batch takes of a queue of `queued`: a short queue (up to
        SHARED_QUEUE items a worker) is shared among the workers, a longer one goes whole."""
        if queued > SHARED_QUEUE * self.share_among:
            return queued
        return -(-queued // self.share_among)

    def _wait_s(self) -> float:
        """How long an item waits for company: on an idle server not at all, while a batch runs up
        to max_wait. Under load the clients a batch answered send their next requests within a few
        milliseconds of each other; gathering them fills the next batch, where starting on the first
        few would leave the rest to wait for a whole batch more."""
        return self.max_wait_s if self.in_flight else 0.0

    def _hold(self, now: float) -> bool:
        """Whether the next batch waits for the requests of the batch that just ended (`_end_batch`)."""
        return now < self._hold_until and self.arrivals < self._awaited

    def _end_batch(self, batch: list[_Item], started: float, now: float) -> None:
        """A batch ended: whether the next one waits for its clients' next requests (the hold).

        Clients in a closed loop send their next request within a few milliseconds of their answer;
        a batch started at once runs with what queued meanwhile and leaves them to the one after,
        so that with one worker and 2n clients, batches of n alternate where one batch of 2n would
        cost a GPU about the same. So the next batch waits, for at most hold_s, until as many new
        items came as this batch answered, but only where that pays: in a closed loop
        (`closed_loop`; requests arriving at random would wait for nothing) whose clients came
        back last time within two thirds of a batch (slower, and a batch started at once runs
        while they come). Off by default (hold_s 0) until a GPU run measures it."""
        level = self.queued + sum(len(b) for b in self._running.values())  # this batch still counted
        items_of = Counter(item.job for item in batch)
        answered = sum(n for job, n in items_of.items() if job.remaining <= n)  # of the requests it completes
        closed = closed_loop(self._levels, level, answered)
        self._levels.append(level)
        if self._since_end is not None:  # the last batch's clients were not all back by now
            self._return_s = float("inf")
        quick = self._return_s < (now - started) * 2 / 3
        self._awaited, self._since_end = self.arrivals + answered, now
        self._hold_until = now + self.hold_s if closed and quick else 0.0

    def _ready_key(self, now: float) -> tuple[BatchKey, int] | None:
        """Among keys with a full budget or an item that has waited long enough (_wait_s) and no
        hold (_hold), the one whose first item (_first) ranks first, and that item's index in its
        queue."""
        best, best_rank, wait_s, hold = None, None, self._wait_s(), self._hold(now)
        for key, queue in self.queues.items():
            if (self._closing or self.queued_cost[key] >= self.batch_tokens
                    or (now - queue[0].job.arrived >= wait_s and not hold)):
                first = self._first(queue, now)
                rank = self._rank(queue[first].job, now)
                if best is None or rank < best_rank:
                    best, best_rank = (key, first), rank
        return best

    def _rank(self, job: Job, now: float) -> tuple[int, int, float]:
        """Which job a batch starts from: one of the client with the fewest items in batches in
        flight; then the one with the fewest items in batches so far (_progress); then the oldest."""
        return self.client_in_flight[job.client], self._progress(job, now), job.arrived

    @staticmethod
    def _progress(job: Job, now: float) -> int:
        """A job's items in batches so far; none for a job none of whose items went in for PATIENCE_S."""
        return 0 if now - job.last_taken >= PATIENCE_S else job.dispatched

    def _first(self, queue: deque[_Item], now: float) -> int:
        """The index of the item a batch of this queue starts from: the first item of the job that
        ranks first (_rank). The queue holds jobs in order of arrival, each job's items together
        and in order, so with single-text jobs this is the oldest item."""
        best, best_rank = 0, None
        for i, item in enumerate(queue):
            if best_rank is not None and item.job is queue[i - 1].job:
                continue  # the job's first item was ranked
            rank = self._rank(item.job, now)
            if best_rank is None or rank < best_rank:
                best, best_rank = i, rank
                if not rank[0] and not rank[1]:
                    break  # the oldest job not yet started (or waiting PATIENCE_S) of a client with nothing in
                    # flight: nothing ranks before it
        return best

    def _take(self, key: BatchKey, first: int, share: int, now: float) -> list[_Item]:
        """The item at `first` (_first: the oldest of the job least served so far, of a client with
        the fewest items in flight), then the items closest to it in length (earlier first among
        equals; where that job has had no batch yet, none of another job with more items queued
        than one batch holds), while items x longest source x beams fits the budget, up to `share`
        items.

        Every batch takes the first item of a job not yet started, or else of the job least far
        along (or waiting PATIENCE_S), so nothing starves, and a long job does not hold back the
        short ones behind it; similar lengths waste less on padding and on beams that run on after
        the rest of the batch has finished. With long_job_items, a job too long for one batch has
        short batches of its own (see __init__).
        """
        queue, budget = self.queues[key], self.batch_tokens // key.options.beam_size
        anchor = queue[first]
        # a batch that starts a job is not filled with the items of another job too long for one batch
        # (the batch of a text sent while a long job runs would take as long as one of that job's)
        others = [i for i in range(len(queue)) if i != first]
        if not self._progress(anchor.job, now):
            queued = Counter(id(item.job) for item in queue)
            fits = max(1, budget // anchor.length)
            others = [i for i in others if queue[i].job is anchor.job or queued[id(queue[i].job)] < fits]
        if self.long_job_items:  # a job too long for one batch runs in short batches of its own, to its end
            if anchor.job.tokens > budget:
                share = min(share, self.long_job_items)
            else:
                others = [i for i in others if queue[i].job.tokens <= budget]
        others.sort(key=lambda i: abs(queue[i].length - anchor.length))
        chosen, longest = [first], anchor.length
        for i in others:
            if len(chosen) == share:
                break
            new_longest = max(longest, queue[i].length)
            if (len(chosen) + 1) * new_longest > budget:
                if queue[i].length > longest:
                    continue  # a longer one does not fit; a shorter one further on may
                break  # (n + 1) x longest alone is over the budget: nothing more fits
            chosen.append(i)
            longest = new_longest
        taken = set(chosen)
        batch = [queue[i] for i in sorted(chosen)]
        for item in batch:
            item.job.dispatched += 1
            item.job.last_taken = now
            self.client_in_flight[item.job.client] += 1
        kept = deque(item for i, item in enumerate(queue) if i not in taken)
        self.queued -= len(batch)
        if kept:
            self.queues[key] = kept
            self.queued_cost[key] -= sum(item.cost for item in batch)
        else:
            del self.queues[key], self.queued_cost[key]
        return batch

    def _launch(self, key: BatchKey, batch: list[_Item]) -> None:
        self.in_flight += 1
        if self.on_batch:
            self.on_batch(key, len(batch), len(batch) * max(item.length for item in batch))
        task = asyncio.create_task(self._run(key, batch))
        self._running[task] = batch
        task.add_done_callback(lambda t: self._running.pop(t, None))

    async def _run(self, key: BatchKey, batch: list[_Item]) -> None:
        start = time.monotonic()
        for item in batch:
            if item.job.started is None:
                item.job.started = start
        try:
            results = await self._compute(key, batch, isolate=True)
        finally:
            self.in_flight -= 1
            now = time.monotonic()
            if self.hold_s:
                self._end_batch(batch, start, now)
            # the next batch goes now, before this one's results wake their requests (finishing and
            # answering them holds the event loop, ~0.5 ms a request, which the worker would spend idle),
            # and before this one's clients stop counting as in flight: they were served last, so
            # with one worker, too, another client's request starts the next batch
            self._dispatch(now)
            self._wake.set()
            for item in batch:
                self.client_in_flight[item.job.client] -= 1
                if not self.client_in_flight[item.job.client]:
                    del self.client_in_flight[item.job.client]
        self._deliver(batch, results)

    @staticmethod
    def _deliver(batch: list[_Item], results: list[Any] | None) -> None:
        if results is not None:
            for item, result in zip(batch, results):
                item.job.deliver(item.index, result)

    async def _compute(self, key: BatchKey, batch: list[_Item], isolate: bool) -> list[Any] | None:
        """The batch's results, or None when it failed: then its jobs are answered here (failed,
        or with `isolate` each request run alone once and answered)."""
        def deliver(i: int, result: Any) -> None:
            batch[i].job.deliver(batch[i].index, result)

        try:
            results = await self.run_batch(key, [item.job.sources[item.index] for item in batch],
                                           [item.job.weights[item.index] for item in batch], deliver)
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} sources")
            return results
        except Exception as e:
            jobs = [job for job in {id(item.job): item.job for item in batch}.values() if not job.done]
            if isolate and len(jobs) > 1:
                # One request's input may be what failed: run each request's items alone, once,
                # so that only the requests that fail on their own get the error.
                for job in jobs:
                    alone = [item for item in batch if item.job is job]
                    self._deliver(alone, await self._compute(key, alone, isolate=False))
                return None
            for job in jobs:  # the rest of a failed job is dropped, not computed
                job.fail(e)
                self._drop_queued(job)
            return None
