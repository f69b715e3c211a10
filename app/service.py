"""What the routes share: the served models, the engine (scheduler and workers, app/engine.py), the
storage (alignments, files, rate-limit counts), and the way from texts to translations.

A route checks its request (`admit`, `accept_texts`, `resolve`, `terminology`), then hands its
texts to the text pipeline's first half (model/pipeline.py: `prepare`, or for documents
`split_documents` and `translate_documents`), `translate_plans` sends the plans' ids to the
engine as one Job (`decode`) and finishes each text when its hypotheses come back (the pipeline's second
half, here in the server: the worker only decodes). A job waits up to the request's deadline or
the client's disconnect, whichever comes first; both drop its queued items.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

from starlette.requests import Request

from app import markup
from app.alignments import AlignmentStore
from app.blobs import FileStore
from app.cache import TranslationCache
from app.documents.isolated import DocumentReader
from app.documents.limits import Limits
from app.engine import Engine, RemoteEngine, WorkerState
from app.errors import ApiError
from app.glossaries import inline_terminology, kept_by_second_leg, open_glossaries, owner_of
from app.in_flight import AttentionInFlight
from app.keys import configured_key, open_keys
from app.language import DetectionUnavailable, LanguageDetector, RemoteDetector
from app.limits import RateLimiter, client_address
from app.metrics import Metrics
from app.registry import Registry, ServedModel, language_name
from app.scheduler import BatchKey, QueueFull, ShuttingDown
from app.settings import Settings
from app.storage import MemoryStorage, RemoteStorage, StorageUnavailable, byte_budgets, open_storage
from app.suggestions import SuggestionStore
from app.worker import WorkerError
from model import pipeline
from model.clean import clean_text, lone_surrogate
from model.options import MAX_LENGTH_A, MAX_LENGTH_B, DecodingOptions, length_cap
from model.results import TranslationResult
from model.terms import TermError, Terminology, report

T = TypeVar("T")
log = logging.getLogger("uvicorn.error")  # uvicorn configures this one; it is its server log

# client-sized text work up to this many characters runs on the event loop: a thread hop costs
# about what preparing 100 characters does (~80 us each on a 2-core Xeon), and 2,000 characters
# hold the loop for ~1.5 ms; more goes to a thread, so that the loop keeps serving
INLINE_CHARS = 2_000


async def client_work(chars: int, work: Callable[[], T]) -> T:
    """work(), whose cost grows with a client's input of about `chars` characters: on the event
    loop when small (most requests: one sentence), else in a thread."""
    return work() if chars <= INLINE_CHARS else await asyncio.to_thread(work)


@dataclass
class Outcome:
    results: list  # per source: its TranslationResult, or its hypotheses (pipeline.Decoded) from `decode`
    queue_s: float
    compute_s: float


@dataclass(frozen=True)
class Leg:
    """One model's part of a translation: all of it, or one side of a pivot (Service.legs)."""

    source: str
    target: str
    first: bool  # reads the request's own terms, and is charged; a second leg keeps its target terms


@dataclass
class LegResults:
    """One model's part of a translation with options (`Service.translate_with_options`)."""

    model: ServedModel
    results: list[TranslationResult]  # per text
    queue_s: float
    compute_s: float


@dataclass
class Translated:
    """Texts translated as documents by Service.translate_texts."""

    versions: list[list[str]]  # per text: its best translation, then its alternatives
    sources: list[tuple[str, float | None]]  # per text: its source language, with 'auto' the confidence
    reports: list[dict[str, list[str]]] | None  # per text: terms applied, not applied, not found (None: no terms)


def terms_reports(texts: list[str], versions: list[list[str]], models: list[ServedModel | None],
                  documents: list[markup.Document | None], terms: dict[str | None, Terminology | None],
                  ) -> list[dict[str, list[str]]] | None:
    """Per text, which terms its best translation applied (model/terms.py); None without terms. A
    text kept as it is (no model, no document: already in the target language) applied its
    do-not-translate terms and none of its glossary's. Matches every text again: client-sized,
    call it in a thread."""
    if not any(terms.values()):
        return None
    out = []
    for text, document, own, model in zip(texts, documents, versions, models):
        text_terms = terms[model and model.id] or Terminology()
        found = text_terms.find(text)
        # every masked term is in the output (protect.repair); the others could not be masked
        used = document.terms_used(own[0]) if document else {t.entry for t in found if not t.glossary}
        out.append(report(text_terms, {t.entry for t in found}, used))
    return out


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body is already read, so only that can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def item_name(field: str, index: int, count: int) -> str:
    """How errors name a text: 'q' when it came alone, 'q[2]' in a list."""
    return f"{field}[{index}]" if count > 1 else field


def document_limits(s: Settings) -> Limits:
    return Limits(max_zip_members=s.max_zip_members, max_unzipped_bytes=s.max_unzipped_bytes,
                  max_zip_ratio=s.max_zip_ratio, max_xml_depth=s.max_xml_depth, max_texts=s.max_file_texts,
                  max_chars=s.max_file_chars, max_output_bytes=s.file_store_bytes,
                  memory_bytes=s.document_memory_bytes, timeout_s=s.document_timeout_s)


