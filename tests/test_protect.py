"""Protected spans (model/protect.py): what is found, masking both ways, and the repair."""

import random
from collections import Counter

import numpy as np

from model import protect
from model.protect import mask, mask_pair, repair, sentinel, spans, unmask
from model.translator import Translator

S = [sentinel(k) for k in range(4)]


def test_spans_of_every_kind():
    assert spans("%(female_name)s is the daughter of %(father)s.") == ["%(female_name)s", "%(father)s"]
    assert spans("Page %1 of %2, %L3, %-5.2f, %1$s, %d%%") == ["%1", "%2", "%L3", "%-5.2f", "%1$s", "%d"]
    assert spans("Hello {0} and {name}, {{count}}") == ["{0}", "{name}", "{{count}}"]
    assert spans("Set $HOME or ${XDG_DIR} or $(ARG)") == ["$HOME", "${XDG_DIR}", "$(ARG)"]
    assert spans("Weblate sends [X12X] and [X3X].") == ["[X12X]", "[X3X]"]
    assert spans('Click <b>here</b> or <a href="%s">there</a><br/>') == ["<b>", "</b>", '<a href="%s">', "</a>", "<br/>"]
    assert spans("See https://example.org/a?b=1. Mail me@example.org!") == ["https://example.org/a?b=1",
                                                                         "me@example.org"]
    assert spans("Tom &amp; Jerry &#38; co") == ["&amp;", "&#38;"]


def test_prose_is_not_a_span():
    assert spans("100% sure, 5 % of them, 100%% done, a < b, {not closed") == []
    assert spans("It costs 5 euros.") == []


def test_mask_and_unmask_round_trip():
    text = "Click <b>%s</b> to print %(n)d pages."
    m = mask(text)
    assert m.text == f"Click {S[0]}{S[1]}{S[2]} to print {S[3]} pages."
    assert m.spans == ["<b>", "%s", "</b>", "%(n)d"]
    assert unmask(m.text, m.spans) == text
    assert unmask(f"x {sentinel(9)} y", ["a"]) == "x  y"  # a sentinel with no span is dropped


def test_unmask_keeps_a_span_from_running_into_its_neighbours():
    """A span put back against a character that would change it gets a space on that side;
    neighbours that leave it as it is stay where the model wrote them."""
    assert unmask(f"Starten Sie {S[0]}Einstellung", ["%PRODUCTNAME"]) == "Starten Sie %PRODUCTNAME Einstellung"
    assert unmask(f"{S[0]}x und {S[1]}s", ["$HOME", "https://example.org"]) == "$HOME x und https://example.org s"
    assert unmask(f"100%{S[0]} fertig", ["%s"]) == "100% %s fertig"  # "%%s" would be an escaped percent
    assert unmask(f"kontakt{S[0]}", ["me@example.org"]) == "kontakt me@example.org"
    glued = f"Datei{S[0]}: {S[1]}{S[2]}s, {S[3]}."
    assert unmask(glued, ["%s", "%(n)s", "<b>", "https://example.org"]) == "Datei%s: %(n)s<b>s, https://example.org."
    for text in ("Starten Sie %PRODUCTNAME Einstellung", "100% %s fertig", "$HOME x"):
        assert unmask(mask(text).text, mask(text).spans) == text
        assert spans(text) == spans(unmask(mask(text).text, mask(text).spans))


def test_a_span_glued_to_a_word_in_the_source_stays_glued():
    source = protect.mask("Öffnen Sie <b>Datei</b> (<i>neu</i>) und %s Einträge.")
    # the model wrote spaces inside the bold and italic tags and around %s
    translated = "Open \ue000 File \ue001 (\ue002 new \ue003) and \ue004 entries."
    glued = protect.keep_glue(translated, source.text)
    assert protect.unmask(glued, source.spans) == "Open <b>File</b> (<i>new</i>) and %s entries."
    assert protect.keep_glue("a \ue000 b", "x \ue000 y") == "a \ue000 b"  # not glued in the source: as written


