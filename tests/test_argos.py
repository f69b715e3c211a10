"""Argos Translate packages (model/convert/argos.py): an installed package folder, an .argosmodel
file and a folder of packages become our checkpoints, converted once per package content and again
when the package changes, and the service serves them straight from NMT_MODEL_DIRS."""

from __future__ import annotations

import json
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from app.settings import Settings
from model import protect
from model.config import ModelConfig
from model.convert.argos import checkpoints, import_argos
from model.convert.ctranslate2 import CT2ImportError, export_ct2
from model.transformer import Transformer
from model.translator import Translator
from tests.conftest import ready_client, train_tiny_spm

pytest.importorskip("ctranslate2")


NAMES = {"en": "English", "de": "German", "fr": "French", "pb": "Portuguese (Brazil)"}


def make_package(root: Path, from_code: str = "en", to_code: str = "de", seed: int = 0) -> Path:
    """A package as Argos installs one: metadata.json, model/ (CTranslate2, from a random model
    over the SentencePiece model's pieces) and sentencepiece.model."""
    package = root / f"translate-{from_code}_{to_code}-1_0"
    spm_path = train_tiny_spm(root / f"spm-{from_code}-{to_code}")
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    torch.manual_seed(seed)
    config = ModelConfig(src_vocab_size=len(pieces), tgt_vocab_size=len(pieces), d_model=32, n_heads=4, d_ff=64,
                         encoder_layers=1, decoder_layers=1, norm="pre", share_embeddings=True, dropout=0.0,
                         max_positions=64, pad_id=0, unk_id=1, bos_id=2, eos_id=3, decoder_start_id=2,
                         source_eos=False)
    export_ct2(Transformer(config).eval(), pieces, pieces, package / "model")
    (package / "sentencepiece.model").write_bytes(spm_path.read_bytes())
    (package / "metadata.json").write_text(json.dumps({
        "package_version": "1.0", "argos_version": "1.0", "from_code": from_code, "from_name": NAMES[from_code],
        "to_code": to_code, "to_name": NAMES[to_code]}))
    return package


def test_a_package_becomes_a_checkpoint(tmp_path):
    out = import_argos(make_package(tmp_path), tmp_path / "ckpt")
    meta = json.loads((out / "metadata.json").read_text())
    assert (meta["source_lang"], meta["target_lang"]) == ("en", "de")
    assert meta["imported_from"]["format"] == "argos" and meta["imported_from"]["package_version"] == "1.0"
    assert not json.loads((out / "config.json").read_text())["source_eos"]


def test_packages_are_converted_once_and_again_when_they_change(tmp_path):
    folder = tmp_path / "packages"
    package = make_package(folder)
    make_package(folder, "de", "en", seed=1)
    cache = tmp_path / "cache"
    first = checkpoints([str(folder)], cache)
    assert len(first) == 2 and all((p / "model.safetensors").is_file() for p in first)
    stamp = (first[0] / "model.safetensors").stat().st_mtime_ns
    assert checkpoints([str(folder)], cache) == first
    assert (first[0] / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again
    meta = json.loads((package / "metadata.json").read_text())
    (package / "metadata.json").write_text(json.dumps({**meta, "package_version": "1.1"}))
    again = checkpoints([str(package)], cache)
    assert again[0] not in first and json.loads((again[0] / "metadata.json").read_text())["imported_from"][
        "package_version"] == "1.1"


def test_an_argosmodel_file_and_its_refusals(tmp_path):
    package = make_package(tmp_path / "src")
    archive = tmp_path / "translate-en_de-1_0.argosmodel"
    with zipfile.ZipFile(archive, "w") as z:
        for path in package.rglob("*"):
            if path.is_file():
                z.write(path, f"{package.name}/{path.relative_to(package)}")
    [checkpoint] = checkpoints([str(archive)], tmp_path / "cache")
    assert json.loads((checkpoint / "metadata.json").read_text())["target_lang"] == "de"
    evil = tmp_path / "evil.argosmodel"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../outside.txt", "x")
    with pytest.raises(CT2ImportError, match="outside the package"):
        checkpoints([str(evil)], tmp_path / "cache")
    with pytest.raises(CT2ImportError, match="not a checkpoint directory, an Argos package"):
        checkpoints([str(tmp_path / "nothing-here")], tmp_path / "cache")


def test_the_service_serves_packages_from_nmt_model_dirs(tmp_path, tiny_sentinel_checkpoint):
    folder = tmp_path / "packages"
    make_package(folder, "en", "fr")
    make_package(folder, "pb", "en", seed=1)
    settings = Settings(model_dirs=[str(folder), str(tiny_sentinel_checkpoint)], model_cache=str(tmp_path / "cache"),
                        workers=1, threads_per_worker=1, max_wait_ms=2, detect_languages=["en", "de", "fr"])
    with ready_client(settings) as client:
        languages = client.get("/languages").json()
        pairs = {(lang["code"], target) for lang in languages for target in lang["targets"]}
        # every package, and the pivots between them and the checkpoint: pb -> en -> fr, pb -> en -> de
        assert {("en", "fr"), ("en", "de"), ("pt-BR", "en"), ("pt-BR", "fr"), ("pt-BR", "de")} <= pairs
        assert {lang["code"]: lang["name"] for lang in languages}["pt-BR"] == "Portuguese (Brazil)"
        r = client.post("/v1/translate", json={"text": "Abra o arquivo.", "source": "pt-BR", "target": "fr"})
        assert r.status_code == 200 and r.json()["pivot"] == "en" and r.json()["model"] == "pb-fr", r.text
        r = client.post("/v1/translate", json={"text": "Open the file.", "source": "en", "target": "fr",
                                               "alignments": True})
        assert r.status_code == 200 and r.json()["model"] == "en-fr", r.text
        alignment = client.get(f"/v1/alignments/{r.json()['translations'][0]['alignment_id']}")
        assert alignment.status_code == 200
        assert client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"}).status_code == 200
        # its vocabulary has no sentinels: placeholders and tags go back where the attention points,
        # exactly as the Python API puts them
        text = "Open {file} in <b>the</b> window %s now."
        r = client.post("/v1/translate", json={"text": text, "source": "en", "target": "fr"})
        out = r.json()["translations"][0]["text"]
        assert Counter(protect.spans(out)) == Counter(protect.spans(text)), out
        lt = client.post("/translate", json={"q": text, "source": "en", "target": "fr"}).json()["translatedText"]
        assert lt == out  # one sentence: /translate and /v1/translate put the spans back alike
        glossary = client.post("/translate", json={"q": "Open the window now.", "source": "en", "target": "fr",
                                                   "glossary": {"window": "fenêtre"}}).json()
        assert "fenêtre" in glossary["translatedText"] and glossary["terms"]["applied"] == ["window"]
        served = client.app.state.service.registry.models["en-fr"].directory
        assert out == Translator.load(served, device="cpu", dtype="auto").translate([text])[0].hypotheses[0].text
    broken = Settings(model_dirs=[str(tmp_path / "missing")], model_cache=str(tmp_path / "cache"))
    with pytest.raises(Exception, match="not a checkpoint directory"), ready_client(broken):
        pass
