"""Word (.docx, python-docx) and PowerPoint (.pptx, python-pptx) files: every paragraph with
letters is a text (the body, tables, headers and footers; slides' shapes, tables, groups and
notes), one of several runs given as HTML spans (runs.py) so each run keeps its formatting."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from io import BytesIO

from app.documents import Extracted
from app.documents.runs import html_runs, runs_html


def _extract(paragraph_runs: list[list]) -> tuple[list[str], list[bool], list[list]]:
    """Texts of the paragraphs (given as their runs) that have letters, and those runs."""
    texts, html, slots = [], [], []
    for runs in paragraph_runs:
        runs = [r for r in runs if r.text]
        if not any(c.isalpha() for r in runs for c in r.text):
            continue
        texts.append(runs[0].text if len(runs) == 1 else runs_html([r.text for r in runs]))
        html.append(len(runs) > 1)
        slots.append(runs)
    return texts, html, slots


def paragraphs_of_runs(paragraph_runs: list[list], save: Callable[[BytesIO], None]) -> Extracted:
    """The texts of paragraphs given as their runs (objects with a settable `.text`), and a
    writer that puts each translation back into its runs and saves the document with `save`."""
    texts, html, slots = _extract(paragraph_runs)

    def write(translations: list[str], target: str) -> bytes:
        for runs, is_html, translation in zip(slots, html, translations):
            parts = html_runs(translation, len(runs)) if is_html else [translation]
            for run, part in zip(runs, parts):
                run.text = part
        out = BytesIO()
        save(out)
        return out.getvalue()

    return Extracted(texts, html, write)


# --- Word ----------------------------------------------------------------------------------------

def _docx_runs(paragraph) -> list:
    from docx.text.hyperlink import Hyperlink

    runs = []
    for item in paragraph.iter_inner_content():  # runs and hyperlinks, in order
        runs += item.runs if isinstance(item, Hyperlink) else [item]
    return runs


def _docx_paragraphs(container, seen: set) -> Iterator:
    from docx.table import Table

    for block in container.iter_inner_content():
        if isinstance(block, Table):
            for row in block.rows:
                for cell in row.cells:
                    if id(cell._tc) not in seen:  # a merged cell appears once per grid column it spans
                        seen.add(id(cell._tc))
                        yield from _docx_paragraphs(cell, seen)
        else:
            yield block


def read_docx(data: bytes) -> Extracted:
    import docx

    document = docx.Document(BytesIO(data))
    seen: set = set()
    paragraphs = list(_docx_paragraphs(document, seen))
    for section in document.sections:
        for part in (section.header, section.footer, section.first_page_header, section.first_page_footer,
                     section.even_page_header, section.even_page_footer):
            if not part.is_linked_to_previous:
                paragraphs += list(_docx_paragraphs(part, seen))
    return paragraphs_of_runs([_docx_runs(p) for p in paragraphs], document.save)


# --- PowerPoint ----------------------------------------------------------------------------------

def _pptx_frames(shapes) -> Iterator:
    for shape in shapes:
        if shape.has_text_frame:
            yield shape.text_frame
        if getattr(shape, "has_table", False) and shape.has_table:
            for cell in shape.table.iter_cells():
                yield cell.text_frame
        if hasattr(shape, "shapes"):  # a group
            yield from _pptx_frames(shape.shapes)


def read_pptx(data: bytes) -> Extracted:
    import pptx

    presentation = pptx.Presentation(BytesIO(data))
    frames = []
    for slide in presentation.slides:
        frames += list(_pptx_frames(slide.shapes))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            frames.append(slide.notes_slide.notes_text_frame)
    return paragraphs_of_runs([list(p.runs) for frame in frames for p in frame.paragraphs], presentation.save)
