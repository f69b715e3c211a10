"""Untrusted files and bodies get a 4xx naming the limit and its setting, before anything builds
what they would inflate to: zip bombs (honest and lying headers), members by the thousand, deep
XML, entity declarations, subtitles by the hundred thousand, catalogs with endless plural forms,
deep HTML, deep or huge JSON, forms of many fields. The document reader's memory cap and deadline
are exercised on the reader itself. (Memory measured on a real server: test_untrusted_server.py.)"""

from __future__ import annotations

import asyncio
import base64
import json
import os

import pytest

from app.body_limit import json_shape_problem
from app.documents.isolated import DocumentError, DocumentReader
from app.documents.limits import Limits
from app.settings import Settings
from tests import bombs
from tests.conftest import ready_client


@pytest.fixture(scope="module")
def client(tiny_sentinel_checkpoint):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2)
    with ready_client(settings) as c:
        yield c


def upload(client, name: str, data: bytes):
    return client.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "de"})


FILE_BOMBS = [  # (name, builder, status, what the message names)
    ("bomb.docx", lambda: bombs.docx_bomb(1.5), 413, "NMT_MAX_UNZIPPED_BYTES"),
    ("bomb.pptx", lambda: bombs.ratio_bomb(bombs.pptx_sample(), "ppt/media/blob.bin"), 413, "NMT_MAX_ZIP_RATIO"),
    ("bomb.odt", lambda: bombs.ratio_bomb(bombs.odt_sample(), "content.xml"), 413, "NMT_MAX_ZIP_RATIO"),
    ("bomb.epub", lambda: bombs.with_member(bombs.epub_sample(), "EPUB/c0.xhtml", (b"<p>aaaa</p>" * 10**5, 150)),
     413, "NMT_MAX_UNZIPPED_BYTES"),
    ("lying.docx", bombs.lying_bomb, 400, "damaged zip member 'word/document.xml'"),
    ("chapters.epub", bombs.many_members, 413, "NMT_MAX_ZIP_MEMBERS"),
    ("deep.docx", bombs.deep_xml_docx, 413, "NMT_MAX_XML_DEPTH"),
    ("laughs.docx", bombs.laughs_docx, 400, "declares XML entities"),
    ("cues.srt", bombs.srt_cues, 413, "NMT_MAX_FILE_TEXTS"),
    ("plurals.po", bombs.po_plurals, 400, "plural forms; a language has at most 6"),
    ("deep.html", bombs.deep_html, 400, "NMT_MAX_HTML_DEPTH"),
    ("truncated.docx", lambda: bombs.docx_sample()[:5000], 400, "cannot read it as .docx"),
]


@pytest.mark.parametrize("name,build,status,named", FILE_BOMBS, ids=[b[0] for b in FILE_BOMBS])
def test_hostile_files_get_a_4xx_naming_the_limit(client, name, build, status, named):
    r = upload(client, name, build())
    assert r.status_code == status, r.text
    assert named in r.json()["error"] and r.json()["error"].startswith(f"{name}: ")


def test_the_limits_are_settings(client, monkeypatch):
    """A lower member limit refuses what the default takes: the reader is given the settings."""
    reader = client.app.state.service.documents
    book = bombs.epub_sample(chapters=30)
    assert upload(client, "book.epub", book).status_code == 200
    monkeypatch.setattr(reader, "limits", Limits(max_zip_members=10))
    r = upload(client, "book.epub", book)
    assert r.status_code == 413 and "at most 10 (NMT_MAX_ZIP_MEMBERS)" in r.json()["error"]


