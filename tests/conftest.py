"""Shared fixtures: a tiny randomly initialised checkpoint with a real SentencePiece model."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from model.checkpoint import save_checkpoint
from model.config import ModelConfig
from model.protect import SENTINELS
from model.terms import TERM_TAGS
from model.transformer import Transformer

# In-process test apps detect among all 75 languages; preloading them would cost each app ~30 s
# and 1.2 GB. The servers of the e2e tests set it back to true with a short language list.
os.environ.setdefault("NMT_DETECT_PRELOAD", "false")

TINY_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Open the file and save your changes.",
    "Öffnen Sie die Datei und speichern Sie Ihre Änderungen.",
    "Hello world, this is a small test sentence.",
    "Hallo Welt, dies ist ein kleiner Testsatz.",
    "Click the button to print the document.",
    "Klicken Sie auf die Schaltfläche, um das Dokument zu drucken.",
]

def train_tiny_spm(directory: Path, vocab_size: int = 96, sentinels: bool = False, byte_fallback: bool = False,
                   text: list[str] = TINY_TEXT, term_tags: bool = False) -> Path:
    """A joint SentencePiece model with pad=0, unk=1, bos=2, eos=3 (the project's convention);
    with `sentinels`, the sentinels of protected spans as user-defined pieces (model/protect.py);
    with `byte_fallback`, 256 byte pieces for what its pieces do not spell (as the shipped model);
    `text`: what it is trained on; with `term_tags`, also the tags of inline term annotations."""
    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory / "spm.txt"
    corpus.write_text("\n".join(text * 4) + "\n")
    prefix = directory / "spm"
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=vocab_size, model_type="unigram",
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, character_coverage=1.0, hard_vocab_limit=False,
        minloglevel=2, user_defined_symbols=(SENTINELS if sentinels else []) + (list(TERM_TAGS) if term_tags else []),
        byte_fallback=byte_fallback,
    )
    return prefix.with_suffix(".model")


def make_tiny_checkpoint(directory: Path, seed: int = 0, sentinels: bool = False, byte_fallback: bool = False,
                         text: list[str] = TINY_TEXT, term_annotations: bool = False, **config_overrides) -> Path:
    """A random tiny model saved in the checkpoint format; returns its directory. With
    `term_annotations` (and `sentinels`): a model that says it reads inline term annotations."""
    spm_path = train_tiny_spm(directory / "spm", 96 + 32 * sentinels + 2 * term_annotations + 256 * byte_fallback,
                              sentinels, byte_fallback, text, term_annotations)
    vocab = spm.SentencePieceProcessor(model_file=str(spm_path)).get_piece_size()
    # 4 heads of 16: a head size the C++ attention takes, so int8 models run the fused decoder step
    options = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=64, n_heads=4, d_ff=64,
                   encoder_layers=2, decoder_layers=2, share_embeddings=True, dropout=0.0,
                   max_positions=128, pad_id=0, unk_id=1, bos_id=2, eos_id=3, decoder_start_id=2)
    options.update(config_overrides)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**options))
    out = directory / "ckpt"
    save_checkpoint(out, model, spm_path, spm_path, {"source_lang": "en", "target_lang": "de",
                                                     **({"term_annotations": 0.25} if term_annotations else {})})
    return out


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_sentinel_checkpoint(tmp_path_factory) -> Path:
    """A tiny random model whose vocabulary has the sentinels of protected spans."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-sentinels"), sentinels=True)


@contextmanager
def ready_client(settings) -> Iterator:
    """A TestClient of the app with these settings (lifespan run), once /ready says 200."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").json()
            time.sleep(0.05)
        yield client


@contextmanager
def running_server(env: dict[str, str], ready_timeout_s: float = 90) -> Iterator[tuple[str, object]]:
    """A real server (uvicorn, app.main:app, its workers) on a free local port with these NMT_*
    settings over the environment's; (its URL, its Popen) once /ready says 200; stopped after."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # --no-proxy-headers as `nmt serve` runs it (app/serve.py)
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port",
                                str(port), "--log-level", "warning", "--no-proxy-headers"],
                               cwd=Path(__file__).resolve().parents[1],
                               env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:  # stopped even when it never gets ready
        wait_ready(url, [process], timeout_s=ready_timeout_s)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)


def wait_ready(url: str, processes: list, timeout_s: float = 120) -> None:
    """Until GET {url}/ready answers 200; fails when one of `processes` (Popen) exits first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = "no answer"  # what /ready said last, for the failure message

    def logs() -> str:  # the servers' output where they keep it (a `log` path on the Popen)
        return "".join(f"\n--- {p.log}:\n{Path(p.log).read_text(errors='replace')[-2000:]}"
                       for p in processes if getattr(p, "log", None) and Path(p.log).exists())

    while True:
        assert all(p.poll() is None for p in processes), f"a server process exited; /ready said: {last}{logs()}"
        assert time.monotonic() < deadline, f"{url} not ready after {timeout_s:g} s; /ready said: {last}{logs()}"
        try:
            response = httpx.get(f"{url}/ready")
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:500]}"
        except httpx.TransportError as error:
            last = f"{type(error).__name__}: {error}"
        time.sleep(0.1)


class Redis:
    """A real redis-server (Debian's) on a free local port, its append-only file on."""

    def __init__(self, directory: Path):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.directory = directory
        self.process = None  # its Popen while it runs

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import subprocess

        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxmemory", "256mb",
             "--maxmemory-policy", "volatile-lru"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)


@pytest.fixture(scope="module")
def redis(tmp_path_factory) -> Iterator[Redis]:
    """A redis-server for the module's tests (tests/test_app_redis.py, tests/test_app_http_processes.py)."""
    server = Redis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()
