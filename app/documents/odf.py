"""OpenDocument text and presentations (.odt, .odp, odfpy): every paragraph and heading with
letters is a text; its text nodes are its runs (runs.py), so spans and links keep their styles.
A note, frame or annotation inside a paragraph is a paragraph of its own, not part of it."""

from __future__ import annotations

from io import BytesIO

from app.documents import Extracted
from app.documents.office import paragraphs_of_runs

_OWN_PARAGRAPHS = {"p", "h", "note", "frame", "annotation"}  # their text is not the enclosing paragraph's


class _TextNode:
    """An odfpy text node with the `.text` a run has."""

    def __init__(self, node):
        self.node = node

    @property
    def text(self) -> str:
        return self.node.data

    @text.setter
    def text(self, value: str) -> None:
        self.node.data = value


def _text_nodes(element) -> list[_TextNode]:
    nodes = []
    for child in element.childNodes:
        if child.nodeType == child.TEXT_NODE:
            nodes.append(_TextNode(child))
        elif child.nodeType == child.ELEMENT_NODE and child.qname[1] not in _OWN_PARAGRAPHS:
            nodes += _text_nodes(child)
    return nodes


def read(data: bytes) -> Extracted:
    from odf import text
    from odf.opendocument import load

    document = load(BytesIO(data))
    paragraphs = document.body.getElementsByType(text.P) + document.body.getElementsByType(text.H)
    return paragraphs_of_runs([_text_nodes(p) for p in paragraphs], document.write)