def _paragraphs_docx(megabytes: int) -> bytes:
    """A docx of many short paragraphs of random letters: no ratio or budget limit stops it, and
    its tree takes many times its size."""
    words = base64.b32encode(os.urandom(megabytes * 2**20 // 8)).decode().lower()
    paragraphs = "".join(f"<w:p><w:r><w:t>{words[k:k + 8]}</w:t></w:r></w:p>" for k in range(0, len(words), 8))
    xml = f'<?xml version="1.0"?><w:document {bombs.W}><w:body>{paragraphs}</w:body></w:document>'
    return bombs.with_member(bombs.docx_sample(), "word/document.xml", xml.encode())


def test_the_reader_is_killed_past_its_memory_cap_or_its_deadline():
    big = _paragraphs_docx(12)
    reader = DocumentReader(Limits(memory_bytes=96 * 2**20))
    with pytest.raises(DocumentError) as refused:
        asyncio.run(reader.extract("big.docx", big))
    assert refused.value.status == 413 and "NMT_DOCUMENT_MEMORY_BYTES" in refused.value.message

    slow = DocumentReader(Limits(timeout_s=0.01))
    with pytest.raises(DocumentError) as late:
        asyncio.run(slow.extract("a.docx", bombs.docx_sample()))
    assert late.value.status == 413 and "NMT_DOCUMENT_TIMEOUT_S" in late.value.message

    texts, html = asyncio.run(DocumentReader(Limits()).extract("a.docx", bombs.docx_sample("Save it.")))
    assert texts == ["Save it."] and html == [False]


def test_deep_html_in_a_request(client):
    deep = "<b>" * 600 + "Open the file." + "</b>" * 600
    r = client.post("/translate", json={"q": deep, "source": "en", "target": "de", "format": "html"})
    assert r.status_code == 400 and "more than 512 deep (NMT_MAX_HTML_DEPTH)" in r.json()["error"]
    shallow = "<b>" * 20 + "Open the file." + "</b>" * 20
    assert client.post("/translate", json={"q": shallow, "source": "en", "target": "de", "format": "html"}) \
        .status_code == 200


@pytest.mark.parametrize("path", ["/translate", "/v1/translate", "/detect"])
def test_deep_or_huge_json_bodies(client, path):
    headers = {"content-type": "application/json"}
    r = client.post(path, content=bombs.deep_json(), headers=headers)
    assert r.status_code == 400 and "NMT_MAX_JSON_DEPTH" in r.json()["error"]
    r = client.post(path, content=bombs.many_json_values(), headers=headers)
    assert r.status_code == 400 and "NMT_MAX_JSON_VALUES" in r.json()["error"]
    texts = client.post(path, content=b'{"q": [' + b'"a",' * 20_000 + b'"a"]}', headers=headers)
    assert texts.status_code == 400 and "NMT_MAX_JSON_VALUES" in texts.json()["error"]
    # brackets and commas inside strings are text, not structure
    text = "[{" * 1000 + ", " * 1000
    ok = client.post("/translate", json={"q": text, "source": "en", "target": "de"})
    assert ok.status_code == 200, ok.text


def test_forms_of_many_fields(client):
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = client.post("/translate", content=bombs.many_form_fields(), headers=form)
    assert r.status_code == 400 and "more than 1,000 fields (NMT_MAX_FORM_FIELDS)" in r.json()["error"]
    r = client.post("/translate_file", data={f"f{k}": "x" for k in range(1500)},
                    files={"file": ("a.txt", b"Open the file.")})
    assert r.status_code == 400 and "NMT_MAX_FORM_FIELDS" in r.json()["error"]
    r = client.post("/translate?" + "&".join(f"x{k}=1" for k in range(1200)), data={"q": "Hi", "source": "en",
                                                                                   "target": "de"})
    assert r.status_code == 400 and "NMT_MAX_FORM_FIELDS" in r.json()["error"]


def test_many_small_texts(client):
    r = client.post("/translate", json={"q": ["Hi"] * 65, "source": "en", "target": "de"})
    assert r.status_code == 400 and "NMT_MAX_ITEMS" in r.json()["error"]
    r = client.post("/v1/translate", json={"text": ["Hi"] * 65, "source": "en", "target": "de"})
    assert r.status_code == 400 and "64" in r.json()["error"]


def test_json_shape_counts_brackets_and_commas_outside_strings_only():
    inside_strings = json.dumps({"q": "[{" * 100 + "," * 20_000, "source": "en"}).encode()
    assert json_shape_problem(inside_strings, 32, 10_000) is None
    assert "32 deep" in json_shape_problem(b"[" * 33 + b"]" * 33, 32, 10_000)
    assert json_shape_problem(b"[" * 32 + b"]" * 32, 32, 10_000) is None
    assert "10,000 values" in json_shape_problem(json.dumps(list(range(10_000))).encode(), 32, 10_000)
    assert json_shape_problem(json.dumps(list(range(9_998))).encode(), 32, 10_000) is None
