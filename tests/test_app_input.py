"""Bad input never reaches the model or a 500: lone surrogates and invalid UTF-8 are a 400, control
and bidi-control characters are removed before the model reads a text, and request bodies are
capped while they are read (413)."""

from __future__ import annotations

import pytest

from app.settings import Settings
from model.clean import clean_text, lone_surrogate
from tests.conftest import ready_client

MAX_BODY = 4096


@pytest.fixture(scope="module")
def client(tiny_sentinel_checkpoint):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        max_body_bytes=MAX_BODY, max_file_bytes=2 * MAX_BODY)
    with ready_client(settings) as c:
        yield c


def error(response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]


JSON = {"content-type": "application/json"}


def test_clean_text_removes_controls_and_bidi_overrides_and_keeps_the_rest():
    assert clean_text("RTL\u202eoverride\u202c and\x00 bell\x07") == "RTLoverride and bell"
    assert clean_text("a\x0bb\x0cc\x85d\u2028e\u2029f") == "a\nb\nc\nd\ne\nf"
    assert clean_text("\ufeffBOM \u200fmark") == "BOM mark"
    kept = "tab\tline\ncr\r nbsp\u00a0 emoji 👩\u200d💻 é \ue003 ¿?"
    assert clean_text(kept) == kept
    assert lone_surrogate("ok 😀") is None and lone_surrogate("Hi \ud800 there") == 3


@pytest.mark.parametrize("path, field", [("/translate", "q"), ("/v1/translate", "text")])
def test_lone_surrogate_is_a_400_naming_it(client, path, field):
    body = b'{"%s": "Hi \\ud800 there", "source": "en", "target": "de"}' % field.encode()
    assert "lone surrogate (U+D800) at character 3" in error(client.post(path, content=body, headers=JSON))
    listed = b'{"%s": ["fine", "x\\udfff"], "source": "en", "target": "de"}' % field.encode()
    assert error(client.post(path, content=listed, headers=JSON)).startswith(f"{field}[1] holds a lone surrogate")


def test_surrogates_in_other_fields_are_400_too(client):
    for body in (b'{"q": "Hi", "source": "\\ud800", "target": "de"}',
                 b'{"q": "Hi", "source": "en", "target": "de", "format": "\\udc00"}'):
        error(client.post("/translate", content=body, headers=JSON))
    body = b'{"text": "Hi", "source": "en", "target": "\\udc00"}'
    error(client.post("/v1/translate", content=body, headers=JSON))


def test_invalid_utf8_is_a_400_in_json_and_both_form_encodings(client):
    assert "not valid UTF-8" in error(client.post("/translate", headers=JSON,
                                                  content=b'{"q": "Hi \xff", "source": "en", "target": "de"}'))
    error(client.post("/v1/translate", headers=JSON, content=b'{"text": "Hi \xff", "source": "en", "target": "de"}'))
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert "not valid UTF-8" in error(client.post("/translate", headers=form,
                                                  content=b"q=Hi%FF+there&source=en&target=de"))
    assert "not valid UTF-8" in error(client.post("/translate", headers=form,
                                                  content=b"q=Hi \xff there&source=en&target=de"))
    raw = client.post("/translate", headers=form, content="q=Grüße, Welt.&source=en&target=de".encode())  # curl -d
    encoded = client.post("/translate", headers=form, content=b"q=Gr%C3%BC%C3%9Fe%2C+Welt.&source=en&target=de")
    assert raw.status_code == 200 and raw.json() == encoded.json()
    multipart = client.post("/translate", files={"q": (None, b"Hi \xff there")}, data={"source": "en", "target": "de"})
    assert error(multipart) == "form field 'q' is not valid UTF-8 (byte 0xFF at offset 3): send UTF-8 text"
    good = client.post("/translate", files={"q": (None, "Grüße".encode())}, data={"source": "en", "target": "de"})
    assert good.status_code == 200, good.text


def test_control_and_bidi_characters_do_not_reach_the_model(client):
    clean = client.post("/v1/translate", json={"text": "Open the file.", "source": "en", "target": "de",
                                                "include_attention": True}).json()
    dirty = client.post("/v1/translate", json={"text": "Open\x00 the\u202e file.\x07", "source": "en", "target": "de",
                                                "include_attention": True}).json()
    assert dirty["translations"][0]["source_tokens"] == clean["translations"][0]["source_tokens"]
    assert dirty["translations"][0]["text"] == clean["translations"][0]["text"]
    lt = client.post("/translate", json={"q": "Open\u2066 the file.\x1b", "source": "en", "target": "de"})
    assert lt.json()["translatedText"] == client.post("/translate", json={"q": "Open the file.", "source": "en",
                                                                          "target": "de"}).json()["translatedText"]
    assert error(client.post("/translate", json={"q": "\x00\x07\u202e", "source": "en", "target": "de"})) == \
        "q is empty once control characters are removed"


def test_body_over_the_cap_is_413_whether_declared_or_streamed(client):
    big = {"q": "word " * MAX_BODY, "source": "en", "target": "de"}
    message = error(client.post("/translate", json=big), 413)
    assert message == f"request body larger than {MAX_BODY:,} bytes (NMT_MAX_BODY_BYTES): send less per request"
    error(client.post("/v1/translate", json={**big, "text": big["q"]}), 413)

    def chunks():  # no Content-Length: the cap is met while reading
        yield b'{"q": "'
        for _ in range(64):
            yield b"word " * 100
        yield b'", "source": "en", "target": "de"}'

    for path in ("/translate", "/v1/translate", "/detect"):
        assert "NMT_MAX_BODY_BYTES" in error(client.post(path, content=chunks(), headers=JSON), 413)
    # under the cap, a streamed body is read as usual
    small = client.post("/translate", content=iter([b'{"q": "Open the file.", ', b'"source": "en", "target": "de"}']),
                        headers=JSON)
    assert small.status_code == 200, small.text
    assert 'route="/translate",status="413"' in client.get("/metrics").text
