import io
import json
import shutil
import sys

import pytest
import torch

from model import pipeline
from model.cli import translate_command
from model.config import CheckpointError
from model.cpu.weights import Int8Linear
from model.search import Hypothesis
from model.translator import Translator, as_decoded, auto_dtype

SENTENCES = ["Open the file.", "Hello world, this is a small test sentence with more words.", "Click.",
             "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def translator(tiny_checkpoint):
    return Translator.load(tiny_checkpoint, device="cpu", dtype="float32")


def test_results_come_back_in_input_order_whatever_the_batching(translator):
    one_by_one = [translator.translate([s], beam_size=2, max_length=8)[0] for s in SENTENCES]
    packed = translator.translate(SENTENCES, beam_size=2, max_length=8, batch_tokens=40)  # several batches
    assert len(Translator.batches([translator.encode(s) for s in SENTENCES], 20)) > 1
    assert [r.hypotheses[0].token_ids for r in packed] == [r.hypotheses[0].token_ids for r in one_by_one]


def test_result_fields(translator):
    [result] = translator.translate(["Open the file."], beam_size=3, n_best=2, max_length=6, attention=True)
    assert result.source_tokens[-1] == "</s>"
    assert len(result.hypotheses) == 2
    best = result.hypotheses[0]
    assert best.score >= result.hypotheses[1].score
    assert best.tokens == translator.tokenizer.target_pieces(best.token_ids)
    assert best.attention.shape[2:] == (len(best.target_tokens), len(result.source_tokens))
    assert best.attention.shape[:2] == (2, 4)


def test_a_repaired_hypothesis_keeps_the_models_rows_of_attention(tiny_sentinel_checkpoint):
    """The text gets its missing span back; target_tokens stay the pieces the model wrote, one per
    row of the attention, so the alignment views line up (they failed when the two differed)."""
    translator = Translator.load(tiny_sentinel_checkpoint, device="cpu", dtype="float32")
    tok = translator.tokenizer
    source_ids = translator.encode("Open \ue000 now.")
    assert translator.reader.has_sentinel(source_ids)
    words = [i for i in translator.encode("now open") if i not in (tok.config.eos_id,)]
    attention = torch.softmax(torch.randn(2, 4, len(words) + 1, len(source_ids)), dim=-1)  # (L, H, T+EOS, S)
    hyp = as_decoded(Hypothesis(words, score=-1.0, log_prob=-2.0, ended_with_eos=True, attention=attention), True)
    result = pipeline.to_result(translator.reader, source_ids, [hyp], with_attention=True)
    best = result.hypotheses[0]
    assert best.spans_inserted == [0] and "\ue000" in best.text
    assert best.target_tokens == tok.target_pieces(words) + ["</s>"]
    assert best.attention.shape[2:] == (len(best.target_tokens), len(result.source_tokens))


def test_token_id_input_and_max_length(translator):
    ids = translator.encode("Open the file.")
    [r] = translator.translate([ids], beam_size=1, max_length=3)
    assert len(r.hypotheses[0].token_ids) <= 3


def test_bad_options_are_rejected(translator):
    with pytest.raises(ValueError, match="beam_size"):
        translator.translate(["x"], beam_size=0)
    with pytest.raises(ValueError, match="n_best"):
        translator.translate(["x"], beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="allowed: 1 to 128"):
        translator.translate(["word " * 200])


def test_the_models_length_penalty_is_the_default(tiny_checkpoint, tmp_path, monkeypatch):
    directory = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, directory)
    metadata = json.loads((directory / "metadata.json").read_text())
    assert Translator.load(directory, device="cpu", dtype="float32").length_penalty == 1.0  # none given
    (directory / "metadata.json").write_text(json.dumps({**metadata, "decoding": {"length_penalty": 1.7}}))
    translator = Translator.load(directory, device="cpu", dtype="float32")
    assert translator.length_penalty == 1.7
    used = []
    real = translator.translate_ids

    def spy(ids, options):
        used.append(options.length_penalty)
        return real(ids, options)

    monkeypatch.setattr(translator, "translate_ids", spy)
    default = translator.translate(SENTENCES[:2], beam_size=3, n_best=3, max_length=8)
    given = translator.translate(SENTENCES[:2], beam_size=3, n_best=3, max_length=8, length_penalty=1.7)
    plain = translator.translate(SENTENCES[:2], beam_size=3, n_best=3, max_length=8, length_penalty=1.0)
    assert used == [1.7, 1.7, 1.0]
    scores = lambda results: [h.score for r in results for h in r.hypotheses]  # noqa: E731
    assert scores(default) == scores(given) != scores(plain)
    for bad in ({"length_penalty": -1}, {"length_penalty": "long"}, {"length_penalty": 11}, "long"):
        (directory / "metadata.json").write_text(json.dumps({**metadata, "decoding": bad}))
        with pytest.raises(CheckpointError, match="decoding"):
            Translator.load(directory, device="cpu", dtype="float32")


