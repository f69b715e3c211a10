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

    monkeypatch.setattr(client.app.state.service, "decode", refuse)
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
    assert [d["language"] for d in body["detectedLanguage"]] == ["en", "en"]
    out, spoiler_out = body["translatedText"]
    assert out == (f"<p>{mention} {t[0]}<br />{t[1]} {link}</p>"
                   f'<p><a href="https://x.y/tags/test" class="mention hashtag" rel="tag">#<span>{t[2]}</span>'
                   "</a></p>")
    assert spoiler_out == t[3]


@pytest.fixture(scope="module")
def span_client(tiny_sentinel_checkpoint):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2)
    with ready_client(settings) as c:
        yield c


def translated_items(client) -> float:
    lines = [x for x in client.get("/metrics").text.splitlines() if x.startswith("nmt_translated_items_total")]
    return sum(float(line.split()[-1]) for line in lines)


def test_inline_tags_travel_inside_one_sentence(span_client):
    """With a model that has sentinels, inline tags are part of the sentence: one sentence reaches
    the model, and every tag comes back as written, in order."""
    document = '<p>Click <b>Print</b> or <a href="/help?a=1&amp;b=2" title="x">help</a> to print.</p>'
    before = translated_items(span_client)
    out = lt(span_client, q=document, format="html")["translatedText"]
    assert translated_items(span_client) == before + 1
    # each tag exactly once, as written (in the order the translation puts its words: a random model's)
    assert sorted(TAG.findall(out)) == sorted(TAG.findall(document))
    assert out.startswith("<p>") and out.endswith("</p>")


def test_placeholders_come_back_exactly_once(span_client):
    text = "%(female_name)s is the daughter of %(father)s and %(mother)s. Send [X12X] to {0}!"
    for format in ("text", "html"):
        out = lt(span_client, q=text, format=format)["translatedText"]
        for span in ("%(female_name)s", "%(father)s", "%(mother)s", "[X12X]", "{0}"):
            assert out.count(span) == 1, (format, span, out)
    body = span_client.post("/v1/translate", json={"text": [text, "No spans here."], "source": "en", "target": "de",
                                                   "beam_size": 2, "n_best": 2}).json()
    first = body["translations"][0]
    for hypothesis in [first] + first["alternatives"]:
        for span in ("%(female_name)s", "%(father)s", "[X12X]"):
            assert hypothesis["text"].count(span) == 1
        repair = hypothesis.get("span_repair")
        assert repair is None or set(repair["inserted"]) <= {"%(female_name)s", "%(father)s", "%(mother)s",
                                                             "[X12X]", "{0}"}
    assert not any(0xE000 <= ord(c) < 0xE020 for c in body["translations"][1]["text"])  # no sentinel escapes
    metrics = span_client.get("/metrics").text
    assert 'nmt_span_repairs_total{kind="inserted",model="en-de"}' in metrics


def test_emoji_and_other_scripts_come_back_as_written(span_client):
    """Characters the model's vocabulary cannot spell are spans: copied, never garbled (Mastodon
    posts are full of emoji)."""
    text = "Hello world 😀👍🏽, this is Москва."
    for format in ("text", "html"):
        q = text if format == "text" else f"<p>{text} <b>ok</b></p>"
        out = lt(span_client, q=q, format=format)["translatedText"]
        assert out.count("😀👍🏽") == 1 and out.count("Москва") == 1, (format, out)
    body = span_client.post("/v1/translate", json={"text": [text], "source": "en", "target": "de"}).json()
    out = body["translations"][0]["text"]
    assert out.count("😀👍🏽") == 1 and out.count("Москва") == 1 and "\ufffd" not in out
