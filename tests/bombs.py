"""Hostile files and bodies for the untrusted-input tests, built here from small valid samples:
decompression bombs (honest and lying headers), members by the thousand, deep XML, entity
expansion, huge subtitle and catalog files, deep HTML and JSON, forms of many fields; and
`mutants`, a seeded mutation loop (truncation, byte flips, splices, zip-level edits) over them."""

from __future__ import annotations

import io
import random
import struct
import tempfile
import zipfile
from pathlib import Path

W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


# --- small valid samples, one per format ---------------------------------------------------------

def docx_sample(text: str = "Open the file.") -> bytes:
    import docx

    document = docx.Document()
    document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def pptx_sample(text: str = "Open the file.") -> bytes:
    import pptx

    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = text
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def odt_sample(text: str = "Open the file.") -> bytes:
    from odf import text as odftext
    from odf.opendocument import OpenDocumentText

    document = OpenDocumentText()
    document.text.addElement(odftext.P(text=text))
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


def epub_sample(chapters: int = 1, text: str = "Open the file.") -> bytes:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("id1")
    book.set_title("Demo")
    book.set_language("en")
    items = []
    for k in range(chapters):
        chapter = epub.EpubHtml(title=f"C{k}", file_name=f"c{k}.xhtml", lang="en")
        chapter.content = f"<html><body><p>{text}</p></body></html>"
        book.add_item(chapter)
        items.append(chapter)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *items]
    with tempfile.TemporaryDirectory() as tmp:
        epub.write_epub(str(Path(tmp) / "b.epub"), book)
        return (Path(tmp) / "b.epub").read_bytes()


SAMPLES = {
    "a.txt": lambda: b"Open the file.\nSave it.\n",
    "a.html": lambda: b"<p>Open the <b>file</b>.</p>",
    "a.srt": lambda: b"1\n00:00:01,000 --> 00:00:02,000\nOpen the file.\n\n2\n00:00:03,000 --> 00:00:04,000\nSave it.\n",
    "a.po": lambda: b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\nmsgid "Open the file."\n'
                    b'msgstr ""\n\nmsgid "One file"\nmsgid_plural "%d files"\nmsgstr[0] ""\nmsgstr[1] ""\n',
    "a.docx": docx_sample,
    "a.pptx": pptx_sample,
    "a.odt": odt_sample,
    "a.epub": epub_sample,
}


# --- zip surgery ---------------------------------------------------------------------------------