def test_length_cap_rule(translator):
    assert translator.length_cap(10, None) == 25  # 1.5 * 10 + 10
    assert translator.length_cap(10, 5) == 5
    assert translator.length_cap(1000, None) == translator.max_length_cap


class CliArgs:
    beam, n_best, max_length, length_penalty, batch_tokens = 2, 1, 5, 1.0, 4096
    device, dtype, no_shortlist = "cpu", "float32", False


def run_cli(monkeypatch, capsys, checkpoint, data: bytes, **options) -> str:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    args = type("Args", (CliArgs,), {"model": checkpoint, **options})
    translate_command(args)
    return capsys.readouterr().out


def test_cli_translate_keeps_line_alignment(tiny_checkpoint, monkeypatch, capsys):
    lines = run_cli(monkeypatch, capsys, tiny_checkpoint, b"Open the file.\n\nClick.\n", n_best=2).split("\n")
    assert lines[1] == "" and len(lines) == 4  # 3 lines + trailing newline
    fields = lines[0].split("\t")
    assert len(fields) == 4 and float(fields[1]) >= float(fields[3])


def test_cli_translate_cuts_a_line_longer_than_the_model_accepts_into_sentences(tiny_checkpoint, monkeypatch,
                                                                                 capsys):
    sentences = ["Open the file and save your changes.", "Click the button to print the document."] * 6
    paragraph = "  ".join(sentences)
    translator = Translator.load(tiny_checkpoint, device="cpu", dtype="float32")
    assert len(translator.encode(paragraph)) > translator.max_source_tokens  # the model alone refuses it
    out = run_cli(monkeypatch, capsys, tiny_checkpoint, f"{paragraph}\nClick.\n".encode())
    expected = [r.hypotheses[0].text for r in translator.translate(sentences + ["Click."], beam_size=2,
                                                                   max_length=5)]
    assert out == "  ".join(expected[:-1]) + "\n" + expected[-1] + "\n"


def test_cli_translate_names_the_line_it_cannot_take(tiny_checkpoint, monkeypatch, capsys):
    with pytest.raises(SystemExit, match="line 2 has a sentence of .* tokens .* at most 128"):
        run_cli(monkeypatch, capsys, tiny_checkpoint, b"Open the file.\n" + b"word " * 200 + b"\n")
    with pytest.raises(SystemExit, match="line 3 is not valid UTF-8 \\(byte 0xFF"):
        run_cli(monkeypatch, capsys, tiny_checkpoint, b"a\nb\nc \xff\n")
    assert capsys.readouterr().out == ""  # nothing half-done


def test_int8_translator_stays_close_to_float32(tiny_checkpoint):
    fp32 = Translator.load(tiny_checkpoint, device="cpu", dtype="float32")
    int8 = Translator.load(tiny_checkpoint, device="cpu", dtype="int8")
    assert isinstance(int8.model.output_proj, Int8Linear)
    assert not any(isinstance(m, torch.nn.Linear) for m in int8.model.modules())
    src = torch.tensor([fp32.encode("Open the file and save your changes.")])
    tgt = torch.tensor([[fp32.config.decoder_start_id, 5, 9, 12]])
    reference = fp32.model(src, tgt).log_softmax(-1)
    quantized = int8.model(src, tgt).log_softmax(-1)
    assert (reference - quantized).abs().max() < 0.1 * reference.abs().max()
    [result] = int8.translate(["Open the file."], beam_size=2, max_length=6, attention=True)
    best = result.hypotheses[0]
    torch.testing.assert_close(best.attention.sum(-1), torch.ones(best.attention.shape[:3]))


