"""app/markup.py: splitting HTML and text into what the model translates, and putting it back."""

from __future__ import annotations

import random
from html import unescape

import pytest

from app.markup import join_html, split_html, split_html_sentences
from model.sentences import interleave, split_sentences

MASTODON = ('<p>Hello <a href="https://x.y/@bob" class="u-url mention">@<span>bob</span></a>, how are you? '
            'I am fine.</p><p>Second paragraph &amp; more.</p>')


def sentences(text: str) -> list[str]:
    between, found = split_sentences(text)
    assert interleave(between, found) == text  # nothing lost, nothing added
    assert all(s == s.strip() and s for s in found)
    return found


# --- sentences --------------------------------------------------------------------------------

def test_sentences_split_after_terminators_before_capitals_digits_and_quotes():
    assert sentences("Open the file. Save it! Done? Yes… 3 files remain. \"Quoted,\" he said.") == [
        "Open the file.", "Save it!", "Done?", "Yes…", "3 files remain.", '"Quoted," he said.']
    assert sentences('He said "Stop." Then he left. (It rained.) We stayed.') == [
        'He said "Stop."', "Then he left.", "(It rained.)", "We stayed."]
    assert sentences("Wait... What?! Really.") == ["Wait...", "What?!", "Really."]


def test_sentences_keep_whitespace_and_split_at_line_breaks():
    text = "  First line\nsecond line.  Third one.\n\n- a list item\n"
    assert sentences(text) == ["First line", "second line.", "Third one.", "- a list item"]
    between, _ = split_sentences(text)
    assert between == ["  ", "\n", "  ", "\n\n", "\n"]


def test_sentences_do_not_split_after_abbreviations_initials_or_numbers():
    for text in ["Use a tool, e.g. Vim or Emacs.", "Ask Dr. Smith and Mr. Jones.", "Call J. R. Smith today.",
                 "It costs 3.50 Euro. ", "See No. 5 on the list.", "Apples, pears, etc. Are fruit.",
                 "Cats vs. Dogs is a film.", "Made in the U.S. Army base.", "no split. lower case follows",
                 "1. First item"]:
        assert sentences(text) == [text.strip()], text
    assert sentences("I said no. Then I left.") == ["I said no.", "Then I left."]  # "no" abbreviates before a number


def test_sentences_leave_text_without_letters_untranslated():
    assert sentences("") == [] and sentences("   ") == [] and sentences("42 ... !!!") == []
    between, found = split_sentences("Done!\n🎉 12345\nNext line.")
    assert found == ["Done!", "Next line."] and between == ["", "\n🎉 12345\n", ""]
    assert sentences("42. The end. 7. Fin.") == ["42. The end.", "7. Fin."]  # a number alone is no sentence


# --- HTML -------------------------------------------------------------------------------------

def test_html_text_runs_and_markup_as_written():
    markup, texts = split_html(MASTODON)
    assert texts == ["Hello", "bob", ", how are you? I am fine.", "Second paragraph & more."]  # entities decoded
    assert markup == ["<p>", ' <a href="https://x.y/@bob" class="u-url mention">@<span>', "</span></a>", "</p><p>",
                      "</p>"]
    assert join_html(markup, texts) == MASTODON
    assert join_html(markup, ["Hallo", "bob", ", <wie> geht's?", "Zweiter & mehr."]) == (
        '<p>Hallo <a href="https://x.y/@bob" class="u-url mention">@<span>bob</span></a>, &lt;wie&gt; geht\'s?'
        "</p><p>Zweiter &amp; mehr.</p>")


def test_html_sentences_inside_text_runs():
    markup, texts = split_html_sentences(MASTODON)
    assert texts == ["Hello", "bob", ", how are you?", "I am fine.", "Second paragraph & more."]
    assert markup[3] == " " and join_html(markup, texts) == MASTODON
    document = "<p>One &amp; two.\n1 &lt; 2\nThree.</p>"
    markup, texts = split_html_sentences(document)
    assert texts == ["One & two.", "Three."]  # "1 < 2" has no letter: it stays between, escaped again
    assert markup == ["<p>", "\n1 &lt; 2\n", "</p>"] and join_html(markup, texts) == document


