"""LibreTranslate's /translate with format 'html' and sentence splitting, through the ASGI app with
the tiny random model. Expected outputs are built from what the service returns for the plain
sentences, so nothing depends on what the random model says."""

from __future__ import annotations

import re
from html import escape

import pytest

from app.settings import Settings
from tests.conftest import ready_client

MAX_SEGMENTS = 8
TAG = re.compile(r"<[^>]*>")
MASTODON = ('<p>Hello <a href="https://x.y/@bob" class="u-url mention">@<span>bob</span></a>, how are you? '
            'I am fine.</p><p>Second paragraph &amp; more.</p>')
MASTODON_SENTENCES = ["Hello", "bob", ", how are you?", "I am fine.", "Second paragraph & more."]


def mastodon_translated(t: list[str]) -> str:
    e = [escape(s, quote=False) for s in t]
    return (f'<p>{e[0]} <a href="https://x.y/@bob" class="u-url mention">@<span>{e[1]}</span></a>{e[2]} {e[3]}'
            f'</p><p>{e[4]}</p>')


@pytest.fixture(scope="module")
def client(tiny_checkpoint):
    settings = Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        max_segments=MAX_SEGMENTS)
    with ready_client(settings) as c:
        yield c


def lt(client, status=200, **body) -> dict:
    r = client.post("/translate", json={"source": "en", "target": "de", **body})
    assert r.status_code == status, r.text
    return r.json()


def plain(client, sentences: list[str], alternatives: int = 0) -> list[list[str]]:
    """Each sentence translated on its own as plain text: its best translation, then alternatives."""
    body = lt(client, q=sentences + ["Hello world."], format="text", alternatives=alternatives)  # q a list: answers too
    best = body["translatedText"][:-1]
    others = body.get("alternatives", [[]] * len(sentences))
    return [[b] + a for b, a in zip(best, others)]


def test_html_in_html_out(client):
    t = [h[0] for h in plain(client, MASTODON_SENTENCES)]
    out = lt(client, q=MASTODON, format="html")["translatedText"]
    assert out == mastodon_translated(t)
    assert TAG.findall(out) == TAG.findall(MASTODON)  # the same tags and attributes, in the same order


def test_code_and_notranslate_are_kept_verbatim(client):
    document = ('<p>Run <code>ls &amp;&amp; cd</code> now.</p><p translate="no">Keep this. <b>And this.</b></p>'
                '<p>See <span class="notranslate">Straße &amp; <i>Weg</i></span> there.</p><pre>print(1)</pre>')
    t = [escape(h[0], quote=False) for h in plain(client, ["Run", "now.", "See", "there."])]
    assert lt(client, q=document, format="html")["translatedText"] == (
        f'<p>{t[0]} <code>ls &amp;&amp; cd</code> {t[1]}</p><p translate="no">Keep this. <b>And this.</b></p>'
        f'<p>{t[2]} <span class="notranslate">Straße &amp; <i>Weg</i></span> {t[3]}</p><pre>print(1)</pre>')


def test_text_is_translated_sentence_by_sentence(client):
    t = [h[0] for h in plain(client, ["Open the file.", "Save your changes!", "Hello world."])]
    text = "Open the file. Save your changes!\nHello world."
    assert lt(client, q=text)["translatedText"] == f"{t[0]} {t[1]}\n{t[2]}"
    assert lt(client, q=" 42 ")["translatedText"] == " 42 "  # no letter, nothing to translate


def test_q_list_keeps_order_and_entries_without_text(client):
    q = [MASTODON, "<p></p>", "", "<p>Click the button. Print the document.</p>", "<br>🎉 42"]
    alone = [lt(client, q=text, format="html")["translatedText"] for text in q]
    assert alone[1:3] == ["<p></p>", ""] and alone[4] == "<br>🎉 42"
    assert lt(client, q=q, format="html")["translatedText"] == alone


def test_html_without_text_does_not_call_the_model(client, monkeypatch):
    async def refuse(*args):
        raise AssertionError("the model was called")

    monkeypatch.setattr(client.app.state.service, "translate", refuse)
    q = ["<p></p>", '<p><a href="https://x.y">@</a> :) 123</p>']
    assert lt(client, q=q, format="html", alternatives=1) == {"translatedText": q, "alternatives": [[], []]}


def test_alternatives_take_the_kth_hypothesis_of_every_sentence(client):
    hypotheses = plain(client, MASTODON_SENTENCES, alternatives=2)
    count = min(len(h) for h in hypotheses)
    assert count == 3  # beam 4 gives every sentence its two alternatives
    body = lt(client, q=MASTODON, format="html", alternatives=2)
    assert body["translatedText"] == mastodon_translated([h[0] for h in hypotheses])
    assert body["alternatives"] == [mastodon_translated([h[k] for h in hypotheses]) for k in range(1, count)]


def test_segment_limit_counts_sentences_of_all_entries(client):
    q = ["One. Two. Three. Four.", "<p>Five.</p><p>Six. Seven. Eight.</p>"]
    assert len(lt(client, q=q, format="html")["translatedText"]) == 2
    r = client.post("/translate", json={"q": q + ["Nine."], "source": "en", "target": "de", "format": "html"})
    assert r.status_code == 400
    assert r.json()["error"] == (f"q splits into 9 sentences; at most {MAX_SEGMENTS} per request "
                                 "(NMT_MAX_SEGMENTS): send fewer or shorter texts")


def test_a_sentence_over_the_token_limit_is_a_clear_400(client):
    long_sentence = "Open the file and save your changes " * 20 + "now."
    for format in ("text", "html"):
        r = client.post("/translate", json={"q": ["Hello.", f"<p>Fine. {long_sentence}</p>"], "source": "en",
                                            "target": "de", "format": format})
        assert r.status_code == 400
        assert re.fullmatch(r"a sentence of q\[1\] has \d+ tokens \(end of sentence included\); model en-de "
                            r"accepts at most 128: split the text", r.json()["error"]), r.json()


def test_mastodon_request_end_to_end(client, monkeypatch):
    spoiler = "Hello world"
    t = [escape(h[0], quote=False) for h in plain(client, ["Open the file.", "Click the button to print the "
                                                            "document!", "test", spoiler])]
    monkeypatch.setattr(client.app.state.service.settings, "api_keys", ["secret"])
    mention = ('<span class="h-card" translate="no"><a href="https://x.y/@bob" class="u-url mention">'
               '@<span>bob</span></a></span>')
    link = ('<a href="https://example.com/page" target="_blank" rel="nofollow noopener" translate="no">'
            '<span class="invisible">https://</span><span class="">example.com/page</span></a>')
    content = (f"<p>{mention} Open the file.<br />Click the button to print the document! {link}</p>"
               '<p><a href="https://x.y/tags/test" class="mention hashtag" rel="tag">#<span>test</span></a></p>')
    r = client.post("/translate", json={"q": [content, spoiler], "source": "auto", "target": "de",
                                        "format": "html", "api_key": "secret"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}] * 2
    out, spoiler_out = body["translatedText"]
    assert out == (f"<p>{mention} {t[0]}<br />{t[1]} {link}</p>"
                   f'<p><a href="https://x.y/tags/test" class="mention hashtag" rel="tag">#<span>{t[2]}</span>'
                   "</a></p>")
    assert spoiler_out == t[3]