class Service:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = Metrics()
        self.attention_in_flight = AttentionInFlight(settings.attention_in_flight_values,
                                                     settings.client_share_in_flight, settings.trust_forwarded_for)
        # texts waiting for or in a worker, by client address: at most its share of the queue (hold_items;
        # a share of 1: none, the queue's own limit)
        self.items_held: dict[str, int] = {}
        self.client_items = (max(1, int(settings.max_queue_items * settings.client_share_in_flight))
                             if settings.client_share_in_flight < 1 else None)
        # several HTTP processes (`nmt serve`): the engine process, over its socket (else start() makes the Engine)
        self.remote = RemoteEngine(settings.engine_socket) if settings.engine_socket else None
        # Redis, shared with other replicas; else, with several HTTP processes, the engine process's
        self.storage = open_storage(settings, self.remote and self.remote.store)
        self.alignments = AlignmentStore(self.storage, settings.alignment_ttl_s, settings.alignment_max_bytes,
                                         settings.client_alignment_bytes)
        self.limiter = RateLimiter(self.storage)
        self.files = FileStore(self.storage, settings.file_ttl_s, settings.client_file_bytes)
        self.documents = DocumentReader(document_limits(settings), settings.document_parsers)
        self.cache: TranslationCache | None = None  # made in start(), with the models' fingerprints
        self.keys = open_keys(settings.keys_db, settings.redis_url)
        self.glossaries = open_glossaries(settings.keys_db, settings.redis_url)
        self.suggestions = SuggestionStore(settings.suggestions_db, settings.suggestions_max_bytes)
        self.registry: Registry | None = None
        self.engine: Engine | RemoteEngine | None = None  # the scheduler and workers (app/engine.py)
        self.started = False

    async def start(self) -> None:
        s = self.settings
        remote = self.remote
        if s.detect_languages == ["none"]:
            detector = None
        elif remote:  # the engine process's one detector, instead of one per HTTP process
            detector = RemoteDetector(remote.detect, asyncio.get_running_loop(), s.request_timeout_s)
        else:
            detector = await asyncio.to_thread(LanguageDetector, s.detect_languages, s.detect_low_accuracy,
                                               s.detect_preload)
        self.registry = await asyncio.to_thread(Registry.load, s.model_dirs, detector, s.model_cache)
        if s.cache:
            # in the engine process's store, every lookup would cost each request two more trips through
            # that one process: each HTTP process caches its own translations instead
            cached = MemoryStorage(byte_budgets(s)) if isinstance(self.storage, RemoteStorage) else self.storage
            self.cache = TranslationCache(cached, s.cache_ttl_s,
                                          {model_id: model.fingerprint for model_id, model in self.registry.models.items()})
        m = self.metrics
        if isinstance(self.storage, MemoryStorage):  # (Redis' own metrics, or the engine process's, say the rest)
            m.store_gauges(self.storage)
        if remote:  # `nmt serve` with several HTTP processes: the engine is a process of its own
            self.engine = remote
        else:
            self.engine = Engine(s, {model_id: str(model.directory) for model_id, model in self.registry.models.items()},
                                 m)
            log.info("serving %s on %d %s worker(s) x %d thread(s), dtype %s", self.registry.pairs(),
                     len(self.engine.pool.workers), self.engine.device_kind, self.engine.threads, s.dtype)
        await self.engine.start()
        self.started = True

    async def stop(self) -> None:
        """Finish queued and in-flight work (within shutdown_timeout_s), then stop the workers."""
        if self.engine:
            await self.engine.stop()
        await self.storage.close()

    @property
    def device_kind(self) -> str:
        return self.engine.device_kind if self.engine else "cpu"

    @property
    def dtype(self) -> str:
        """The compute type the workers resolved (NMT_DTYPE, "auto" made concrete once one is up)."""
        return self.engine.dtype if self.engine else self.settings.dtype

    def workers(self) -> tuple[WorkerState, ...]:
        return self.engine.status().workers if self.engine else ()

    def ready(self) -> tuple[bool, str]:
        if not self.started:
            return False, "models not loaded yet"
        status = self.engine.status()
        return status.ready, status.reason

    def client_address(self, request: Request) -> str:
        return client_address(request.scope, self.settings.trust_forwarded_for)

    async def admit(self, request: Request, key: str | None, cost: int = 1, key_required: bool = True) -> int:
        """Check the API key and count the call against its client's requests per minute
        (app/limits.py): a 403 for a wrong or missing key, a 429 past the limit. Returns the
        characters a text of this call may have."""
        s = self.settings
        api_key = None
        if key:
            encoded = key.encode("utf-8", "surrogatepass")
            if any(hmac.compare_digest(encoded, k.encode()) for k in s.api_keys):
                api_key = configured_key(key)
            else:
                api_key = await asyncio.to_thread(self.keys.lookup, key)
            if api_key is None:
                # wrong guesses count per address: past NMT_MAX_KEY_FAILURES a minute, a 429
                await self._count("bad-key:" + self.client_address(request), s.max_key_failures, 1)
                raise ApiError(403, "Invalid API key")
        elif key_required and (s.require_api_key or s.api_keys):
            raise ApiError(403, "an API key is required: pass api_key in the body or an X-API-Key header")
        if api_key:
            client, limit = "key:" + hashlib.sha256(encoded).hexdigest()[:32], api_key.req_limit
        else:
            client, limit = "address:" + self.client_address(request), s.req_limit
        await self._count(client, limit, cost)
        request.state.rate_limited_as = (client, limit)  # for charge(): what the request turns out to cost
        char_limit = (api_key.char_limit if api_key and api_key.char_limit else s.char_limit) or s.max_chars
        return min(char_limit, s.max_chars)

    @staticmethod
    def owner(request: Request) -> str:
        """Whom stored results are counted against: the client admit() counted the request for."""
        client, _ = getattr(request.state, "rate_limited_as", ("unknown", 0))
        return client

    async def charge(self, request: Request, cost: int) -> None:
        """Count `cost` more against the client admit() counted this request for, once the request
        shows what it holds (its sentences): a 429 when the client's count and the cost together
        pass its limit."""
        client, limit = getattr(request.state, "rate_limited_as", (None, 0))
        if client is not None and cost > 0:
            await self._count(client, limit, cost)

    async def _count(self, client: str, limit: int, cost: int) -> None:
        try:
            retry_after = await self.limiter.admit(client, limit, cost)
        except StorageUnavailable as e:  # translation goes on without shared counts; /ready says why
            log.warning("rate limit not counted: %s", e.detail)
            self.metrics.storage_errors.labels("limit").inc()
            retry_after = None
        if retry_after is None:
            return
        self.metrics.rate_limited.inc()
        if math.isinf(retry_after):
            raise ApiError(429, f"Slowdown: {limit} per 1 minute; this request alone costs {cost} (a text or a "
                           "sentence each): send fewer texts per request")
        raise ApiError(429, f"Slowdown: {limit} per 1 minute", {"Retry-After": str(math.ceil(retry_after))})

    def resolve(self, source: str, target: str, text: str = "") -> tuple[ServedModel, float | None]:
        """The model, and with source 'auto' the confidence of the language chosen (see Registry.resolve;
        `text` is what 'auto' detects the language of)."""
        try:
            return self.registry.resolve(source, target, text)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        except DetectionUnavailable as e:
            raise ApiError(503, f"{e}; retry") from None

    async def detect(self, texts: list[str], field: str, char_limit: int | None = None) -> list[list[tuple[str, float]]]:
        """Each text's likeliest languages (served or not) with confidences, best first ([] for a text
        without letters); a 400 when detection is off or accept_texts refuses a text."""
        detector = self.registry.detector
        if detector is None:
            raise ApiError(400, "language detection is off on this server (NMT_DETECT_LANGUAGES=none)")
        texts = self.accept_texts(texts, field, char_limit=char_limit)
        # up to max_items x max_chars, ~1 ms a short text: off the event loop, so batching keeps its timing
        try:
            return await asyncio.to_thread(detector.detect_all, texts)
        except DetectionUnavailable as e:
            raise ApiError(503, f"{e}; retry") from None

    async def resolve_each(self, source: str, target: str, texts: list[str], field: str,
                           ) -> list[tuple[ServedModel, float | None]]:
        """resolve() for each text: with source 'auto', each text's own language (a 400 names the
        text whose language no model translates)."""
        if source != "auto":
            return [self.resolve(source, target)] * len(texts)

        def each():
            out = []
            for i, text in enumerate(texts):
                try:
                    out.append(self.registry.resolve(source, target, text))
                except ValueError as e:
                    raise ApiError(400, f"{item_name(field, i, len(texts))}: {e}") from None
                except DetectionUnavailable as e:
                    raise ApiError(503, f"{e}; retry") from None
            return out

        return await asyncio.to_thread(each)

    def accept_texts(self, texts: list[str], field: str, allow_blank: bool = False,
                     char_limit: int | None = None) -> list[str]:
        """The texts as the model will read them (control and bidi-control characters removed,
        model/clean.py), or a 400 naming the text and what it breaks: too many texts, a lone
        surrogate, a blank one, or one longer than `char_limit` (default NMT_MAX_CHARS; `admit`
        gives the caller's)."""
        s = self.settings
        char_limit = char_limit or s.max_chars
        if not texts:
            raise ApiError(400, f"{field}: give at least one text")
        if len(texts) > s.max_items:
            raise ApiError(400, f"{field}: {len(texts)} texts; at most {s.max_items} per request (NMT_MAX_ITEMS)")
        cleaned = []
        for i, text in enumerate(texts):
            name = item_name(field, i, len(texts))
            if len(text) > char_limit:
                raise ApiError(400, f"{name} has {len(text)} characters; at most {char_limit}")
            at = lone_surrogate(text)
            if at is not None:
                raise ApiError(400, f"{name} holds a lone surrogate (U+{ord(text[at]):04X}) at character {at}, "
                               "which is not valid Unicode: send UTF-8 text")
            readable = clean_text(text)
            if not allow_blank and not readable.strip():
                raise ApiError(400, f"{name} is empty" + (" once control characters are removed" if text.strip() else ""))
            cleaned.append(readable)
        return cleaned

    async def terminology(self, glossary, glossary_ids: tuple[str, ...], do_not_translate, key: str | None,
                          model: ServedModel | None) -> Terminology | None:
        """A request's terminology: its own glossary and do-not-translate terms, and the entries of
        the stored glossaries `glossary_ids` of its key (app/glossaries.py), each of the model's
        language pair, no source term in two of them with different targets. A 400 says what is
        wrong with them (an unknown id too)."""
        try:  # up to a body of terms: off the event loop
            terms = None if not glossary and not do_not_translate else \
                await asyncio.to_thread(inline_terminology, glossary, do_not_translate)
        except TermError as e:
            raise ApiError(400, str(e)) from None
        if glossary_ids:
            entries: dict[str, str] = {}
            source_of: dict[str, str] = {}  # source term -> the glossary it came from
            for glossary_id in glossary_ids:
                stored = await asyncio.to_thread(self.glossaries.get, glossary_id, owner_of(key))
                if stored is None:
                    raise ApiError(400, f"no glossary {glossary_id!r} for this API key (POST /v2/glossaries makes one)")
                if (stored.source_lang, stored.target_lang) != (model.source, model.target):
                    raise ApiError(400, f"glossary {glossary_id!r} is {stored.source_lang}->{stored.target_lang}; "
                                   f"this request translates {model.source}->{model.target}")
                for source, target in stored.entries.items():
                    if entries.setdefault(source, target) != target:
                        raise ApiError(400, f"glossaries {source_of[source]!r} and {glossary_id!r} both have "
                                       f"{source!r}, as {entries[source]!r} and {target!r}: give one of them")
                    source_of.setdefault(source, glossary_id)
            # a stored glossary's matcher is built per request (up to 5,000 entries, ~0.1 s): off the event loop
            inline = terms
            terms = await asyncio.to_thread(lambda: Terminology(entries).merged(inline))
        return terms

    async def count_usage(self, owner: str, characters: int) -> int:
        """Characters translated this calendar month (UTC) for a glossary owner (app/glossaries.py:
        an API key's digest), with `characters` added: DeepL's /v2/usage."""
        month = time.strftime("%Y-%m", time.gmtime())
        try:
            return await self.storage.add(f"usage:{owner or 'anonymous'}:{month}", characters, 40 * 86400)
        except StorageUnavailable as e:
            log.warning("usage not counted: %s", e.detail)
            return 0

    def legs(self, source: str, target: str, refused: dict[str, bool] | None = None) -> list[Leg]:
        """How source -> target is translated: by one model, or, with no model for it but for
        source -> B and B -> target, through the pivot B (English where it can be), the way
        Argos's CompositeTranslation does: the first leg's output is the second's input. A 400
        names what the request asks for (`refused`: name -> asked) that a pivot cannot give."""
        pivot = self.registry.pivot(source, target) if source != "auto" else None
        if pivot is None:
            return [Leg(source, target, True)]
        asked = [name for name, is_asked in (refused or {}).items() if is_asked]
        if asked:
            raise ApiError(400, f"{', '.join(asked)}: not available through a pivot ({source}->{pivot}->{target})")
        return [Leg(source, pivot, True), Leg(pivot, target, False)]

    def leg_terms(self, leg: Leg, glossary, do_not_translate) -> tuple[dict | None, list[str] | None]:
        """The inline glossary and do-not-translate terms a leg translates with: the first leg the
        request's; the second keeps as written the target terms the first wrote and the
        do-not-translate terms (app/glossaries.py). A 400 says what is wrong with them."""
        if leg.first:
            return glossary, do_not_translate
        try:
            return None, kept_by_second_leg(inline_terminology(glossary, do_not_translate))
        except TermError as e:
            raise ApiError(400, str(e)) from None

    def cpu_budget(self, what: str) -> Callable[[], None]:
        """A check to call between texts of client-sized work (in the thread doing it): a 413 once
        that thread has spent NMT_TEXT_CPU_BUDGET_S of CPU time on `what`. Every step is linear in
        its input; this bounds what all the texts of one request may cost together."""
        limit, start = self.settings.text_cpu_budget_s, time.thread_time()

        def check() -> None:
            if time.thread_time() - start > limit:
                raise ApiError(413, f"{what} took more than {limit:g} s of CPU time (NMT_TEXT_CPU_BUDGET_S): "
                               "send less text, or less markup, per request")
        return check

    async def split_documents(self, request: Request, texts: list[str], html: bool, models: list[ServedModel],
                              terms: dict[str, Terminology | None], field: str, charge: bool,
                              reading: markup.Reading = markup.Reading()) -> list[markup.Document]:
        """Each text cut into sentences for its model (app/markup.py: spans and terms masked where
        the model has sentinels; `_split`); a 400 past NMT_MAX_SEGMENTS sentences; with
        `charge`, each sentence past the first of a text counted against the client's limit."""
        documents = await self._split(texts, [html] * len(texts), models, [terms[m.id] for m in models], field,
                                      reading)
        sentences = sum(len(document.sentences) for document in documents)
        if sentences > self.settings.max_segments:
            raise ApiError(400, f"{field} splits into {sentences} sentences; at most {self.settings.max_segments} per "
                           "request (NMT_MAX_SEGMENTS): send fewer or shorter texts")
        if charge:
            await self.charge(request, sentences - len(texts))
        return documents

    async def _split(self, texts: list[str], html: list[bool], models: list[ServedModel],
                     terms: list[Terminology | None], what: str, reading: markup.Reading = markup.Reading(),
                     ) -> list[markup.Document]:
        """Each text (HTML where `html` says) cut into sentences for its model, its terms masked,
        within the CPU budget of one request's text work (in a thread when it is large)."""
        depth = self.settings.max_html_depth

        def split() -> list[markup.Document]:
            within_budget, out = self.cpu_budget(f"cutting {what} into sentences"), []
            for text, is_html, model, text_terms in zip(texts, html, models, terms):
                out.append(markup.split_document(text, is_html, spans=model.protects_spans,
                                                 foreign=model.tokenizer.cannot_spell, max_depth=depth,
                                                 terms=text_terms, annotate=model.reads_annotations,
                                                 reading=reading))
                within_budget()
            return out

        return await client_work(sum(map(len, texts)), split)

    def prepare(self, model: ServedModel, texts: list[str], field: str, terms: Terminology | None = None,
                term_method: str = "auto", only: list[int] | None = None) -> list[pipeline.Plan]:
        """Each text (as accept_texts returned it; with `only`, those texts) as the model reads it
        (model/pipeline.py: its spans and `terms` masked, its accelerator mark out, capitals in
        sentence case), each translated as one sequence; a 400 when the model's token limit
        refuses one. Client-sized work: call it in a thread."""
        within_budget, plans = self.cpu_budget(f"masking {field}"), []
        for i in range(len(texts)) if only is None else only:
            plans += self._refused_if_long(model, pipeline.prepare, model.reader, [texts[i]], terms, term_method,
                                           names=[item_name(field, i, len(texts))])
            within_budget()
        return plans

    async def translate_with_options(self, request: Request, texts: list[str], source: str, target: str,
                                     options: DecodingOptions, glossary, glossary_ids: tuple[str, ...], do_not_translate,
                                     key: str | None, char_limit: int, refused: dict[str, bool],
                                     attention_copies: int = 0) -> list[LegResults]:
        """Texts translated as /v1/translate does, each as one sequence, decoded as `options` say
        (a length penalty of None: each model's own), with the request's terms; one model for all
        (source 'auto': detected, and a 400 when the texts look like several languages). Through a
        pivot (`legs`; `refused` names what a pivot cannot give) the second leg translates the
        first's best translations: every leg's results, in order. attention_copies: how many
        hypotheses' attention the request keeps per text (`attention_bounds`)."""
        out: list[LegResults] = []
        for leg in self.legs(source, target, refused):
            leg_glossary, keep = self.leg_terms(leg, glossary, do_not_translate)
            out.append(await self._translate_leg(request, texts, leg, options,
                                                 (leg_glossary, glossary_ids if leg.first else (), keep, key),
                                                 char_limit, attention_copies))
            texts = [r.hypotheses[0].text for r in out[-1].results]
        return out

    async def _translate_leg(self, request: Request, texts: list[str], leg: Leg, options: DecodingOptions,
                             term_args: tuple, char_limit: int, attention_copies: int) -> LegResults:
        texts = self.accept_texts(texts, "text", char_limit=char_limit)  # cleaned, as the model reads them
        resolved = await self.resolve_each(leg.source, leg.target, texts, "text")
        kept = next((i for i, (m, _) in enumerate(resolved) if m is None), None)
        if kept is not None:  # /translate and /v2/translate keep it as it is; here a translation has a model
            if leg.source != "auto":
                raise ApiError(400, f"source and target are both {leg.target!r}: nothing to translate")
            raise ApiError(400, f"source 'auto': {item_name('text', kept, len(texts))} looks "
                           f"{language_name(self.registry.code(leg.target))}, the target language: nothing to "
                           "translate (/translate and /v2/translate return such a text as it is)")
        model = resolved[0][0]
        other = next((i for i, (m, _) in enumerate(resolved) if m.id != model.id), None)
        if other is not None:  # one model per request: its response names it
            raise ApiError(400, f"source 'auto': text[0] looks {language_name(model.source)} and text[{other}] "
                           f"{language_name(resolved[other][0].source)}; send one language per request (or use "
                           "/translate, which translates each text from its own language)")
        terms = await self.terminology(*term_args, model)
        plans = await client_work(sum(map(len, texts)), partial(self.prepare, model, texts, "text", terms))
        if options.length_penalty is None:
            options = replace(options, length_penalty=model.length_penalty)
        # a text whose best translation lacks an annotated term: again, its terms as sentinels
        outcome = await self.translate_plans(request, model, plans, options,
                                             partial(self.prepare, model, texts, "text", terms, "spans"),
                                             attention_copies=attention_copies)
        return LegResults(model, outcome.results, outcome.queue_s, outcome.compute_s)

    async def translate_file_texts(self, request: Request, texts: list[str], html: list[bool], source: str,
                                   target: str, glossary, glossary_ids: tuple[str, ...], do_not_translate,
                                   key: str | None, filename: str, started: float) -> tuple[list[str], str]:
        """A file's texts (its paragraphs, cells, entries: text or HTML), each cut into sentences
        and put back together, by the model for source -> target (source 'auto': the language of
        its first 20 texts' words), through a pivot's legs; jobs of at most NMT_MAX_SEGMENTS
        sentences, all within NMT_FILE_TIMEOUT_S of `started`. The translated texts, and the target
        language. A file already in the target language is kept as it is."""
        sample = ""
        if source == "auto":
            depth = self.settings.max_html_depth
            sample = await asyncio.to_thread(lambda: " ".join(
                markup.split_document(t, is_html, spans=False, max_depth=depth).text
                for t, is_html in zip(texts[:20], html)))
        for leg in self.legs(source, target, {"a stored glossary (glossary_id)": bool(glossary_ids)}):
            model, _ = await asyncio.to_thread(self.resolve, leg.source, leg.target, sample)  # (detection blocks)
            if model is None:
                break
            leg_glossary, keep = self.leg_terms(leg, glossary, do_not_translate)
            terms = await self.terminology(leg_glossary, glossary_ids if leg.first else (), keep, key, model)
            texts = await self._translate_file_leg(request, model, texts, html, terms, filename, started,
                                                   charge=leg.first)
        return texts, self.registry.code(target)

    async def _translate_file_leg(self, request: Request, model: ServedModel, texts: list[str], html: list[bool],
                                  terms: Terminology | None, filename: str, started: float,
                                  charge: bool) -> list[str]:
        """A file's texts by one model; with `charge`, each sentence but the first counts against the
        client's limit (the file counted one when admitted)."""
        s = self.settings
        parts = await self._split(texts, html, [model] * len(texts), [terms] * len(texts), filename)
        if charge:
            await self.charge(request, sum(len(part.sentences) for part in parts) - 1)
        per_part = await self.translate_documents(request, model, parts, 1, [filename] * len(parts), terms,
                                                  max_sentences=s.max_segments, deadline=started + s.file_timeout_s)
        return await client_work(sum(map(len, texts)), lambda: [part.join([best for best, in per_sentence])
                                                                for part, per_sentence in zip(parts, per_part)])

    async def translate_texts(self, request: Request, texts: list[str], html: bool, source: str, target: str,
                              glossary, glossary_ids: tuple[str, ...], do_not_translate, key: str | None, n_best: int,
                              field: str, charge: bool = False, reading: markup.Reading = markup.Reading()) -> Translated:
        """Texts (as accept_texts returned them) translated as documents (app/markup.py: sentences,
        HTML kept), each by its own language's model (source 'auto': each text's detected
        language; one job per model), with the request's terms (its inline glossary and
        do-not-translate terms, a stored glossary): LibreTranslate's /translate and DeepL's
        /v2/translate. Through a pivot (`legs`), the second leg translates the first's output;
        the result reports the first leg's terms and languages. With `charge`, sentences beyond one
        a text count against the client's limit (the first leg's). `reading`: where sentences end
        and what HTML keeps as written, where the request says (DeepL's split_sentences, ignore_tags)."""
        legs = self.legs(source, target, {"alternatives": n_best > 1, "a stored glossary (glossary_id)":
                                          bool(glossary_ids)})
        for leg in legs:
            leg_glossary, keep = self.leg_terms(leg, glossary, do_not_translate)
            term_args = (leg_glossary, glossary_ids if leg.first else (), keep, key)
            done = await self._translate_texts(request, texts, html, leg, term_args, n_best, field, charge,
                                               reading)
            if leg.first:  # what the response reports: the request's own languages and terms
                sources, reports = done.sources, done.reports
            texts = [versions[0] for versions in done.versions]
        return Translated(done.versions, sources, reports)

    async def _translate_texts(self, request: Request, texts: list[str], html: bool, leg: Leg, term_args: tuple,
                               n_best: int, field: str, charge: bool, reading: markup.Reading) -> Translated:
        """translate_texts with one model per text (one leg); term_args: `terminology`'s arguments
        before the model (glossary, glossary_ids, do_not_translate, key). A text already in the
        target language (Registry.resolve: no model) is kept as it is."""
        source, target, charge = leg.source, leg.target, charge and leg.first
        if source == "auto":  # detection reads each text's words, without its markup (off the event loop)
            depth = self.settings.max_html_depth
            readable = await asyncio.to_thread(lambda: [markup.split_document(text, html, spans=False,
                                                                              max_depth=depth).text for text in texts])
        else:
            readable = texts
        resolved = await self.resolve_each(source, target, readable, field)
        by_model: dict[str, list[int]] = {}  # the texts each model translates (not those kept as they are)
        for i, (model, _) in enumerate(resolved):
            if model is not None:
                by_model.setdefault(model.id, []).append(i)
        models = {m.id: m for m, _ in resolved if m is not None}
        terms: dict[str | None, Terminology | None] = {
            model_id: await self.terminology(*term_args, model) for model_id, model in models.items()}
        if sum(map(len, by_model.values())) < len(texts):  # texts kept: the request's own terms (not a stored
            terms[None] = await self.terminology(term_args[0], None, *term_args[2:], None)  # glossary's pair)
        translated = [i for indices in by_model.values() for i in indices]
        split = await self.split_documents(request, [texts[i] for i in translated], html,
                                           [resolved[i][0] for i in translated], terms, field, charge, reading)
        documents: list[markup.Document | None] = [None] * len(texts)
        for i, document in zip(translated, split):
            documents[i] = document
        hypotheses: list[list[list[str]]] = [[] for _ in texts]
        for model_id, indices in by_model.items():  # texts in several languages: a job per model
            found = await self.translate_documents(request, models[model_id], [documents[i] for i in indices], n_best,
                                                   [item_name(field, i, len(texts)) for i in indices], terms[model_id])
            for i, per_sentence in zip(indices, found):
                hypotheses[i] = per_sentence
        chars = sum(map(len, texts)) * (1 + n_best)  # the texts, and their translations
        versions = await client_work(chars, lambda: [document.versions(per_sentence) if document else [text]
                                                     for text, document, per_sentence
                                                     in zip(texts, documents, hypotheses)])
        reports = await client_work(chars, partial(terms_reports, texts, versions, [m for m, _ in resolved],
                                                   documents, terms))
        sources = [(model.source if model else self.registry.code(target), confidence)
                   for model, confidence in resolved]
        return Translated(versions, sources, reports)

    @staticmethod
    def _refused_if_long(model: ServedModel, prepare, *args, **kwargs):
        """`prepare(*args)`, its SourceTooLong a 400 that names the model (never truncated)."""
        try:
            return prepare(*args, **kwargs)
        except pipeline.SourceTooLong as e:
            raise ApiError(400, f"{e.name} has {e.tokens} tokens (end of sentence included); model {model.id} "
                           f"accepts at most {e.limit}: split the text") from None

    async def translate_documents(self, request: Request, model: ServedModel, documents: list[markup.Document],
                                  n_best: int, names: list[str], terms: Terminology | None = None,
                                  max_sentences: int | None = None, deadline: float | None = None,
                                  ) -> list[list[list[str]]]:
        """The n_best hypotheses (texts, masked like the sentences) of each sentence of each document
        (app/markup.py), for LibreTranslate's and DeepL's routes and files: all sentences in one
        job, or in jobs of `max_sentences` each finishing by `deadline` (time.monotonic(): a 504
        past it, naming NMT_FILE_TIMEOUT_S); `names` are how errors name the documents."""
        positions = [(i, j) for i, document in enumerate(documents) for j in range(len(document.sentences))]
        if not positions:
            return [[] for _ in documents]

        def prepare(i: int, j: int, text: str, first: bool) -> pipeline.Plan:
            document = documents[i]
            missed = partial(document.missed_terms, j) if first and document.annotations else None
            return self._refused_if_long(model, pipeline.prepare_sentence, model.reader, text,
                                         f"a sentence of {names[i]}", terms, missed)

        plans = await client_work(sum(len(sentence) for document in documents for sentence in document.sentences),
                                  lambda: [prepare(i, j, documents[i].sentences[j], True) for i, j in positions])
        for (i, _), plan in zip(positions, plans):  # a model without sentinels places its terms
            documents[i].placed_terms.update(plan.stripped.terms.values() if plan.stripped else ())
        options = DecodingOptions(beam_size=max(self.settings.default_beam_size, n_best), n_best=n_best,
                                  length_penalty=model.length_penalty)

        def again(retried: list[int]) -> list[pipeline.Plan]:
            # the annotated terms as sentinels: the document's spans and terms take the new ones
            return [prepare(*positions[k], documents[positions[k][0]].annotations_as_sentinels(positions[k][1]),
                            False) for k in retried]

        results = []
        step = max_sentences or len(plans)
        for start in range(0, len(plans), step):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ApiError(504, f"translating {names[0]} did not finish within {self.settings.file_timeout_s:g} s "
                               "(NMT_FILE_TIMEOUT_S)")
            chunk = range(start, min(start + step, len(plans)))
            outcome = await self.translate_plans(request, model, [plans[k] for k in chunk], options,
                                                 lambda retried, chunk=chunk: again([chunk[k] for k in retried]),
                                                 remaining)
            results += outcome.results
        found = iter(results)
        return [[[h.text for h in next(found).hypotheses] for _ in document.sentences] for document in documents]

    async def translate_plans(self, request: Request, model: ServedModel, plans: list[pipeline.Plan],
                              options: DecodingOptions, again: Callable[[list[int]], list[pipeline.Plan]],
                              timeout_s: float | None = None, attention_copies: int = 0) -> Outcome:
        """Decode prepared plans as one job and finish them (model/pipeline.py). A plan that chooses
        among its beams by its annotated terms and whose best still lacks one goes again, as
        `again(indices)` prepares it (its terms as sentinels, which the repair cannot lose), with
        pipeline.retry_options. A 413 before decoding when the attention the request keeps
        (`attention_copies` per text) could pass NMT_MAX_ATTENTION_VALUES, a 429 when it could
        pass what requests in flight may hold together (app/in_flight.py)."""
        bounds = self.attention_bounds(model, plans, options, attention_copies)
        self.hold_attention(request, model, bounds, attention_copies, sum(bounds))
        outcome = await self._decode_and_finish(request, model, plans, options, timeout_s)
        retried = pipeline.missed_terms(plans, outcome.results)
        if retried:
            self.metrics.term_retries.labels(model.id).inc(len(retried))
            plans_again = await asyncio.to_thread(again, retried)
            held = sum(bounds)
            for i, bound in zip(retried, self.attention_bounds(model, plans_again, options, attention_copies)):
                bounds[i] = bound  # a text decoded again keeps the second decoding's attention
            self.hold_attention(request, model, bounds, attention_copies, max(0, sum(bounds) - held))
            second = await self._decode_and_finish(request, model, plans_again, pipeline.retry_options(options),
                                                   timeout_s)
            for i, result in zip(retried, second.results):
                outcome.results[i] = result
            outcome.compute_s += second.compute_s
        return outcome

    @staticmethod
    def attention_bounds(model: ServedModel, plans: list[pipeline.Plan], options: DecodingOptions,
                         copies: int) -> list[int]:
        """Per plan, the most attention values the request can keep of it: `copies` hypotheses'
        (decoder layers x heads x target x source tokens), each at the most target tokens its
        source may get (model/options.py length_cap)."""
        config = model.config
        heads = copies * config.decoder_layers * config.n_heads
        return [heads * len(p.ids) * length_cap(len(p.ids), options.max_length, config.max_positions) for p in plans]

    def hold_attention(self, request: Request, model: ServedModel, bounds: list[int], copies: int,
                       more: int) -> None:
        """With attention asked for: a 413 when `bounds` together pass NMT_MAX_ATTENTION_VALUES,
        else `more` of them reserved for the request in flight (app/in_flight.py: 429 past its budget)."""
        if not copies:
            return
        limit = self.settings.max_attention_values
        if sum(bounds) > limit:
            c = model.config
            hypotheses = "hypothesis" if copies == 1 else "hypotheses"
            raise ApiError(413, f"the attention asked for could hold {sum(bounds):,} values ({copies} {hypotheses} "
                           f"per text x {c.decoder_layers} layers x {c.n_heads} heads x its source tokens x the most "
                           f"target tokens it may get: max_length, else {MAX_LENGTH_A:g} x its source tokens + "
                           f"{MAX_LENGTH_B}); at most {limit:,} per request (NMT_MAX_ATTENTION_VALUES): send fewer "
                           "or shorter texts, fewer hypotheses, or a smaller max_length")
        self.attention_in_flight.reserve(request.scope, more)

    async def _decode_and_finish(self, request: Request, model: ServedModel, plans: list[pipeline.Plan],
                                 options: DecodingOptions, timeout_s: float | None) -> Outcome:
        """The plans' ids decoded as one job (`decode`), each finished in a thread (client-sized)."""
        key = BatchKey(model.id, pipeline.decoding(plans, options))
        weights = [plan.needs_attention(model.reader) for plan in plans]
        outcome = await self.decode(request, key, [plan.ids for plan in plans], weights, timeout_s)
        tokens = sum(len(h.token_ids) for hyps in outcome.results for h in hyps)  # ~4 characters each
        results = await client_work(4 * tokens, lambda: [pipeline.finish(model.reader, plan, hyps, options)
                                                         for plan, hyps in zip(plans, outcome.results)])
        m, hypotheses = self.metrics, [h for r in results for h in r.hypotheses]
        m.span_repairs.labels(model.id, "inserted").inc(sum(len(h.spans_inserted) for h in hypotheses))
        m.span_repairs.labels(model.id, "removed").inc(sum(len(h.spans_removed) for h in hypotheses))
        m.repaired.labels(model.id).inc(sum(h.repaired for h in hypotheses))
        return Outcome(results, outcome.queue_s, outcome.compute_s)

    async def decode(self, request: Request, key: BatchKey, sources: list[list[int]], weights: list[bool],
                        timeout_s: float | None = None) -> Outcome:
        """Decode `sources` as one job, within `timeout_s` (default NMT_REQUEST_TIMEOUT_S): each
        source's hypotheses (pipeline.Decoded), with attention weights where `weights` says; what
        the translation cache (app/cache.py) has is not decoded again."""
        cache_keys, decoded = [], [None] * len(sources)
        if self.cache is not None and not key.options.attention:
            # NMT_CACHE_SCOPE=key: an API key's translations are served from the cache to that key alone
            client = self.owner(request)
            partition = client if self.settings.cache_scope == "key" and client.startswith("key:") else ""
            dtype = self.dtype
            cache_keys = [self.cache.key(key, dtype, source, partition, w) for source, w in zip(sources, weights)]
            try:
                decoded = await self.cache.get(cache_keys)
            except StorageUnavailable as e:  # decode everything
                log.warning("translation cache skipped: %s", e.detail)
                self.metrics.storage_errors.labels("cache").inc()
            hits = sum(d is not None for d in decoded)
            self.metrics.cache_lookups.labels("hit").inc(hits)
            self.metrics.cache_lookups.labels("miss").inc(len(sources) - hits)
        missing = [i for i, d in enumerate(decoded) if d is None]
        if not missing:
            return Outcome(decoded, 0.0, 0.0)
        with self.hold_items(request, len(missing)):
            found, queue_s, compute_s = await self._decode_job(request, key, [sources[i] for i in missing],
                                                               [weights[i] for i in missing], timeout_s)
        if cache_keys:
            try:
                await self.cache.put([cache_keys[i] for i in missing], found)
            except StorageUnavailable as e:
                log.warning("translation not cached: %s", e.detail)
                self.metrics.storage_errors.labels("cache").inc()
        for i, hyps in zip(missing, found):
            decoded[i] = hyps
        return Outcome(decoded, queue_s, compute_s)

    @contextlib.contextmanager
    def hold_items(self, request: Request, count: int):
        """`count` texts of the request's client address waiting for or in a worker while the block
        runs; a 429 where its other requests hold so many that together they would pass its share
        of the queue (NMT_CLIENT_SHARE_IN_FLIGHT of NMT_MAX_QUEUE_ITEMS), so that one client cannot
        fill the queue for the others (its one request alone is held to the queue's limit only).
        Counted in this HTTP process."""
        client = self.client_address(request)
        held = self.items_held.get(client, 0)
        if self.client_items is not None and held and held + count > self.client_items:
            raise ApiError(429, f"too many texts in flight for this client ({client}): its other requests have "
                           f"{held:,} waiting for or in a worker and this one {count:,}, of {self.client_items:,} one "
                           "client may have (NMT_CLIENT_SHARE_IN_FLIGHT of NMT_MAX_QUEUE_ITEMS); retry once they "
                           "are answered")
        self.items_held[client] = held + count
        try:
            yield
        finally:
            self.items_held[client] -= count
            if not self.items_held[client]:
                del self.items_held[client]

    async def _decode_job(self, request: Request, key: BatchKey, sources: list[list[int]], weights: list[bool],
                          timeout_s: float | None) -> tuple[list, float, float]:
        """`sources` decoded as one job of the engine, within `timeout_s`: their hypotheses, and the
        job's time in the queue and in a worker."""
        try:
            job = self.engine.submit(key, sources, weights, self.client_address(request))
        except QueueFull as e:
            raise ApiError(429, f"too busy: {e}") from None
        except ShuttingDown as e:
            raise ApiError(503, str(e)) from None
        except WorkerError as e:  # the engine process is unreachable
            raise ApiError(503, f"translation failed: {e}; retry") from None
        gone = asyncio.create_task(_client_gone(request))
        timeout_s = timeout_s or self.settings.request_timeout_s
        timeout = timeout_s - (time.monotonic() - job.arrived)
        try:
            done, _ = await asyncio.wait({job.future, gone}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if job.future not in done:
            self.engine.cancel(job)
            if gone in done:
                raise ApiError(499, "client disconnected")  # nobody reads it; recorded in metrics
            raise ApiError(504, f"translation did not finish within {timeout_s:g} s "
                           "(NMT_REQUEST_TIMEOUT_S, NMT_FILE_TIMEOUT_S for files); retry, or send fewer or shorter "
                           "texts")
        try:
            found = job.future.result()
        except QueueFull as e:  # the engine of another process refused it (app/engine.py)
            raise ApiError(429, f"too busy: {e}") from None
        except (WorkerError, ShuttingDown) as e:
            raise ApiError(503, f"translation failed: {e}; retry") from None
        queue_s = job.started - job.arrived
        compute_s = job.finished - job.started
        m = self.metrics
        m.queue_wait.labels(key.model).observe(queue_s)
        m.compute.labels(key.model).observe(compute_s)
        m.items.labels(key.model).inc(len(found))
        m.generated_tokens.labels(key.model).inc(sum(len(h.token_ids) + h.ended_with_eos for hyps in found for h in hyps))
        return found, queue_s, compute_s
