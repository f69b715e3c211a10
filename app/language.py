"""Which language a text is in: POST /detect and source 'auto', over every language the detector
knows, not just the served ones (a French text is "fr" even where only en and de are served).

The detector is lingua (lingua-language-detector, 75 languages), chosen by measurement against
cld2, LibreTranslate's cld2 + lingua, and langdetect on UI strings and sentences of 25 languages
(`bench/langid.py`, BENCHMARKS.md): it is right most often on short texts (79.5% against 72-73%)
and long ones (98.2% against 95-96%). Its cost is memory: ~1.2 GB with every language's models
loaded (they load as texts need them); NMT_DETECT_LANGUAGES narrows the languages, and
NMT_DETECT_LOW_ACCURACY takes its small models instead (~80 MB, 66% / 95%). With several HTTP
processes (NMT_HTTP_PROCESSES > 1) the engine process holds the one detector and the HTTP
processes ask it over the engine's socket (`RemoteDetector`), instead of each loading its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable

MIN_SHARE = 0.2  # 'auto' takes a served language whose confidence is at least this share of the best one's
CLEAR = 50.0  # ... or any served candidate when no language reaches this confidence (short texts)

Found = list[tuple[str, float]]  # (ISO 639-1 code, confidence in percent), best first


class DetectionUnavailable(Exception):
    """The detector of another process (the engine's) could not answer: it is restarting, or gone."""


class Detector:
    """What /detect and source 'auto' use: `detect_all` texts' likeliest languages, and `choose`
    the served one to translate a text from. Both block (lingua's models hold the GIL): call them
    off the event loop."""

    def detect_all(self, texts: list[str], candidates: int | None = 3) -> list[Found]:
        """Each text's likeliest languages (ISO 639-1 codes) with their confidence in percent, best
        first, at most `candidates` (None: all); [] for a text without letters."""
        raise NotImplementedError

    def detect(self, text: str, candidates: int | None = 3) -> Found:
        return self.detect_all([text], candidates)[0]

    def choose(self, text: str, served: list[str]) -> tuple[str, float, Found]:
        """(the served language to translate `text` from, its confidence, the best candidates).

        The likeliest served language is taken when it is at least MIN_SHARE as likely as the best
        candidate, or when no language is CLEAR: short texts rarely are ("Hello world." looks a
        little Maori to lingua), and refusing them would fail most UI strings. A text clearly in
        a language no model translates gets ('', 0, candidates)."""
        found = self.detect(text, candidates=None)
        ours = [(language, confidence) for language, confidence in found if language in served]
        if ours and (ours[0][1] >= MIN_SHARE * found[0][1] or found[0][1] < CLEAR):
            return ours[0][0], ours[0][1], found[:3]
        return "", 0.0, found[:3]


class LanguageDetector(Detector):
    def __init__(self, languages: list[str] | None = None, low_accuracy: bool = False, preload: bool = False):
        """`preload` loads every language model now; otherwise each loads on the first detection that
        needs it, holding the GIL while it does (the whole process waits: ~30-70 s for all 75)."""
        from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

        known = {language.iso_code_639_1.name.lower() for language in Language.all()}
        unknown = sorted(set(languages or []) - known)
        if unknown:
            raise ValueError(f"NMT_DETECT_LANGUAGES: {', '.join(unknown)} unknown to the detector; it knows "
                             f"{', '.join(sorted(known))}")
        if languages and len(set(languages)) < 2:
            raise ValueError("NMT_DETECT_LANGUAGES: give at least two languages to choose among")
        builder = (LanguageDetectorBuilder.from_iso_codes_639_1(*[getattr(IsoCode639_1, c.upper()) for c in languages])
                   if languages else LanguageDetectorBuilder.from_all_languages())
        if low_accuracy:
            builder = builder.with_low_accuracy_mode()
        self.detector = (builder.with_preloaded_language_models() if preload else builder).build()
        self.preloaded = preload
        self.languages = sorted(set(languages) if languages else known)
        self._lock = threading.Lock()  # without preload, models load on first use: one thread at a time

    def detect_all(self, texts: list[str], candidates: int | None = 3) -> list[Found]:
        return [self._detect(text, candidates) for text in texts]

    def _detect(self, text: str, candidates: int | None) -> Found:
        if not any(c.isalpha() for c in text):
            return []
        with self._lock:
            values = self.detector.compute_language_confidence_values(text)
        return [(v.language.iso_code_639_1.name.lower(), 100.0 * v.value) for v in values[:candidates] if v.value > 0]


class RemoteDetector(Detector):
    """The engine process's detector, as an HTTP process asks it (`ask`: RemoteEngine.detect, a
    coroutine on this process's event loop `loop`). Blocking, as the local one: from a thread only."""

    def __init__(self, ask: Callable[[list[str]], Awaitable[list[Found]]], loop: asyncio.AbstractEventLoop,
                 timeout_s: float):
        self.ask, self.loop, self.timeout_s = ask, loop, timeout_s

    def detect_all(self, texts: list[str], candidates: int | None = 3) -> list[Found]:
        if not any(c.isalpha() for text in texts for c in text):  # nothing to ask
            return [[] for _ in texts]
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # a thread without a loop: as it should be
            running = None
        if running is self.loop:  # it would wait for itself
            raise RuntimeError("RemoteDetector waits for the event loop: call it from a thread")
        future = asyncio.run_coroutine_threadsafe(self.ask(texts), self.loop)
        try:
            found = future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise DetectionUnavailable(f"the engine process did not detect within {self.timeout_s:g} s") from None
        return [languages[:candidates] for languages in found]


def language_name(code: str) -> str:
    """The English name lingua gives a language ('mi' -> 'Maori'), else the code."""
    from lingua import IsoCode639_1, Language

    iso = getattr(IsoCode639_1, code.upper(), None)
    return Language.from_iso_code_639_1(iso).name.title() if iso is not None else code
