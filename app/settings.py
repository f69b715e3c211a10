"""Every knob of the service, read from the environment (prefix NMT_).

Lists (NMT_MODEL_DIRS, NMT_CORS_ORIGINS, NMT_API_KEYS) take a JSON list or a comma-separated string.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

CommaList = Annotated[list[str], NoDecode]


def _split(value):
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            return json.loads(value)
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NMT_", extra="ignore")

    model_dirs: CommaList = Field(["checkpoints/en-de", "checkpoints/de-en"],
                                  description="What to serve, one model per language pair: checkpoint directories, "
                                  "Argos Translate packages (folders or .argosmodel files), "
                                  "folders of packages, or 'argos' (ARGOS_PACKAGES_DIR, else Argos's default "
                                  "folder); the model id is '<source>-<target>'.")
    model_cache: str = Field("~/.cache/nmt/models", description="Where Argos packages named in NMT_MODEL_DIRS are "
                             "converted to (once per package content; a changed package is converted again).")
    max_loaded_models: int = Field(0, ge=0, description="Models each worker keeps loaded: 0, all of them from the "
                                   "start; N, the first at start and each other on first use (its first batch waits "
                                   "for the load), the least recently used unloaded past N.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto' takes CUDA when available.")
    dtype: Literal["auto", "float32", "float16", "bfloat16", "int8"] = Field(
        "auto", description="Weights and activations dtype. auto: bfloat16 on CUDA GPUs from Ampere on; int8 on "
        "CPUs with AVX-512 VNNI or AVX2 (AMX ones included); else bfloat16 where the CPU computes it natively, "
        "else float32. int8: int8 Linear layers with activations quantized row by row, the encoder and each decoder "
        "step as one C++ call, CPU only.")
    shortlist: bool = Field(True, description="On the CPU, decode over a model's vocabulary shortlist when its "
                            "directory has one (shortlist.safetensors, `nmt shortlist`): the logits of the target "
                            "pieces likely for each batch's sources only. The shipped models have one (~1.2x the "
                            "sentences/s; chrF within 0.1 on their test sets).")
    workers: int = Field(0, ge=0, le=64, description="Model worker processes. 0: one per GPU on CUDA (more are dealt "
                         "round the GPUs); on CPU, cores // threads_per_worker.")
    threads_per_worker: int = Field(0, ge=0, le=256, description="torch intra-op threads in each CPU worker. "
                                    "0: 1 when the machine has at most 4 cores, else 4.")
    batch_tokens: int = Field(0, ge=0, description="Token budget of one batch: items x padded source length "
                              "x beam size. 0: 4096 on the CPU (cache-sized batches decode fastest there), 32768 "
                              "on a GPU (decoding there is bound by kernel launches: on an H200, 8x the batch "
                              "took ~4x the time). A single item over the budget runs alone.")
    running_batch: Literal["auto", "true", "false"] = Field(
        "auto", description="Step-level batching in the workers (model/running.py): a request's sentences join the "
        "batch running on the device at its next step and are answered as soon as each is done, instead of waiting "
        "for a batch of their own and for its longest sentence. auto: batch by batch on both devices: on an "
        "H200 running batches gave a shorter tail at 64 clients but no more sentences/s, and are unmeasured at 256 "
        "clients in one process (scripts/gpu-check.sh); on the CPU a worse tail at half the capacity "
        "(bench/open_loop.py); "
        "true / false. Requests with "
        "min_length or repetition_penalty are decoded batch by batch either way.")
    pipelined_steps: bool = Field(False, description="On a GPU, the graphed beam search queues each step before it "
                                  "waits for the one before (model/graphs.py GraphedBeamSearch.pipelined; one step "
                                  "runs after a search ends, changing nothing). Off until a GPU run measures it "
                                  "(scripts/gpu-check.sh); no effect on the CPU.")
    running_slots: int = Field(64, ge=1, le=1024, description="Sentences in one running batch (NMT_RUNNING_BATCH); "
                               "more wait for a free slot.")
    running_bytes: int = Field(0, ge=0, description="Bytes the running batches of a worker may hold in buffers "
                               "together (NMT_RUNNING_BATCH; every beam size, length penalty and length bucket "
                               "in use has a batch of its own): past it, sentences of a new shape wait for others "
                               "to finish. 0: a quarter of the GPU's memory, 2 GiB on a CPU.")
    running_join_group: int = Field(1, ge=1, le=1024, description="Sentences join a running batch in groups of this "
                                    "many (fewer when fewer slots are free), each group encoded in one call, waiting "
                                    "at most NMT_RUNNING_JOIN_WAIT steps for the group to fill.")
    running_join_wait: int = Field(0, ge=0, le=1000, description="Most steps a sentence waits for its join group "
                                   "(NMT_RUNNING_JOIN_GROUP) before it joins anyway; 0: it never waits. A batch with "
                                   "nothing running takes waiting sentences at once.")
    max_wait_ms: float | None = Field(None, ge=0, le=10_000, description="Longest an item waits for company before "
                                      "its batch runs anyway, while another batch runs (on an idle server it starts "
                                      "at once). Unset: 0 on the CPU (where a batch of a few sentences costs ~0.9 of "
                                      "their times one by one, so waiting costs more than it saves), 5 on a GPU.")
    batch_hold_ms: float = Field(0, ge=0, le=1000, description="After a batch ends, longest the next batch waits for as "
                                 "many new items as it answered (its clients' next requests, which would otherwise "
                                 "wait for a whole batch more: with one GPU worker, 64 closed-loop clients make "
                                 "alternating batches of 32); only where clients look like a closed loop that came "
                                 "back quickly last time (app/scheduler.py). 0: off, until a GPU run measures it "
                                 "(scripts/gpu-check.sh). Batch by batch with one worker only.")
    long_batch_items: int | None = Field(None, ge=0, le=100_000, description="Most sentences in a batch of a "
                                         "request too long for one batch (a file, a catalog), whose sentences then "
                                         "go in batches of their own only, so that a request sent meanwhile waits "
                                         "for a short batch, not a full one; 0: no limit. Unset: 8 on the CPU (where "
                                         "a batch of 8 costs no more a sentence than one of 32), none on a GPU.")
    worker_nice: int | None = Field(None, ge=0, le=19, description="How much lower the workers' CPU priority is "
                                    "than the server's (Unix niceness added to theirs), so that on a busy CPU the "
                                    "HTTP processes (requests read, rejected, answered; /health, /metrics) run as "
                                    "soon as they have work instead of waiting behind decoding. Unset: 5 on the "
                                    "CPU, 0 on a GPU (where a worker's thread keeps the GPU fed).")
    max_items: int = Field(64, ge=1, description="Most texts in one request.")
    max_chars: int = Field(5000, ge=1, description="Most characters in one text (the model's token limit applies "
                           "too).")
    max_body_bytes: int = Field(4 * 2**20, ge=1024, description="Largest request body in bytes, refused with 413 "
                                "while it is read (64 texts of 5,000 characters fit even with every character "
                                "JSON-escaped).")
    max_file_bytes: int = Field(20 * 2**20, ge=1024, description="Largest body of POST /translate_file in bytes.")
    max_segments: int = Field(1024, ge=1, description="Most sentences (and HTML text runs) one LibreTranslate "
                              "request may split into; all of them are queued as one job.")
    max_queue_items: int = Field(4096, ge=1, description="Most items waiting for a worker; beyond it requests get "
                                 "429.")
    request_timeout_s: float = Field(30.0, gt=0, description="Deadline of one translate request; past it, 504.")
    default_beam_size: int = Field(4, ge=1, le=16, description="Beam size of LibreTranslate-compatible calls.")
    max_attention_values: int = Field(4_000_000, ge=1, description="Most attention values (layers x heads x "
                                      "target x source tokens) one /v1/translate request may return or store "
                                      "(include_attention, alignments); ~16 MB as float32, more as JSON. Counted "
                                      "before decoding, each text at the most target tokens it may get "
                                      "(max_length, else 1.5 x its source tokens + 10), which is ~1.4x what a "
                                      "translation usually has: the shipped models' largest text (512 tokens) "
                                      "fits with one hypothesis, 200 tokens with four.")
    body_bytes_in_flight: int = Field(256 * 2**20, ge=1024, description="Most bytes of request bodies the "
                                      "requests in flight in one HTTP process may hold together, counted as they "
                                      "arrive until each is answered; past it a body larger than 64 KiB gets 503, "
                                      "and smaller ones past a quarter more (one request alone always goes "
                                      "through).")
    client_share_in_flight: float = Field(0.25, gt=0, le=1, description="The share of "
                                          "NMT_BODY_BYTES_IN_FLIGHT, of NMT_ATTENTION_IN_FLIGHT_VALUES and of "
                                          "NMT_MAX_QUEUE_ITEMS (texts waiting for or in a worker) the "
                                          "requests of one client address may hold together; past it, 429 for that "
                                          "client while others still go through (a client's one request alone is "
                                          "held to the whole budget only; 1: no share).")
    max_head_bytes: int = Field(64 * 1024, ge=4096, description="Largest request line and headers together, in "
                                "bytes; past it 431 and the connection closed (`nmt serve`).")
    read_timeout_s: float = Field(30.0, gt=0, description="Seconds a client may take to send a request's head "
                                  "(request line and headers: past it the connection is closed) and between two "
                                  "pieces of its body (408).")
    send_timeout_s: float = Field(30.0, gt=0, description="Seconds a client may take no part of its "
                                  "response (sent in pieces of 256 KiB as it reads them) before the server "
                                  "closes its connection, releasing what the response held.")
    attention_in_flight_values: int = Field(16_000_000, ge=1, description="Most attention values the "
                                            "/v1/translate requests and GET /v1/alignments answers in flight in one "
                                            "HTTP process may hold together, each counted as for "
                                            "NMT_MAX_ATTENTION_VALUES from before it is decoded (or read) until its "
                                            "client has read its response; past it, 429 (one "
                                            "request alone always goes through).")
    alignment_max_items: int = Field(10_000, ge=0, description="Most stored alignments.")
    alignment_max_bytes: int = Field(256 * 2**20, ge=0, description="Most bytes of stored attention arrays.")
    client_alignment_bytes: int = Field(64 * 2**20, ge=0, description="Bytes of alignments one client (API key, "
                                        "else address) may store within NMT_ALIGNMENT_TTL_S; past it, 429 (0: no "
                                        "quota).")
    alignment_ttl_s: float = Field(3600.0, gt=0, description="Seconds a stored alignment lives.")
    cors_origins: CommaList = Field([], description="Origins allowed by CORS ('*' for any); empty: CORS off.")
    api_keys: CommaList = Field([], description="Keys without limits, given here: when set, every call needs a "
                                "key (body 'api_key' or header 'X-API-Key'), one of these or one of NMT_KEYS_DB.")
    keys_db: str = Field("db/api_keys.db", description="SQLite file of the API keys with limits, managed with "
                         "`nmt keys add|list|remove` (while the server runs); a missing file holds no keys.")
    require_api_key: bool = Field(False, description="Every call needs a valid key (implied by NMT_API_KEYS).")
    req_limit: int = Field(0, ge=0, description="Requests per minute a client without a key may make, counted per "
                           "address (a list of texts counts one per text); 0: no limit. A key's req_limit "
                           "replaces it.")
    char_limit: int = Field(0, ge=0, description="Characters per text for clients without a key's own char_limit; "
                            "0: NMT_MAX_CHARS. Never above NMT_MAX_CHARS.")
    max_glossaries_per_key: int = Field(100, ge=1, description="Stored glossaries one API key may keep (clients "
                                        "without a key share one allowance).")
    max_glossary_bytes_per_key: int = Field(16 * 2**20, ge=1024, description="Bytes of stored glossaries one API "
                                            "key may keep.")
    text_cpu_budget_s: float = Field(10.0, gt=0, description="CPU seconds one request's (or file's) texts may take to "
                                     "be cut into sentences and masked; past it, 413. Every step is linear: at the "
                                     "default limits a request takes well under a second.")
    max_key_failures: int = Field(20, ge=0, description="Wrong API keys one client address may send per minute; "
                                  "past it, 429 (0: no limit).")
    trust_forwarded_for: bool = Field(False, description="Count limits by the last X-Forwarded-For address, the "
                                      "one the proxy in front of the service appended (set it behind one proxy that "
                                      "appends to that header, as nginx's $proxy_add_x_forwarded_for does, and only "
                                      "then); the addresses left of it are the client's to write.")
    suggestions: bool = Field(False, description="Accept POST /suggest (stored in NMT_SUGGESTIONS_DB).")
    suggestions_db: str = Field("db/suggestions.db", description="SQLite file of the suggestions.")
    suggestions_max_bytes: int = Field(64 * 2**20, ge=0, description="Most bytes of suggested texts the file keeps "
                                       "(UTF-8; 0: no limit); past it POST /suggest answers 507 until the operator "
                                       "reads and clears the file.")
    files_translation: bool = Field(True, description="Offer POST /translate_file.")
    file_ttl_s: float = Field(1800.0, gt=0, description="Seconds a translated file can be downloaded.")
    file_store_bytes: int = Field(256 * 2**20, ge=0, description="Most bytes of translated files kept at once (the "
                                  "oldest go first).")
    client_file_bytes: int = Field(64 * 2**20, ge=0, description="Bytes of translated files one client (API key, "
                                   "else address) may store within NMT_FILE_TTL_S; past it, 429 (0: no quota).")
    max_file_chars: int = Field(200_000, ge=1, description="Most characters of text in one file to translate.")
    file_timeout_s: float = Field(600.0, gt=0, description="Deadline of one file translation; past it, 504.")
    # Untrusted files: what one may hold, checked before a parser sees it (SECURITY.md)
    max_file_texts: int = Field(20_000, ge=1, description="Most texts (paragraphs, subtitle cues, catalog "
                                "entries, chapters) in one file to translate.")
    max_zip_members: int = Field(2000, ge=1, description="Most members of a zip-based document (docx, pptx, odt, "
                                 "odp, epub).")
    max_unzipped_bytes: int = Field(100 * 2**20, ge=1024, description="Most bytes a zip-based document may inflate "
                                    "to, all members together; counted while inflating, whatever the members' "
                                    "headers declare.")
    max_zip_ratio: float = Field(100.0, ge=1, description="Highest compression ratio of a zip member larger than "
                                 "1 MiB.")
    max_xml_depth: int = Field(256, ge=8, description="Deepest nesting of XML elements in a document's parts.")
    document_memory_bytes: int = Field(256 * 2**20, ge=64 * 2**20, description="Address space of the process "
                                       "that reads or writes one document (RLIMIT_AS); past it the file gets 413.")
    document_timeout_s: float = Field(60.0, gt=0, description="Longest one document may take to be read or "
                                      "written back (each); past it the reader is killed and the file gets 413.")
    document_parsers: int = Field(1, ge=1, le=64, description="Document reader processes running at once; other "
                                  "files wait their turn within NMT_DOCUMENT_TIMEOUT_S.")
    # Untrusted request bodies
    max_html_depth: int = Field(512, ge=8, description="Deepest nesting of unclosed HTML elements in a text "
                                "(format html) or an HTML file.")
    max_json_depth: int = Field(32, ge=4, description="Deepest nesting of arrays and objects in a JSON body.")
    max_json_values: int = Field(10_000, ge=16, description="Most values (strings, numbers, arrays, objects...) "
                                 "in a JSON body.")
    max_form_fields: int = Field(1000, ge=8, description="Most fields (and files) in a form body.")
    detect_languages: CommaList = Field([], description="Languages POST /detect and source 'auto' choose among "
                                        "(ISO 639-1 codes); empty: all 75 the detector (lingua) knows, ~1.2 GB of "
                                        "models once loaded; 'none': detection off.")
    detect_preload: bool = Field(True, description="Load the detector's language models before the port opens "
                                 "(~30 s for all 75 languages on 2 cores). Off: they load on the first detection, "
                                 "and every request waits meanwhile.")
    detect_low_accuracy: bool = Field(False, description="Detect with lingua's small models (~80 MB; on UI strings "
                                      "66% right instead of 80%, see bench/langid.py).")
    cache: bool = Field(True, description="Translation cache: the same text, model and options decoded once "
                        "(app/cache.py); never for calls with attention or alignments.")
    cache_scope: Literal["key", "shared"] = Field("key", description="Who shares cached translations: 'key', "
                                                "each API key its own (clients without a key share theirs), so that "
                                                "how fast an answer comes tells no key what another translated; "
                                                "'shared', everyone.")
    cache_bytes: int = Field(64 * 2**20, ge=0, description="Bytes of cached translations this process keeps.")
    cache_ttl_s: float = Field(86400.0, gt=0, description="Seconds a cached translation lives.")
    redis_url: str = Field("", description="Redis shared by every replica (redis://host:6379/0): rate-limit counts, "
                           "translated files, alignments and the translation cache (app/storage.py); empty: this "
                           "process keeps them.")
    http_processes: int = Field(0, ge=0, le=64, description="HTTP processes of `nmt serve`: 1, one process does "
                                "everything; N > 1, N processes share the port and do the HTTP and text work "
                                "(~1 ms of CPU a request), in front of one engine process that batches all their "
                                "requests on the workers (app/engine.py). What one stores and another serves "
                                "(alignments, files, rate-limit counts) is in Redis at NMT_REDIS_URL, else in the "
                                "engine process's memory; without Redis each caches its own translations. 0: 1 on "
                                "the CPU (more only add work on a few cores); on a GPU one per 4 cores, at most 4 "
                                "(on a 16-core H200 host, four gave 1.5-2.1x the sentences/s of one).")
    engine_socket: str = Field("", description="Set by `nmt serve` for its HTTP processes (NMT_HTTP_PROCESSES > 1): "
                               "the engine process's Unix socket. Not for operators.")
    access_log: bool = Field(True, description="`nmt serve` logs a line per request (uvicorn's access log).")
    host: str = Field("127.0.0.1", description="Bind address of `nmt serve`.")
    port: int = Field(8000, ge=0, le=65535, description="Port of `nmt serve`.")
    worker_start_timeout_s: float = Field(600.0, gt=0, description="Longest a worker may take to load its models.")
    shutdown_timeout_s: float = Field(30.0, ge=0, description="On shutdown, longest to wait for queued work.")
    fault_injection: bool = Field(False, description="Test only: workers fail on magic inputs (see app/worker.py).")

    @field_validator("model_dirs", "cors_origins", "api_keys", "detect_languages", mode="before")
    @classmethod
    def _lists(cls, value):
        return _split(value)

    @field_validator("batch_tokens")
    @classmethod
    def _budget(cls, value: int) -> int:
        if 0 < value < 16:
            raise ValueError("batch_tokens is 0 (the device's default) or at least 16")
        return value

    def batch_token_budget(self, device_kind: str) -> int:
        """batch_tokens, or its default for the device kind ('cpu' or 'cuda')."""
        if self.batch_tokens:
            return self.batch_tokens
        return 32768 if device_kind == "cuda" else 4096

    def batch_wait_s(self, device_kind: str) -> float:
        """max_wait_ms in seconds, or its default for the device kind ('cpu' or 'cuda')."""
        if self.max_wait_ms is not None:
            return self.max_wait_ms / 1000
        return 0.005 if device_kind == "cuda" else 0.0

    def long_job_batch_items(self, device_kind: str) -> int:
        """long_batch_items, or its default for the device kind ('cpu' or 'cuda'); 0: no limit."""
        if self.long_batch_items is not None:
            return self.long_batch_items
        return 0 if device_kind == "cuda" else 8

    def worker_niceness(self, device_kind: str) -> int:
        """worker_nice, or its default for the device kind ('cpu' or 'cuda')."""
        if self.worker_nice is not None:
            return self.worker_nice
        return 0 if device_kind == "cuda" else 5

    def runs_batches(self) -> bool:
        """Whether the workers keep running batches (running_batch, 'auto' made concrete: where running
        batches measure better; today on neither device, BENCHMARKS.md)."""
        return self.running_batch == "true"

    def device_kind(self, cuda_devices: int) -> str:
        """'cuda' or 'cpu': where the workers decode (device, 'auto' made concrete)."""
        return "cuda" if self.device == "cuda" or (self.device == "auto" and cuda_devices) else "cpu"

    def http_process_count(self, cuda_devices: int, cores: int) -> int:
        """http_processes, 0 made concrete for the device and this many usable cores."""
        if self.http_processes:
            return self.http_processes
        return min(4, max(1, cores // 4)) if self.device_kind(cuda_devices) == "cuda" else 1

    def worker_layout(self, cuda_devices: int) -> tuple[str, list[str], int]:
        """(device kind, one device string per worker, threads per worker).

        On CUDA one worker per GPU unless NMT_WORKERS asks for more, dealt round the GPUs: two on
        one GPU run their batches side by side, one's kernels in the gaps the other's host leaves
        (scripts/gpu-check.sh measures it). On CPU the split between processes and threads is the
        operator's choice.
        """
        kind = self.device_kind(cuda_devices)
        if kind == "cuda":
            if not cuda_devices:
                raise ValueError("NMT_DEVICE=cuda but no CUDA device is visible")
            if self.dtype == "int8":
                raise ValueError("NMT_DTYPE=int8 runs on the CPU only: set NMT_DEVICE=cpu or another dtype")
            count = self.workers or cuda_devices
            return kind, [f"cuda:{i % cuda_devices}" for i in range(count)], self.threads_per_worker or 1
        cores = os.cpu_count() or 1
        threads = self.threads_per_worker or (1 if cores <= 4 else 4)
        count = self.workers or max(1, cores // threads)
        return kind, ["cpu"] * count, threads
