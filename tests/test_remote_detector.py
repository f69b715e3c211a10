"""app/language.py RemoteDetector: an HTTP process's view of the engine process's language
detector (the real pair runs in tests/test_app_http_processes.py). It blocks, so it must be called
from a thread: on the event loop it would wait for itself; an engine that does not answer is a
DetectionUnavailable (a 503), not a hung request. And the engine process is not ready while its
detector loads, or after it failed to load."""

import asyncio

import pytest

from app.language import DetectionUnavailable, RemoteDetector

FOUND = [("de", 90.0), ("en", 6.0), ("nl", 3.0), ("fr", 1.0)]


def run(ask, call, timeout_s=5.0):
    """call(detector) in a thread while the event loop that `ask` runs on is running."""
    async def main():
        detector = RemoteDetector(ask, asyncio.get_running_loop(), timeout_s)
        return await asyncio.to_thread(call, detector)
    return asyncio.run(main())


def test_answers_come_from_the_engine_trimmed_to_the_candidates_asked():
    asked = []

    async def ask(texts):
        asked.append(texts)
        return [list(FOUND) if any(c.isalpha() for c in t) else [] for t in texts]

    assert run(ask, lambda d: d.detect_all(["Haus", "12"])) == [FOUND[:3], []]
    assert run(ask, lambda d: d.detect("Haus", candidates=None)) == FOUND
    assert run(ask, lambda d: d.choose("Haus", ["en", "de"])) == ("de", 90.0, FOUND[:3])
    assert run(ask, lambda d: d.detect_all(["12", "..."])) == [[], []]  # nothing to ask
    assert asked == [["Haus", "12"], ["Haus"], ["Haus"]]


def test_on_the_event_loop_it_refuses_instead_of_waiting_for_itself():
    async def ask(texts):
        return [list(FOUND) for _ in texts]

    async def main():
        return RemoteDetector(ask, asyncio.get_running_loop(), 5.0).detect("Haus")

    with pytest.raises(RuntimeError, match="from a thread"):
        asyncio.run(main())


def test_an_engine_that_does_not_answer_is_unavailable_not_a_hang():
    async def silent(texts):
        await asyncio.sleep(60)

    async def gone(texts):
        raise DetectionUnavailable("the engine process went away before it detected the language")

    with pytest.raises(DetectionUnavailable, match="within 0.2 s"):
        run(silent, lambda d: d.detect("Haus"), timeout_s=0.2)
    with pytest.raises(DetectionUnavailable, match="went away"):
        run(gone, lambda d: d.detect("Haus"))


def test_the_engine_is_not_ready_while_its_detector_loads_or_after_it_failed():
    from app.engine import EngineStatus, with_detector

    ready = EngineStatus(True, "", "cpu", "int8", ())

    async def main():
        loop = asyncio.get_running_loop()
        loading, loaded, failed = loop.create_future(), loop.create_future(), loop.create_future()
        loaded.set_result(object())
        failed.set_exception(ValueError("NMT_DETECT_LANGUAGES: xx unknown to the detector"))
        return [with_detector(ready, d) for d in (None, loaded, loading, failed)]

    off, loaded, loading, failed = asyncio.run(main())
    assert off == ready and loaded == ready
    assert not loading.ready and loading.reason == "loading the language detector"
    assert not failed.ready and "failed to load: NMT_DETECT_LANGUAGES: xx unknown" in failed.reason
