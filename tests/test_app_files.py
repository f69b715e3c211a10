"""File translation (POST /translate_file, GET /download_file) and the other LibreTranslate routes
that came with it (/frontend/settings, /suggest, /spec), with a tiny model whose vocabulary has
sentinels: every format round-trips with its structure kept, each text translated as /translate
translates it."""

from __future__ import annotations

import io
import re
import tempfile
import zipfile
from pathlib import Path

import polib
import pytest

from app import documents
from app.documents.runs import html_runs, runs_html
from app.settings import Settings
from tests.conftest import ready_client

TEXT = "Open the file.\nClick the button to print the document.\n"


@pytest.fixture(scope="module")
def client(tiny_sentinel_checkpoint, tmp_path_factory):
    settings = Settings(model_dirs=[str(tiny_sentinel_checkpoint)], workers=1, threads_per_worker=1, max_wait_ms=2,
                        suggestions=True, suggestions_db=str(tmp_path_factory.mktemp("db") / "suggestions.db"),
                        max_file_chars=2000, max_segments=4)
    with ready_client(settings) as c:
        yield c


def lt_translate(client, q, html=False) -> str:
    body = {"q": q, "source": "en", "target": "de", "format": "html" if html else "text"}
    return client.post("/translate", json=body).json()["translatedText"]


def translate_file(client, name: str, data: bytes, status: int = 200, **fields):
    r = client.post("/translate_file", files={"file": (name, data)},
                    data={"source": "en", "target": "de", **fields})
    assert r.status_code == status, r.text
    if status != 200:
        return r.json()["error"]
    url = r.json()["translatedFileUrl"]
    assert url.startswith("http://testserver/download_file/")
    download = client.get(url)
    assert download.status_code == 200, download.text
    return download


def filename(download) -> str:
    return re.search(r"filename\*=UTF-8''(.+)$", download.headers["content-disposition"]).group(1)


def test_runs_round_trip():
    texts = ["Click ", "<Print>", " now & then."]
    assert html_runs(runs_html(texts), 3) == texts
    moved = '<span data-run="1">Drucken</span> jetzt <span data-run="0">Klicken</span>'
    assert html_runs(moved, 2) == ["Klicken", "Drucken jetzt "]  # words outside runs join the run before


def test_plain_text_and_html_files_translate_as_translate_does(client):
    download = translate_file(client, "notes.txt", TEXT.encode())
    assert filename(download) == "notes_de.txt"
    assert download.content.decode() == lt_translate(client, TEXT)
    page = "<html><body><h1>Print</h1><p>Click <b>Print</b> to print.</p></body></html>"
    assert translate_file(client, "page.html", page.encode()).content.decode() == lt_translate(client, page, True)


def test_subtitles_keep_numbers_timings_and_line_count(client):
    srt = ("1\r\n00:00:01,000 --> 00:00:02,500\r\nOpen the file\r\nand save your changes.\r\n\r\n"
           "2\r\n00:00:03,000 --> 00:00:04,000\r\nClick.\r\n")
    out = translate_file(client, "film.srt", srt.encode()).content.decode()
    cues = out.strip().split("\r\n\r\n")
    assert [c.split("\r\n")[:2] for c in cues] == [["1", "00:00:01,000 --> 00:00:02,500"],
                                                   ["2", "00:00:03,000 --> 00:00:04,000"]]
    first = " ".join(cues[0].split("\r\n")[2:])
    assert first == lt_translate(client, "Open the file and save your changes.")
    assert cues[1].split("\r\n")[2] == lt_translate(client, "Click.")


def test_gettext_catalog_fills_untranslated_entries_marks_them_fuzzy_and_keeps_the_rest(client):
    po = polib.POFile()
    po.metadata = {"Project-Id-Version": "demo 1.0", "Content-Type": "text/plain; charset=UTF-8"}
    po.append(polib.POEntry(msgid="Open the file %s.", msgstr="", occurrences=[("main.c", "12")],
                            comment="shown in the menu", flags=["c-format"]))
    po.append(polib.POEntry(msgid="Save", msgstr="Speichern"))  # a translator's: kept
    po.append(polib.POEntry(msgid="%d file", msgid_plural="%d files", msgstr_plural={0: "", 1: ""}))
    po.append(polib.POEntry(msgid="Print", msgctxt="menu", msgstr=""))
    download = translate_file(client, "app.pot", str(po).encode())
    assert filename(download) == "app_de.po"
    out = polib.pofile(download.content.decode())
    assert out.metadata["Language"] == "de" and out.metadata["Project-Id-Version"] == "demo 1.0"
    opened = out.find("Open the file %s.")
    assert "%s" in opened.msgstr  # the placeholder is protected
    assert opened.msgstr == lt_translate(client, "Open the file %s.")
    assert opened.flags == ["c-format", "fuzzy"] and opened.comment == "shown in the menu"
    assert opened.occurrences == [("main.c", "12")]
    assert out.find("Save").msgstr == "Speichern" and "fuzzy" not in out.find("Save").flags
    plural = out.find("%d file")
    assert set(plural.msgstr_plural) == {0, 1} and all("%d" in v for v in plural.msgstr_plural.values())
    assert out.find("Print", msgctxt="menu").msgstr == lt_translate(client, "Print")


