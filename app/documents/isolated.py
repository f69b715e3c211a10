"""Documents are read and written in a process of their own, with a memory cap and a deadline.

The HTTP process never parses an uploaded file: it hands the bytes to a short-lived child

    reader = DocumentReader(limits, parsers=1)
    texts, html = await reader.extract("guide.docx", data)        # checks, then parses
    data = await reader.rebuild("guide.docx", data, translations, "de")  # parses again, writes

which caps its own address space (RLIMIT_AS) and CPU time before it reads a byte, runs the
checks of limits.py, then the format's parser. A child that passes its memory or its deadline is
killed and the request gets a 413 naming the setting; the parsed tree dies with the child, so the
server's memory is where it was. `parsers` children run at once; more requests wait their turn,
within their deadline.

The child speaks JSON: argv[1] holds the limits; stdin one JSON line (the request), then the
file's bytes; stdout one JSON line (the answer or {"error", "status"}), then for `rebuild` the
written file's bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
import time
from dataclasses import asdict

from app import documents
from app.documents.limits import Limits, TooLarge, check_file

log = logging.getLogger("uvicorn.error")


class DocumentError(Exception):
    """The file cannot be read or written within the limits: `status` is 400 or 413."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class DocumentReader:
    def __init__(self, limits: Limits, parsers: int = 1):
        self.limits = limits
        self.slots = asyncio.Semaphore(parsers)

    async def extract(self, filename: str, data: bytes) -> tuple[list[str], list[bool]]:
        """The file's texts and, per text, whether it is HTML."""
        answer, _ = await self._run({"op": "extract", "filename": filename}, data)
        return answer["texts"], answer["html"]

    async def rebuild(self, filename: str, data: bytes, translations: list[str], target: str) -> bytes:
        """The file with its texts replaced by `translations` (one per text `extract` gave)."""
        request = {"op": "rebuild", "filename": filename, "translations": translations, "target": target}
        _, written = await self._run(request, data)
        return written

    async def _run(self, request: dict, data: bytes) -> tuple[dict, bytes]:
        limits = self.limits
        started = time.monotonic()
        async with self.slots:
            remaining = limits.timeout_s - (time.monotonic() - started)
            if remaining <= 0:
                raise DocumentError(413, _too_slow(limits))
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "app.documents.isolated", json.dumps(asdict(limits)),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            message = json.dumps(request, ensure_ascii=False).encode() + b"\n" + data
            try:
                out, err = await asyncio.wait_for(child.communicate(message), remaining)
            except TimeoutError:
                child.kill()
                await child.wait()
                raise DocumentError(413, _too_slow(limits)) from None
        line, _, rest = out.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            # killed by its memory cap (or its CPU limit) before it could answer
            log.warning("document reader exited %s: %s", child.returncode, err.decode(errors="replace")[-2000:])
            raise DocumentError(413, _too_big(limits)) from None
        if "error" in answer:
            raise DocumentError(answer["status"], answer["error"])
        return answer, rest


def _too_slow(limits: Limits) -> str:
    return (f"the file is too large or too complex: reading it took longer than {limits.timeout_s:g} s "
            "(NMT_DOCUMENT_TIMEOUT_S)")


def _too_big(limits: Limits) -> str:
    return (f"the file is too large or too complex: reading it needs more than {limits.memory_bytes:,} bytes "
            "of memory (NMT_DOCUMENT_MEMORY_BYTES)")


# --- the child -----------------------------------------------------------------------------------

def serve(request: dict, data: bytes, limits: Limits) -> tuple[dict, bytes]:
    filename = request["filename"]
    check_file(documents.extension(filename), data, limits)
    extracted = documents.read(filename, data)
    if len(extracted.texts) > limits.max_texts:
        raise TooLarge(f"it holds {len(extracted.texts):,} texts (paragraphs, cues, entries); at most "
                       f"{limits.max_texts:,} per file (NMT_MAX_FILE_TEXTS): split it")
    chars = sum(len(t) for t in extracted.texts)
    if chars > limits.max_chars:
        raise documents.FormatError(f"{chars:,} characters of text; at most {limits.max_chars:,} per file "
                                    "(NMT_MAX_FILE_CHARS): split it")
    if request["op"] == "extract":
        return {"texts": extracted.texts, "html": extracted.html}, b""
    translations = request["translations"]
    if len(translations) != len(extracted.texts):
        raise documents.FormatError(f"{len(translations)} translations for {len(extracted.texts)} texts")
    written = extracted.write(translations, request["target"])
    if len(written) > limits.max_output_bytes:
        raise TooLarge(f"the translated file has {len(written):,} bytes; the server keeps at most "
                       f"{limits.max_output_bytes:,} (NMT_FILE_STORE_BYTES)")
    return {"bytes": len(written)}, written


def _peak_rss() -> int:
    """This process's peak resident bytes (VmHWM: unlike getrusage's, not inherited across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    limits = Limits(**json.loads(sys.argv[1]))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    cpu = int(limits.timeout_s) + 5  # the parent's deadline kills it first; this is the backstop
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    line = sys.stdin.buffer.readline()
    data = sys.stdin.buffer.read()
    written = b""
    try:
        answer, written = serve(json.loads(line), data, limits)
    except TooLarge as e:
        answer = {"error": str(e), "status": 413}
    except documents.FormatError as e:
        # libxml2 reports a failed allocation as a syntax error ("unknown error"): a parser that
        # failed after filling most of its address space ran out of memory
        answer = {"error": _too_big(limits), "status": 413} if _peak_rss() > 0.6 * limits.memory_bytes \
            else {"error": str(e), "status": 400}
    except MemoryError:
        answer = {"error": _too_big(limits), "status": 413}
    except RecursionError:
        answer = {"error": "the file is too complex: its structure nests too deeply to read", "status": 413}
    except Exception as e:  # a writer refusing what its own reader read
        answer = {"error": f"cannot be written back ({type(e).__name__}: {e})", "status": 400}
    del data
    sys.stdout.buffer.write(json.dumps(answer, ensure_ascii=False).encode() + b"\n")
    sys.stdout.buffer.write(written)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