def test_int8_translations_do_not_depend_on_the_batch(tiny_checkpoint):
    """The service batches strangers' requests together: each must get what it would alone.
    (Products are row-exact; padding still changes float ops upstream in their last bits, which
    can flip a rare near-tie: 5 of 200 dev sentences of the shipped model, bench/batching.py.)"""
    int8 = Translator.load(tiny_checkpoint, device="cpu", dtype="int8")
    texts = ["Open the file.", "Hello world, this is a small test sentence with more words.", "Click.",
             "The quick brown fox jumps over the lazy dog.", "Save your changes now please."]
    together = int8.translate(texts, beam_size=3, n_best=2, attention=True)
    for text, batched in zip(texts, together):
        [alone] = int8.translate([text], beam_size=3, n_best=2, attention=True)
        assert [h.token_ids for h in alone.hypotheses] == [h.token_ids for h in batched.hypotheses]
        # nearly the same: padding changes the last bits of float ops upstream (the encoder's
        # attention), and now and then such a bit moves an activation to the next int8 level
        assert [h.score for h in alone.hypotheses] == pytest.approx([h.score for h in batched.hypotheses], abs=1e-3)


def test_int8_is_cpu_only(tiny_checkpoint):
    with pytest.raises(ValueError, match="CPU only"):
        Translator.load(tiny_checkpoint, device="meta", dtype="int8")


def test_auto_dtype_is_int8_where_the_kernels_run_a_vector_path_amx_included(tiny_checkpoint, monkeypatch):
    from model import kernels

    translator = Translator.load(tiny_checkpoint, device="cpu", dtype="auto")
    assert translator.dtype == auto_dtype("cpu")
    if translator.dtype == "int8":  # int8 Linear layers, the rest float32
        assert translator.model.tgt_embed.weight.dtype == torch.float32
        assert isinstance(translator.model.output_proj, Int8Linear)
    for amx, path, avx512_bf16, expected in [(True, "avx512_vnni", True, "int8"), (True, None, False, "bfloat16"),
                                             (False, "avx512_vnni", True, "int8"), (False, "avx2", False, "int8"),
                                             (False, "scalar", True, "bfloat16"), (False, None, False, "float32")]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(kernels, "int8_path", lambda v=path: v)
        assert auto_dtype("cpu") == expected


def test_parallel_batches_give_the_same_results_in_order(tiny_checkpoint):
    translator = Translator.load(tiny_checkpoint, device="cpu", dtype="float32")
    texts = ["Open the file.", "Save your changes now please.", "Print.", "Close the window and the dialog.",
             "Hello world.", "Click the button to print the document."]
    serial = translator.translate(texts, beam_size=3, n_best=2, batch_tokens=60, attention=True)
    for parallel in (2, 4):
        together = translator.translate(texts, beam_size=3, n_best=2, batch_tokens=60, attention=True,
                                        parallel=parallel)
        for a, b in zip(serial, together):
            assert [h.token_ids for h in a.hypotheses] == [h.token_ids for h in b.hypotheses]
            assert [h.score for h in a.hypotheses] == pytest.approx([h.score for h in b.hypotheses], abs=1e-5)
            torch.testing.assert_close(a.hypotheses[0].attention, b.hypotheses[0].attention)
    one_batch = translator.translate(texts, beam_size=3, parallel=3)  # one batch is split into 3
    assert [r.hypotheses[0].token_ids for r in one_batch] == [r.hypotheses[0].token_ids for r in serial]
    with pytest.raises(ValueError, match="parallel"):
        translator.translate(texts, parallel=0)


def test_the_german_to_english_direction_keeps_spans_marks_and_capitals(tmp_path):
    """What en-de does for placeholders, tags, URLs, accelerator marks and capitals holds for a
    de-en model too (the mechanisms read the source language only for casing)."""
    import json
    from collections import Counter

    from model import protect
    from tests.conftest import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(tmp_path, sentinels=True)
    meta = json.loads((ckpt / "metadata.json").read_text())
    (ckpt / "metadata.json").write_text(json.dumps({**meta, "source_lang": "de", "target_lang": "en"}))
    translator = Translator.load(ckpt, device="cpu", dtype="float32")
    sources = ["Öffnen Sie %s mit <b>Datei</b> unter https://example.org.", "&Datei speichern",
               "BITTE DIE DATEI SPEICHERN."]
    spans, marked, shouting = (r.hypotheses[0].text for r in translator.translate(sources))
    assert Counter(protect.spans(spans)) == Counter(protect.spans(sources[0]))
    assert marked.count("&") == 1
    assert shouting == shouting.upper()