def test_html_attributes_comments_and_doctype_byte_for_byte():
    document = ("<!DOCTYPE html>\n<!-- a comment -->\n<P CLASS=x title='say \"hi\"' data-a=\"a&amp;b\" hidden>"
                "Hi there</P >\n<?php echo 1 ?><img alt='A cat' src=\"c.png\"><br><br/>Bye<BR />now")
    markup, texts = split_html(document)
    assert texts == ["Hi there", "Bye", "now"]
    assert join_html(markup, texts) == document
    assert markup[0].endswith("""<P CLASS=x title='say "hi"' data-a="a&amp;b" hidden>""")  # attribute text untouched
    assert markup[2] == "<BR />"


def test_html_kept_elements_and_notranslate_nesting():
    document = ('<p>Run <code>ls &amp;&amp; <b>cd</b></code> now.</p><pre>keep\n  me</pre>'
                '<script>if (a < b) alert("x")</script><style>p { color: red }</style><textarea>draft</textarea>'
                '<div translate="no">kept <span>inner <i>deeper</i></span> tail</div> out '
                '<span class="mention notranslate">kept <b translate="no">too</b> also</span> back'
                '<ul translate="No"><li>one<li>two</ul>after')
    markup, texts = split_html(document)
    assert texts == ["Run", "now.", "out", "back", "after"]
    assert join_html(markup, texts) == document


def test_html_without_text_or_with_text_without_letters():
    for document in ["", "<p></p>", "<p> \n </p>", "<br/>", '<p><a href="x">@</a> 42 &amp; :) 🎉</p>']:
        markup, texts = split_html(document)
        assert texts == [] and markup == [document]


@pytest.mark.parametrize("document, texts", [
    ("<p>unclosed paragraph <b>bold", ["unclosed paragraph", "bold"]),
    ("stray</b> end tag</i></p>", ["stray", "end tag"]),
    ("<p>a<p>b</div>c", ["a", "b", "c"]),
    ("<b><i>misnested</b> text</i> end", ["misnested", "text", "end"]),
    ("<![weird[ section ]]>text", []),  # HTMLParser gives up on this declaration: all kept as written
    ("<p>text</>more</p>", []),  # the parser drops '</>': the run is kept as written
    ("<script>never closed", []),
    ("<div translate='no'>unclosed kept <p>still kept", []),
])
def test_malformed_html_keeps_every_character(document, texts):
    markup, found = split_html(document)
    assert found == texts and join_html(markup, found) == document


def test_a_lone_less_than_sign_is_text():
    markup, texts = split_html("a < b and <3 and <notatag")
    assert texts == ["a < b and <3 and <notatag"]  # an unclosed tag at the end is text to the parser
    assert join_html(markup, texts) == "a &lt; b and &lt;3 and &lt;notatag"


def test_html_entities_and_whitespace_outside_the_text():
    document = "<p>\n  Caf&eacute; &#8220;Zur&#x201D; &amp; more  \n</p>"
    markup, texts = split_html(document)
    assert texts == ["Café “Zur” & more"]
    assert markup == ["<p>\n  ", "  \n</p>"]
    assert join_html(markup, texts) == "<p>\n  Café “Zur” &amp; more  \n</p>"  # same text, entities normalised


def test_random_input_round_trips():
    rng = random.Random(0)
    alphabet = ["a", "B", "é", " ", "\n", ".", "!", "?", "…", '"', ")", "1", "e.g.", "Dr.", "<p>", "</p>", "<b>",
                "</i>", "<br/>", "<code>", "</code>", '<span class="notranslate">', "&amp;", "&", "<", ">", "<!--",
                "-->", "</>", "<!x>"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert interleave(*split_sentences(text)) == text
        for split in (split_html, split_html_sentences):
            markup, texts = split(text)
            assert unescape(join_html(markup, texts)) == unescape(text), text  # the same text, maybe re-escaped