def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rezip(parts: dict[str, bytes | tuple[bytes, int]]) -> bytes:
    """A zip of these members (deflated); a (chunk, n) member is the chunk written n times,
    streamed, so a gigabyte member never exists in memory."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in parts.items():
            if isinstance(content, tuple):
                chunk, times = content
                with archive.open(name, "w", force_zip64=True) as member:
                    for _ in range(times):
                        member.write(chunk)
            else:
                archive.writestr(name, content)
    return out.getvalue()


def with_member(sample: bytes, name: str, content: bytes | tuple[bytes, int]) -> bytes:
    parts: dict[str, bytes | tuple[bytes, int]] = dict(members(sample))
    parts[name] = content
    return rezip(parts)


def lie_about_sizes(data: bytes, name: str, declared: int) -> bytes:
    """The archive with `name`'s uncompressed size rewritten to `declared` in its local header
    and its central directory entry (a header that lies)."""
    raw = bytearray(data)
    encoded = name.encode()
    for signature, size_at, name_len_at, name_at in ((b"PK\x03\x04", 22, 26, 30), (b"PK\x01\x02", 24, 28, 46)):
        at = raw.find(signature)
        while at >= 0:
            length = struct.unpack_from("<H", raw, at + name_len_at)[0]
            if bytes(raw[at + name_at:at + name_at + length]) == encoded:
                struct.pack_into("<I", raw, at + size_at, declared)
            at = raw.find(signature, at + 4)
    return bytes(raw)


# --- the bombs -----------------------------------------------------------------------------------

def docx_bomb(gigabytes: float = 1.5) -> bytes:
    """A docx whose word/document.xml inflates to `gigabytes` (the issue's 5 MB to 1.5 GB)."""
    chunk = b"<w:p><w:r><w:t>aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa</w:t></w:r></w:p>" * 1024
    head = f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document {W}><w:body>'.encode()
    times = int(gigabytes * 2**30 / len(chunk))
    return with_member(docx_sample(), "word/document.xml", (head + chunk, times))


def ratio_bomb(sample: bytes, name: str, megabytes: int = 60) -> bytes:
    """A member under the unzipped budget whose ratio gives it away (zeros compress ~1000:1)."""
    return with_member(sample, name, (b"\0" * 2**20, megabytes))


def lying_bomb() -> bytes:
    """The 1.5 GB member's headers claiming 1 KB."""
    return lie_about_sizes(docx_bomb(0.2), "word/document.xml", 1024)


def many_members(count: int = 5000) -> bytes:
    """An epub of `count` chapters' worth of members."""
    parts: dict[str, bytes | tuple[bytes, int]] = dict(members(epub_sample()))
    for k in range(count):
        parts[f"EPUB/x{k}.xhtml"] = b"<html><body><p>Hi</p></body></html>"
    return rezip(parts)


def deep_xml_docx(depth: int = 50_000) -> bytes:
    head = f'<?xml version="1.0"?><w:document {W}><w:body>'.encode()
    body = b"<w:p>" * depth + b"</w:p>" * depth
    return with_member(docx_sample(), "word/document.xml", head + body + b"</w:body></w:document>")


def laughs_docx() -> bytes:
    """Billion laughs in word/document.xml."""
    entities = '<!ENTITY a0 "lol">' + "".join(f'<!ENTITY a{k} "{f"&a{k - 1};" * 10}">' for k in range(1, 10))
    xml = (f'<?xml version="1.0"?><!DOCTYPE d [{entities}]><w:document {W}><w:body><w:p><w:r><w:t>&a9;'
           "</w:t></w:r></w:p></w:body></w:document>")
    return with_member(docx_sample(), "word/document.xml", xml.encode())


def srt_cues(count: int = 300_000) -> bytes:
    return b"".join(b"%d\n00:00:01,000 --> 00:00:02,000\nHi\n\n" % k for k in range(count))


def po_plurals(forms: int = 200_000) -> bytes:
    return (b'msgid "One file"\nmsgid_plural "%d files"\n'
            + b"".join(b'msgstr[%d] ""\n' % k for k in range(forms)))


def deep_html(depth: int = 15_000) -> bytes:
    return b"<div>" * depth + b"Open the file." + b"</div>" * depth


def deep_json(depth: int = 200_000) -> bytes:
    return b'{"q": ' + b"[" * depth + b"]" * depth + b', "source": "en", "target": "de"}'


def many_json_values(count: int = 1_000_000) -> bytes:
    return b'{"q": [' + b"[]," * count + b'[]], "source": "en", "target": "de"}'


def many_form_fields(count: int = 100_000) -> bytes:
    return b"source=en&target=de&q=Hi" + b"&x=1" * count


# --- the mutation loop ---------------------------------------------------------------------------

def mutants(name: str, sample: bytes, count: int, seed: int = 0) -> list[bytes]:
    """`count` damaged versions of a valid file: truncated, bytes flipped, a stretch repeated or
    cut, and for zip-based files a member replaced by garbage, by a deep or huge one, or its
    headers' sizes changed."""
    rng = random.Random(f"{name}:{seed}")
    zipped = sample[:2] == b"PK"
    out = []
    for _ in range(count):
        data = bytearray(sample)
        kind = rng.randrange(6 if zipped else 4)
        if kind == 0:
            data = data[:rng.randrange(len(data))]
        elif kind == 1:
            for _ in range(rng.randint(1, 20)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:
            a = rng.randrange(len(data))
            b = min(len(data), a + rng.randint(1, 200))
            data[b:b] = data[a:b] * rng.randint(2, 50)
        elif kind == 3:
            a = rng.randrange(len(data))
            del data[a:a + rng.randint(1, 500)]
        elif kind == 4:
            names = list(members(sample))
            target = rng.choice(names)
            garbage = rng.choice([bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))),
                                  b"<a>" * 5000, (b"<a>" * 1024, 300), (b"\0" * 2**20, 30)])
            data = bytearray(with_member(sample, target, garbage))
        else:
            target = rng.choice(list(members(sample)))
            data = bytearray(lie_about_sizes(sample, target, rng.choice([0, 1, 2**31 - 1, 2**32 - 1])))
        out.append(bytes(data))
    return out
