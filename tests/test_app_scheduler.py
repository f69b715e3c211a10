"""The batcher alone, with a fake translate function: no model, no processes."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.scheduler import SHARED_QUEUE, BatchKey, QueueFull, Scheduler, closed_loop
from model.options import DecodingOptions


def make_key(model: str, **options) -> BatchKey:
    return BatchKey(model, DecodingOptions(**options))


class FakeTranslate:
    """Echoes each source as (key, source); records every batch; can block or fail on demand."""

    def __init__(self, delay: float = 0.0):
        self.batches: list[tuple[BatchKey, list[list[int]]]] = []
        self.delay = delay
        self.gate: asyncio.Event | None = None

    async def __call__(self, key, sources, weights=None, deliver=None):
        self.batches.append((key, sources))
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay)
        if any(s[0] == 666 for s in sources):
            raise RuntimeError("bad batch")
        return [(key, s) for s in sources]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def sentence(i: int, length: int = 5) -> list[int]:
    return [i] * length


def one_gated_slot() -> tuple[FakeTranslate, Scheduler]:
    """A started scheduler with one worker slot, a budget of 2 items of 5 tokens x beam 4 and no
    wait, whose batches wait for fake.gate (call within the test's event loop)."""
    fake = FakeTranslate()
    fake.gate = asyncio.Event()
    scheduler = Scheduler(fake, slots=1, batch_tokens=40, max_wait_s=0.0)
    scheduler.start()
    return fake, scheduler


def test_items_split_across_batches_come_back_in_order():
    async def main():
        fake = FakeTranslate(delay=0.01)
        # budget 40 = 2 items of 5 tokens x beam 4: a 7-item job needs 4 batches
        scheduler = Scheduler(fake, slots=2, batch_tokens=40, max_wait_s=0.005)
        scheduler.start()
        key = make_key("en-de", beam_size=4)
        a = scheduler.submit(key, [sentence(i) for i in range(7)])
        b = scheduler.submit(key, [sentence(100 + i) for i in range(3)])
        ra, rb = await a.future, await b.future
        await scheduler.stop(1)
        return fake, ra, rb

    fake, ra, rb = run(main())
    assert [s for _, s in ra] == [sentence(i) for i in range(7)]
    assert [s for _, s in rb] == [sentence(100 + i) for i in range(3)]
    assert len(fake.batches) == 5 and all(len(s) <= 2 for _, s in fake.batches)
    # once a has a batch, b starts the second, with its own items only (a batch that starts a job
    # keeps to jobs as new); then a, and items of both requests mix
    assert fake.batches[1][1] == [sentence(100), sentence(101)]
    assert [sentence(4), sentence(102)] in [s for _, s in fake.batches]


def test_a_batch_is_the_oldest_item_and_the_items_closest_to_it_in_length():
    async def main():
        fake = FakeTranslate()
        scheduler = Scheduler(fake, slots=1, batch_tokens=40, max_wait_s=0.01)
        lengths = [10, 50, 11, 9, 48, 10]
        job = scheduler.submit(make_key("en-de", beam_size=1), [[i] * n for i, n in enumerate(lengths)])
        scheduler.start()  # everything is queued before the first batch forms
        result = await job.future
        await scheduler.stop(1)
        return fake, result, lengths

    fake, result, lengths = run(main())
    assert [len(s) for _, s in result] == lengths  # back in request order
    batches = [[len(s) for s in sources] for _, sources in fake.batches]
    assert batches == [[10, 11, 10], [50], [9], [48]]  # 4 x 11 > 40, so 9 waits for the next batch


def test_only_items_with_the_same_options_share_a_batch():
    async def main():
        fake = FakeTranslate()
        scheduler = Scheduler(fake, slots=1, batch_tokens=10_000, max_wait_s=0.02)
        scheduler.start()
        keys = [make_key("en-de"), make_key("en-de", beam_size=2), make_key("en-de", n_best=2),
                make_key("en-de", length_penalty=0.5), make_key("en-de", max_length=7),
                make_key("en-de", attention=True), make_key("de-en")]
        jobs = [(k, scheduler.submit(k, [sentence(10 * n + i) for i in range(3)]))
                for n, k in enumerate(keys * 2)]
        results = [(k, await job.future) for k, job in jobs]
        await scheduler.stop(1)
        return fake, keys, results

    fake, keys, results = run(main())
    for key, result in results:
        assert all(k == key for k, _ in result)  # each item decoded with its own request's options
    assert len(fake.batches) == len(keys)  # the two requests per key shared one batch
    for _, sources in fake.batches:
        assert len(sources) == 6


def test_an_item_starts_at_once_on_an_idle_server_and_waits_for_company_while_a_batch_runs():
    async def main():
        fake = FakeTranslate(delay=0.3)
        scheduler = Scheduler(fake, slots=2, batch_tokens=20, max_wait_s=0.1)
        scheduler.start()
        start = time.monotonic()
        running = scheduler.submit(make_key("en-de", beam_size=1), [sentence(1)])  # idle: starts now
        await asyncio.sleep(0.01)
        started_idle = len(fake.batches)
        lone = scheduler.submit(make_key("en-de", beam_size=1), [sentence(2)])  # a batch runs: waits
        await asyncio.sleep(0.05)
        company = scheduler.submit(make_key("en-de", beam_size=1), [sentence(3)])
        await lone.future
        waited = time.monotonic() - start
        full = scheduler.submit(make_key("en-de", beam_size=1), [sentence(i) for i in range(4)])
        await asyncio.sleep(0.01)
        started_full = [sources for _, sources in fake.batches][-1]
        await asyncio.gather(running.future, company.future, full.future)
        await scheduler.stop(1)
        return fake, started_idle, waited, started_full

    fake, started_idle, waited, started_full = run(main())
    assert started_idle == 1
    # the lone item waited max_wait and took the item that came meanwhile along
    assert [sources for _, sources in fake.batches][1] == [sentence(2), sentence(3)]
    assert 0.4 <= waited < 0.9  # 0.1 of waiting, then its 0.3 batch
    assert started_full == [sentence(i) for i in range(4)]  # at once


def test_a_cancelled_job_is_never_computed():
    async def main():
        fake = FakeTranslate()
        fake.gate = asyncio.Event()
        scheduler = Scheduler(fake, slots=1, batch_tokens=10_000, max_wait_s=0)
        scheduler.start()
        first = scheduler.submit(make_key("en-de"), [sentence(1)])
        await asyncio.sleep(0.02)  # first is now running, holding the only slot
        gone = scheduler.submit(make_key("en-de"), [sentence(2), sentence(3)])
        kept = scheduler.submit(make_key("en-de"), [sentence(4)])
        assert scheduler.queued == 3
        scheduler.cancel(gone)
        assert scheduler.queued == 1
        fake.gate.set()
        await first.future, await kept.future
        await scheduler.stop(1)
        return fake

    fake = run(main())
    computed = [s for _, sources in fake.batches for s in sources]
    assert sentence(2) not in computed and sentence(3) not in computed and sentence(4) in computed


def test_a_failed_batch_fails_only_its_jobs_and_drops_their_other_items():
    async def main():
        fake = FakeTranslate()
        scheduler = Scheduler(fake, slots=1, batch_tokens=20, max_wait_s=0)
        scheduler.start()
        bad = scheduler.submit(make_key("en-de", beam_size=1), [sentence(666)] * 4 + [sentence(5)] * 4)
        good = scheduler.submit(make_key("en-de", beam_size=2), [sentence(7)])
        with pytest.raises(RuntimeError, match="bad batch"):
            await bad.future
        result = await good.future
        await scheduler.stop(1)
        return fake, result

    fake, result = run(main())
    assert result == [(make_key("en-de", beam_size=2), sentence(7))]
    computed = [s for _, sources in fake.batches for s in sources]
    assert sentence(5) not in computed  # the rest of the failed job was dropped, not computed


def test_a_request_sharing_a_failed_batch_is_retried_alone_and_succeeds():
    async def main():
        fake = FakeTranslate()
        scheduler = Scheduler(fake, slots=1, batch_tokens=10_000, max_wait_s=0.02)
        scheduler.start()
        key = make_key("en-de")
        bad = scheduler.submit(key, [sentence(666)])
        good = scheduler.submit(key, [sentence(1), sentence(2)])
        with pytest.raises(RuntimeError, match="bad batch"):
            await bad.future
        result = await good.future
        await scheduler.stop(1)
        return fake, result

    fake, result = run(main())
    assert [s for _, s in result] == [sentence(1), sentence(2)]
    assert [len(sources) for _, sources in fake.batches] == [3, 1, 2]  # together, then each alone


def test_queue_full_and_drain_on_stop():
    async def main():
        fake = FakeTranslate()
        scheduler = Scheduler(fake, slots=1, batch_tokens=10_000, max_wait_s=5, max_queue_items=3)
        scheduler.start()
        job = scheduler.submit(make_key("en-de"), [sentence(1), sentence(2)])
        with pytest.raises(QueueFull):
            scheduler.submit(make_key("en-de"), [sentence(3), sentence(4)])
        await scheduler.stop(1)  # does not wait out max_wait: queued work runs now
        return job

    job = run(main())
    assert job.future.done() and len(job.future.result()) == 2


class EarlyAnswers:
    """A run_batch that answers its first source at once and the rest when `gate` opens, like a
    worker with running batches; it records whether it was cancelled."""

    def __init__(self):
        self.gate = asyncio.Event()
        self.cancelled = False

    async def __call__(self, key, sources, weights=None, deliver=None):
        deliver(0, ("early", sources[0]))
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return [("late", s) for s in sources]


def test_an_early_answer_resolves_its_request_before_its_batch_ends():
    async def main():
        fake = EarlyAnswers()
        scheduler = Scheduler(fake, slots=1, batch_tokens=10_000, max_wait_s=0.05)
        scheduler.start()
        key = make_key("en-de", beam_size=1)
        first, second = scheduler.submit(key, [sentence(1)]), scheduler.submit(key, [sentence(2), sentence(3)])
        done_first = await first.future  # the batch (both jobs) still runs
        assert not second.done
        fake.gate.set()
        return done_first, await second.future

    first, second = run(main())
    assert first == [("early", sentence(1))]
    assert second == [("late", sentence(2)), ("late", sentence(3))]  # the early one is not answered twice


@pytest.mark.parametrize("cancel_in_flight", [False, True])
def test_a_batch_whose_every_request_is_gone_is_cancelled_in_flight_when_asked(cancel_in_flight):
    async def main():
        fake = EarlyAnswers()
        scheduler = Scheduler(fake, slots=1, batch_tokens=10_000, max_wait_s=0.05, cancel_in_flight=cancel_in_flight)
        scheduler.start()
        key = make_key("en-de", beam_size=1)
        a, b = scheduler.submit(key, [sentence(1), sentence(2)]), scheduler.submit(key, [sentence(3)])
        await asyncio.sleep(0.02)  # both in one batch, in flight
        scheduler.cancel(a)
        await asyncio.sleep(0.02)
        still_running = not fake.cancelled  # b still waits for its answer
        scheduler.cancel(b)
        await asyncio.sleep(0.02)
        fake.gate.set()
        await scheduler.stop(1)
        return still_running, fake.cancelled, scheduler.in_flight

    still_running, cancelled, in_flight = run(main())
    assert still_running and cancelled == cancel_in_flight and in_flight == 0


def test_the_next_batch_goes_to_the_worker_before_the_finished_batch_wakes_its_requests():
    """Answering a batch's requests holds the event loop (~0.5 ms each): the queued batch must be
    on its way to the freed worker first, not wait behind them."""
    async def main():
        fake, scheduler = one_gated_slot()
        key = make_key("en-de", beam_size=4)
        first = scheduler.submit(key, [sentence(1), sentence(2)])
        await asyncio.sleep(0.01)  # the first batch runs
        second = scheduler.submit(key, [sentence(3)])  # queued behind it
        await asyncio.sleep(0.01)
        fake.gate.set()
        await first.future
        seen_by_the_first_request = len(fake.batches)
        await second.future
        await scheduler.stop(1)
        return seen_by_the_first_request

    assert run(main()) == 2  # the second batch had started when the first request resumed


@pytest.mark.parametrize("share_among", [1, 2])
def test_a_worker_that_frees_takes_its_share_of_a_short_queue_and_all_of_a_long_one(share_among):
    """Two workers, both busy; what waits meanwhile goes to the first that frees: all of it with
    share_among 1, half of a short queue with 2 (the other half to the other worker when it
    frees), and a queue longer than SHARED_QUEUE items a worker whole either way."""

    async def main():
        gates: list[asyncio.Event] = []

        async def translate(key, sources, weights=None, deliver=None):
            gates.append(gate := asyncio.Event())
            batches.append([s[0] for s in sources])
            await gate.wait()
            return [(key, s) for s in sources]

        async def free_the_oldest_worker():
            gates[sum(g.is_set() for g in gates)].set()  # batches end in the order they began
            await asyncio.sleep(0.02)

        batches: list[list[int]] = []
        scheduler = Scheduler(translate, slots=2, batch_tokens=10_000, max_wait_s=0, share_among=share_among)
        scheduler.start()
        key = make_key("en-de", beam_size=1)
        jobs = [scheduler.submit(key, [sentence(1)])]
        await asyncio.sleep(0.02)
        jobs.append(scheduler.submit(key, [sentence(2)]))
        await asyncio.sleep(0.02)  # both workers busy
        jobs.append(scheduler.submit(key, [sentence(10), sentence(11), sentence(12)]))
        await asyncio.sleep(0.02)
        await free_the_oldest_worker()
        await free_the_oldest_worker()
        long_queue = [sentence(100 + i) for i in range(2 * SHARED_QUEUE + 1)]
        jobs.append(scheduler.submit(key, long_queue))
        await asyncio.sleep(0.02)
        while not all(job.done for job in jobs):
            await free_the_oldest_worker()
        await scheduler.stop(1)
        return batches, [await job.future for job in jobs]

    batches, results = run(main())
    assert [s for _, s in results[2]] == [sentence(10), sentence(11), sentence(12)]  # in order
    if share_among == 1:
        assert batches[:4] == [[1], [2], [10, 11, 12], [100 + i for i in range(9)]]
    else:
        # 2 of the 3 to the worker that freed first, the third to the other one
        assert batches[:4] == [[1], [2], [10, 11], [12]]
        assert batches[4] == [100 + i for i in range(9)]  # 9 > 2 x SHARED_QUEUE: whole


@pytest.mark.parametrize("patience_s", [1.0, 0.0])
def test_a_request_of_many_texts_does_not_hold_back_the_requests_that_come_after_it(monkeypatch, patience_s):
    """A job of ten texts has its first batch; two single texts that arrive meanwhile go in the
    next batch, the two of them (the job least served so far goes first, with jobs as new), where
    oldest-first would leave them behind all ten; the ten come back in order. With a patience of
    0, every job counts as waiting too long, so the oldest goes first again."""
    import app.scheduler

    monkeypatch.setattr(app.scheduler, "PATIENCE_S", patience_s)

    async def main():
        fake, scheduler = one_gated_slot()
        key = make_key("en-de", beam_size=4)
        many = scheduler.submit(key, [sentence(i) for i in range(10)])
        await asyncio.sleep(0.01)  # its first batch runs
        singles = [scheduler.submit(key, [sentence(100)]), scheduler.submit(key, [sentence(200)])]
        await asyncio.sleep(0.01)
        fake.gate.set()
        results = [await job.future for job in [many, *singles]]
        await scheduler.stop(1)
        return [[s[0] for s in sources] for _, sources in fake.batches], results

    batches, results = run(main())
    assert [s for _, s in results[0]] == [sentence(i) for i in range(10)]
    assert [results[1][0][1], results[2][0][1]] == [sentence(100), sentence(200)]
    first_batch_of = {i: next(b for b, ids in enumerate(batches) if i in ids) for i in (100, 200)}
    if patience_s:
        assert batches == [[0, 1], [100, 200], [2, 3], [4, 5], [6, 7], [8, 9]], batches
    else:
        assert first_batch_of == {100: 5, 200: 5}, batches  # behind all ten


def test_a_request_decoded_another_way_does_not_wait_for_a_long_one_either():
    """The same across batch keys: a single text of another model starts the batch after the long
    request's first, though the long request's items are older."""

    async def main():
        fake, scheduler = one_gated_slot()
        many = scheduler.submit(make_key("en-de", beam_size=4), [sentence(i) for i in range(10)])
        await asyncio.sleep(0.01)
        single = scheduler.submit(make_key("de-en", beam_size=4), [sentence(100)])
        await asyncio.sleep(0.01)
        fake.gate.set()
        await many.future, await single.future
        await scheduler.stop(1)
        return [(key.model, [s[0] for s in sources]) for key, sources in fake.batches]

    assert run(main())[:3] == [("en-de", [0, 1]), ("de-en", [100]), ("en-de", [2, 3])]


def test_the_rest_of_a_short_request_split_by_the_budget_still_fills_the_next_batch():
    """Where a batch starts a request, only the items of requests too long for one batch are kept
    out of it: the one item of a three-text request left over by the budget goes in the next batch,
    beside the request that starts it, not after every newer request."""

    async def main():
        fake, scheduler = one_gated_slot()
        key = make_key("en-de", beam_size=4)
        jobs = [scheduler.submit(key, [sentence(1), sentence(2), sentence(3)]),
                scheduler.submit(key, [sentence(100)]), scheduler.submit(key, [sentence(200)])]
        await asyncio.sleep(0.01)
        fake.gate.set()
        for job in jobs:
            await job.future
        await scheduler.stop(1)
        return [[s[0] for s in sources] for _, sources in fake.batches]

    assert run(main()) == [[1, 2], [3, 100], [200]]


@pytest.mark.parametrize("long_job_items", [3, 0])
def test_a_request_too_long_for_one_batch_runs_in_short_batches_when_asked(long_job_items):
    """With long_job_items, a job too long for one batch runs in batches of at most that many items,
    to its end, and a single text sent meanwhile runs in a batch without them (it waits for a short
    batch to end and runs in a short one); with 0 the long job's batches are full and its last
    items, fewer than a batch holds, fill the single's batch."""

    async def main():
        fake = FakeTranslate()
        fake.gate = asyncio.Event()
        # a budget of 6 items of 5 tokens at beam 4
        scheduler = Scheduler(fake, slots=1, batch_tokens=120, max_wait_s=0.0, long_job_items=long_job_items)
        scheduler.start()
        key = make_key("en-de", beam_size=4)
        many = scheduler.submit(key, [sentence(i) for i in range(8)])
        await asyncio.sleep(0.01)  # its first batch runs: what is left of it fits one batch
        single = scheduler.submit(key, [sentence(100)])
        await asyncio.sleep(0.01)
        fake.gate.set()
        await many.future, await single.future
        await scheduler.stop(1)
        return [[s[0] for s in sources] for _, sources in fake.batches]

    batches = run(main())
    if long_job_items:
        assert batches == [[0, 1, 2], [100], [3, 4, 5], [6, 7]], batches
    else:
        assert batches == [[0, 1, 2, 3, 4, 5], [6, 7, 100]], batches


@pytest.mark.parametrize("clients", ["two", "one"])
def test_a_client_with_many_requests_does_not_hold_back_another_clients_request(clients):
    """Client a sends six single texts at once, client b one after them: b's starts the batch
    after a's first (a's items were in it), where with one client (or none told) it waits behind
    all six, each request as new as the others."""

    async def main():
        fake, scheduler = one_gated_slot()
        key = make_key("en-de", beam_size=4)
        many = [scheduler.submit(key, [sentence(i)], client="a") for i in range(6)]
        await asyncio.sleep(0.01)  # a's first batch runs
        single = scheduler.submit(key, [sentence(100)], client="b" if clients == "two" else "a")
        await asyncio.sleep(0.01)
        fake.gate.set()
        results = [await job.future for job in [*many, single]]
        await scheduler.stop(1)
        assert not scheduler.client_in_flight
        return [[s[0] for s in sources] for _, sources in fake.batches], results

    batches, results = run(main())
    assert [r[0][1] for r in results] == [sentence(i) for i in range(6)] + [sentence(100)]
    if clients == "two":
        assert batches == [[0, 1], [2, 100], [3, 4], [5]], batches
    else:
        assert batches == [[0, 1], [2, 3], [4, 5], [100]], batches


async def client_loop(scheduler: Scheduler, key: BatchKey, client: int, rounds: int, think_s: float,
                      start_s: float = 0.0) -> list[float]:
    """One client sending a text, and its next one think_s after each answer: each round's seconds."""
    if start_s:
        await asyncio.sleep(start_s)
    took = []
    for _ in range(rounds):
        sent = time.monotonic()
        await scheduler.submit(key, [sentence(client)], client=str(client)).future
        took.append(time.monotonic() - sent)
        await asyncio.sleep(think_s)
    return took


class TimedTranslate(FakeTranslate):
    """FakeTranslate that also records when each batch started and ended."""

    def __init__(self, delay: float):
        super().__init__(delay)
        self.times: list[tuple[float, float]] = []

    async def __call__(self, key, sources, weights=None, deliver=None):
        start = time.monotonic()
        results = await super().__call__(key, sources, weights, deliver)
        self.times.append((start, time.monotonic()))
        return results


def two_groups_of_eight(hold_s: float, think_s: float) -> tuple[list[int], list[tuple[float, float]]]:
    """A GPU's worker (one slot; a batch costs 30 ms whatever its size) and 16 clients, sending
    again think_s after each answer: 8 of 6 texts each, and 8 of 7 that start while the first 8's
    batch runs, so without a hold batches of 8 alternate. Each batch's size, start and end."""

    async def main():
        fake = TimedTranslate(delay=0.03)
        scheduler = Scheduler(fake, slots=1, batch_tokens=10_000, max_wait_s=0.0, hold_s=hold_s)
        scheduler.start()
        key = make_key("en-de", beam_size=4)
        await asyncio.gather(*(client_loop(scheduler, key, c, 6 if c < 8 else 7, think_s, 0.0 if c < 8 else 0.01)
                               for c in range(16)))
        await scheduler.stop(1)
        return [len(sources) for _, sources in fake.batches], fake.times

    return run(main())


@pytest.mark.parametrize("hold_s", [0.0, 0.2])
def test_with_a_hold_the_clients_a_batch_answered_go_in_the_next_batch_with_those_that_queued_meanwhile(hold_s):
    """Clients that come back 2 ms after their answers: with a hold, once two batches ended with
    the same 16 items queued or in flight (a closed loop) and the first batch's clients came back
    quickly, the next batch waits for the 8 just answered and holds all 16."""
    sizes, times = two_groups_of_eight(hold_s, think_s=0.002)
    if not hold_s:
        assert sizes == [8] * 13, sizes
        return
    # the last batch: the second 8's last texts; it waited out the hold for the first 8, who were done
    assert sizes == [8, 8, 16, 16, 16, 16, 16, 8], sizes
    waited = times[-1][0] - times[-2][1]
    assert hold_s - 0.02 <= waited < hold_s + 0.15, waited


def test_clients_that_come_back_slowly_are_not_held():
    """Clients that come back 25 ms after their answers, most of a 30 ms batch: waiting for them
    would cost more than the next batch, which runs meanwhile; batches of 8 alternate as without
    a hold."""
    sizes, _ = two_groups_of_eight(0.2, think_s=0.025)
    assert sizes == [8] * 13, sizes


def test_a_lone_client_is_not_held():
    """A batch of one answered request is no closed loop worth waiting for: the hold needs 8
    answered items, so a client alone never waits for it."""

    async def main():
        scheduler = Scheduler(FakeTranslate(delay=0.01), slots=1, batch_tokens=10_000, max_wait_s=0.0, hold_s=0.5)
        scheduler.start()
        took = await client_loop(scheduler, make_key("en-de"), 1, 5, 0.002)
        await scheduler.stop(1)
        return took

    took = run(main())
    assert max(took) < 0.25, took  # a held request would take hold_s (0.5 s) more


def test_a_closed_loop_keeps_its_count_where_random_arrivals_come_and_go():
    """What the hold takes for a closed loop of clients: the items queued or in flight at a batch's
    end as at the one before, and as high as at the last batches' ends, with 8 answered or more."""
    from collections import deque

    assert closed_loop(deque([64, 64, 64]), 64, answered=32)
    assert closed_loop(deque([60, 61, 64]), 64, answered=64)  # clients still coming back, then all in
    assert not closed_loop(deque(), 64, answered=32)  # the first batch: nothing to compare with
    assert not closed_loop(deque([12, 18, 9, 15]), 14, answered=12)  # random arrivals: the count moves
    assert not closed_loop(deque([12, 18, 9, 15]), 18, answered=12)  # as high as ever, once
    assert not closed_loop(deque([12, 18, 9, 15]), 15, answered=12)  # twice the same, below the highest
    assert not closed_loop(deque([4, 4, 4]), 4, answered=4)  # a few clients alone


def test_the_hold_is_for_one_worker_slot():
    """With several slots batches overlap, and a free slot takes what queued while another runs."""

    async def main():
        return [Scheduler(FakeTranslate(), slots=n, batch_tokens=100, max_wait_s=0.0, hold_s=0.01).hold_s
                for n in (1, 2)]

    assert run(main()) == [0.01, 0.0]