def test_mask_pair_numbers_target_like_source():
    src, tgt = mask_pair("Copy %s to %s with {0}", "Kopiere %s nach %s mit {0}")
    assert src == f"Copy {S[0]} to {S[1]} with {S[2]}" and tgt == f"Kopiere {S[0]} nach {S[1]} mit {S[2]}"
    # reordered in the target: the sentinel follows the span string
    src, tgt = mask_pair("%1 of %2", "%2 von %1")
    assert (src, tgt) == (f"{S[0]} of {S[1]}", f"{S[1]} von {S[0]}")
    assert mask_pair("Open %s", "Öffnen") is None
    assert mask_pair("No spans here", "Keine hier") == ("No spans here", "Keine hier")


def test_mask_pair_random_numbers_cover_all_sentinels():
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        src, tgt = mask_pair("%s and %d", "%s und %d", rng)
        ks = [ord(c) - protect.SENTINEL_BASE for c in src if ord(c) >= protect.SENTINEL_BASE]
        assert len(set(ks)) == 2 and [c for c in tgt if ord(c) >= protect.SENTINEL_BASE] == [
            c for c in src if ord(c) >= protect.SENTINEL_BASE]
        seen.update(ks)
    assert seen == set(range(protect.MAX_SPANS))


def _attention(rows: list[list[float]]) -> np.ndarray:
    return np.array(rows, dtype=np.float32)  # (target steps, source pieces)


def test_repair_inserts_a_dropped_span_where_attention_points():
    source = ["▁Open", "▁", S[0], "▁now", "</s>"]
    target = ["▁Öffne", "▁jetzt", "</s>"]
    # the step that emitted "▁jetzt" (row 1) looked at the sentinel (column 2)
    att = _attention([[0.9, 0, 0.05, 0.05, 0], [0.1, 0, 0.8, 0.1, 0], [0, 0, 0, 0, 1]])
    fixed = repair(source, target[:2], att)
    assert fixed.pieces == ["▁Öffne", "▁", S[0], "▁jetzt"] and fixed.inserted == [0] and not fixed.removed


def test_repair_puts_a_span_between_words_not_inside_one():
    source = ["▁You", "▁use", ":", "▁", S[0], "</s>"]
    target = ["▁Sie", "▁ben", "utzen", "."]
    # the step that emitted "utzen" (inside a word) attends most to the sentinel: the word start wins
    att = _attention([[0.9, 0, 0, 0, 0.1, 0], [0.5, 0, 0, 0, 0.3, 0], [0, 0, 0, 0, 0.9, 0.1], [0, 0, 0, 0, 0, 1]])
    assert repair(source, target, att).pieces == ["▁Sie", "▁", S[0], "▁ben", "utzen", "."]


def test_repair_keeps_one_of_a_repeated_span_and_drops_unknown_ones():
    source = ["▁Hi", S[0], "</s>"]
    target = ["▁Hallo", S[0], S[0], S[3]]
    att = _attention([[1, 0, 0], [0.2, 0.3, 0], [0.1, 0.9, 0], [0.5, 0.5, 0]])
    fixed = repair(source, target, att)
    assert fixed.pieces == ["▁Hallo", S[0]] and sorted(fixed.removed) == [0, 3]
    assert not repair(source, ["▁Hallo", S[0]], att).changed


def test_repair_says_which_model_step_wrote_each_piece():
    """The attention has a row per model step; after a repair each piece knows its row (None for
    a piece the repair put in), so what reads the attention by piece stays on the right row."""
    source = ["▁Open", "▁", S[0], "▁now", "</s>"]
    target = ["▁Öffne", S[3], "▁jetzt"]  # an unknown sentinel, and sentinel 0 missing
    att = _attention([[0.9, 0, 0.05, 0.05, 0], [0.5, 0, 0.5, 0, 0], [0.1, 0, 0.8, 0.1, 0], [0, 0, 0, 0, 1]])
    fixed = repair(source, target, att)
    assert fixed.pieces == ["▁Öffne", "▁", S[0], "▁jetzt"] and fixed.rows == [0, None, None, 2]
    rows = fixed.weights_of_pieces(att)
    assert rows.shape == (4, 5)
    np.testing.assert_array_equal(rows[[0, 3]], att[[0, 2]])
    assert not rows[1:3].any()