def test_docx_round_trip_keeps_runs_formatting_tables_and_headers(client):
    import docx

    document = docx.Document()
    document.sections[0].header.paragraphs[0].text = "Open the file."
    paragraph = document.add_paragraph("Click ")
    paragraph.add_run("Print").bold = True
    paragraph.add_run(" to print the document.")
    document.add_paragraph("Save the file.")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "Hello world."
    table.cell(0, 1).text = "42"  # no letters: kept
    data = io.BytesIO()
    document.save(data)
    download = translate_file(client, "guide.docx", data.getvalue())
    assert filename(download) == "guide_de.docx"
    out = docx.Document(io.BytesIO(download.content))
    runs = out.paragraphs[0].runs
    assert len(runs) == 3 and runs[1].bold and not runs[0].bold  # each run keeps its formatting
    texts = ["Click ", "Print", " to print the document."]  # one text to the model, the runs as inline tags
    assert [r.text for r in runs] == html_runs(lt_translate(client, runs_html(texts), html=True), 3)
    assert out.paragraphs[1].text == lt_translate(client, "Save the file.")
    assert out.tables[0].cell(0, 0).text == lt_translate(client, "Hello world.")
    assert out.tables[0].cell(0, 1).text == "42"
    assert out.sections[0].header.paragraphs[0].text == lt_translate(client, "Open the file.")


def test_pptx_odt_odp_and_epub_round_trip(client):
    import pptx
    from ebooklib import epub
    from odf import text as odftext
    from odf.draw import Frame, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation, OpenDocumentText, load
    from odf.style import MasterPage, PageLayout

    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "Open the file."
    slide.notes_slide.notes_text_frame.text = "Save the file."
    data = io.BytesIO()
    presentation.save(data)
    out = pptx.Presentation(io.BytesIO(translate_file(client, "talk.pptx", data.getvalue()).content))
    assert out.slides[0].shapes.title.text == lt_translate(client, "Open the file.")
    assert out.slides[0].notes_slide.notes_text_frame.text == lt_translate(client, "Save the file.")

    for document, name in ((OpenDocumentText(), "letter.odt"), (OpenDocumentPresentation(), "deck.odp")):
        body = document.text if name.endswith(".odt") else None
        if name.endswith(".odp"):  # a page, a frame, a text box: where a slide's paragraphs live
            layout = PageLayout(name="layout")
            document.automaticstyles.addElement(layout)
            master = MasterPage(name="Default", pagelayoutname=layout)
            document.masterstyles.addElement(master)
            page = Page(masterpagename=master)
            document.presentation.addElement(page)
            frame = Frame(width="20cm", height="4cm", x="1cm", y="1cm")
            page.addElement(frame)
            body = TextBox()
            frame.addElement(body)
        paragraph = odftext.P(text="Click ")
        paragraph.addElement(odftext.Span(text="Print"))
        body.addElement(odftext.P(text="Open the file."))
        body.addElement(paragraph)
        data = io.BytesIO()
        document.write(data)
        out = load(io.BytesIO(translate_file(client, name, data.getvalue()).content))
        first = out.body.getElementsByType(odftext.P)[0]
        assert str(first) == lt_translate(client, "Open the file.")
        assert len(out.body.getElementsByType(odftext.Span)) == 1  # the span is still there

    book = epub.EpubBook()
    book.set_identifier("id1")
    book.set_title("Demo")
    book.set_language("en")
    chapter = epub.EpubHtml(title="One", file_name="one.xhtml", lang="en")
    chapter.content = "<html><body><h1>Open the file.</h1><p>Click <b>Print</b>.</p></body></html>"
    book.add_item(chapter)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", chapter]
    with tempfile.TemporaryDirectory() as tmp:
        epub.write_epub(str(Path(tmp) / "b.epub"), book)
        data = (Path(tmp) / "b.epub").read_bytes()
    out = translate_file(client, "book.epub", data)
    with zipfile.ZipFile(io.BytesIO(out.content)) as archive:
        chapter_out = next(archive.read(n).decode() for n in archive.namelist() if n.endswith("one.xhtml"))
    assert lt_translate(client, "Open the file.") in chapter_out.replace("&#13;", "")