def test_repair_without_attention_appends():
    fixed = repair(["▁a", S[0], S[1], "</s>"], ["▁b", S[1]], None)
    assert fixed.pieces == ["▁b", S[1], S[0]] and fixed.inserted == [0]


def test_repair_keeps_to_the_sentinels_of_its_source():
    # a sentence of a longer text holds sentinels 2 and 3 only: 0 and 1 are not missing
    fixed = repair(["▁x", S[2], "▁y", S[3], "</s>"], ["▁X", S[2], "▁Y", S[3]], None)
    assert not fixed.changed


def test_mask_numbers_from_first():
    m = mask("a %s b %d", first=5)
    assert m.text == f"a {sentinel(5)} b {sentinel(6)}" and m.spans[5:] == ["%s", "%d"]


def test_words_the_vocabulary_cannot_spell_are_spans():
    """Emoji, other scripts, symbols: each run a span, widened to its whole word; the patterns'
    spans come first and stay as they were."""
    spelled = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,?%()<>/")  # no "!"

    def foreign(c):
        return c not in spelled

    text = "Café au lait 5 € at <b>%(name)s</b> 🎉🎂! We met in Москва. 👍🏽 ok"
    masked = protect.mask(text, foreign=foreign)
    assert masked.spans == ["Café", "€", "<b>", "%(name)s", "</b>", "🎉🎂", "Москва", "👍🏽"]
    assert protect.unmask(masked.text, masked.spans) == text
    assert protect.spans(text) == ["<b>", "%(name)s", "</b>"]  # without a vocabulary: the patterns only
    assert protect.foreign_words("Dvořák and naïve", foreign) == [(0, 6), (11, 16)]
    assert protect.foreign_words("plain text", foreign) == []
    # a URL holding such a character stays one span, as the pattern found it
    assert protect.spans("see https://x.y/café now", foreign) == ["https://x.y/café"]


# --- models without sentinel pieces: strip and place ------------------------------------------

def test_strip_takes_spans_out_and_says_where_they_stood():
    s = protect.take_out("Click <b>Print</b> to open %s now.")
    assert s.text == "Click Print to open now."
    assert s.spans == ["<b>", "</b>", "%s"]
    assert s.at == [6, 11, 20]  # "Print" starts at 6; after it 11; "now" at 20
    assert s.glued == [(False, True), (True, False), (False, False)]


def test_place_puts_each_span_before_the_piece_that_attends_to_its_position():
    s = protect.take_out("Click <b>Print</b> now.")  # text "Click Print now."
    source_starts = [0, 6, 12, 15, 16]  # ▁Click ▁Print ▁now . </s>
    target = ["▁Klicken", "▁Sie", "▁jetzt", "▁auf", "▁Drucken", "."]
    weights = np.zeros((len(target), len(source_starts)))
    weights[0, 0] = weights[1, 0] = weights[4, 1] = weights[2, 2] = weights[3, 2] = weights[5, 3] = 1.0
    text = protect.place(s, source_starts, target, weights, lambda p: "".join(p).replace("▁", " ").strip())
    assert text == "Klicken Sie <b>jetzt auf Drucken</b>." or text.count("<b>") == 1
    assert text.count("<b>") == 1 and text.count("</b>") == 1
    end = protect.take_out("Save %s")
    assert protect.place(end, [0, 5], ["▁Speichern"], np.ones((1, 2)),
                         lambda p: "".join(p).replace("▁", " ").strip()) == "Speichern %s"


def test_a_model_without_sentinels_returns_every_span(tiny_checkpoint):
    translator = Translator.load(tiny_checkpoint, device="cpu", dtype="float32")
    assert not translator.tokenizer.has_sentinels
    sources = ["Click <b>Print</b> to print %s.", "Open {file} in https://example.org now", "Hello world."]
    for source, result in zip(sources, translator.translate(sources)):
        text = result.hypotheses[0].text
        assert Counter(protect.spans(text)) == Counter(protect.spans(source)), (source, text)