def test_file_errors(client, monkeypatch):
    assert translate_file(client, "virus.exe", b"MZ", 400).startswith("Invalid request: file format not supported")
    assert "not UTF-8" in translate_file(client, "latin1.txt", "Grüße".encode("latin-1"), 400)
    assert "cannot read it as .docx" in translate_file(client, "fake.docx", b"not a zip", 400)
    assert "at most 2,000 per file" in translate_file(client, "big.txt", b"Open the file. " * 200, 400)
    assert translate_file(client, "notes.txt", TEXT.encode(), 400, target="") == \
        "Invalid request: missing target parameter"
    r = client.post("/translate_file", data={"source": "en", "target": "de"})
    assert r.status_code == 400 and r.json()["error"] == "Invalid request: missing file parameter"
    assert client.get("/download_file/0123abc.notes_de.txt").status_code == 404
    monkeypatch.setattr(client.app.state.service.settings, "files_translation", False)
    assert translate_file(client, "notes.txt", TEXT.encode(), 403) == "Files translation are disabled on this server."


def test_many_sentences_go_in_several_jobs(client):
    lines = [f"Open the file number {k}." for k in range(11)]  # NMT_MAX_SEGMENTS=4: /translate takes 4, a file 3 jobs
    out = translate_file(client, "list.txt", "\n".join(lines).encode()).content.decode()
    assert out == "\n".join(lt_translate(client, line) for line in lines)


def test_download_expires(client, monkeypatch):
    store = client.app.state.service.storage
    url = client.post("/translate_file", files={"file": ("a.txt", b"Open the file.")},
                      data={"source": "en", "target": "de"}).json()["translatedFileUrl"]
    assert client.get(url).status_code == 200
    now = store.clock()
    monkeypatch.setattr(store, "clock", lambda: now + client.app.state.service.settings.file_ttl_s + 1)
    assert "expired" in client.get(url).json()["error"]


def test_frontend_settings_suggest_and_spec(client):
    settings = client.get("/frontend/settings").json()
    assert settings["charLimit"] == 5000 and settings["suggestions"] is True and settings["filesTranslation"] is True
    assert settings["supportedFilesFormat"] == documents.extensions() and settings["keyRequired"] is False
    assert settings["apiKeys"] is False  # none configured, none stored
    assert settings["language"] == {"source": {"code": "auto", "name": "Auto Detect"},
                                    "target": {"code": "de", "name": "German"}}
    r = client.post("/suggest", data={"q": "Hello", "s": "Hallo", "source": "en", "target": "de"})
    assert r.json() == {"success": True}
    assert client.app.state.service.suggestions.all() == [("Hello", "Hallo", "en", "de")]
    assert client.post("/suggest", json={"q": "Hello", "source": "en", "target": "de"}).json()["error"] == "s: required"
    assert client.post("/suggest", json={"q": "a", "s": "b", "source": "en", "target": "fr"}).status_code == 400
    spec = client.get("/spec").json()
    assert {"/translate_file", "/download_file/{file}", "/suggest", "/frontend/settings"} <= set(spec["paths"])


def test_suggestions_are_off_by_default(tiny_checkpoint):
    with ready_client(Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1)) as c:
        r = c.post("/suggest", json={"q": "a", "s": "b", "source": "en", "target": "de"})
        assert r.status_code == 403 and r.json()["error"] == "Suggestions are disabled on this server."


def test_the_suggestions_file_holds_at_most_its_bytes(tmp_path):
    """Past NMT_SUGGESTIONS_MAX_BYTES a suggestion is refused (507 through the API), counting what
    the file held when it was opened, so that clients cannot fill the disk."""
    from app.suggestions import SuggestionsFull, SuggestionStore

    path = tmp_path / "suggestions.db"
    store = SuggestionStore(path, max_bytes=40)
    store.add("Hello", "Hallo", "en", "de")  # 14 bytes
    store.add("Grüße", "Greetings", "de", "en")  # 6 + 9 + 4 = 19: 33 in all
    with pytest.raises(SuggestionsFull, match="NMT_SUGGESTIONS_MAX_BYTES"):
        store.add("Bye", "Tschüss", "en", "de")  # 3 + 8 + 4 = 15: 48
    assert SuggestionStore(path, max_bytes=0).all() == [("Hello", "Hallo", "en", "de"), ("Grüße", "Greetings", "de", "en")]
    reopened = SuggestionStore(path, max_bytes=40)  # counts the file's 33 bytes when it opens it
    with pytest.raises(SuggestionsFull):
        reopened.add("Bye", "Tschüss", "en", "de")
    reopened.add("a", "b", "en", "de")  # 6: 39


def test_a_full_suggestions_file_answers_507(tiny_checkpoint, tmp_path):
    settings = Settings(model_dirs=[str(tiny_checkpoint)], workers=1, threads_per_worker=1, suggestions=True,
                        suggestions_db=str(tmp_path / "s.db"), suggestions_max_bytes=20)
    with ready_client(settings) as c:
        assert c.post("/suggest", json={"q": "Hello", "s": "Hallo", "source": "en", "target": "de"}).status_code == 200
        r = c.post("/suggest", json={"q": "Hello", "s": "Hallo", "source": "en", "target": "de"})
        assert r.status_code == 507 and "NMT_SUGGESTIONS_MAX_BYTES" in r.json()["error"]
