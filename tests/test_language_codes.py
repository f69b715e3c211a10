"""Regional variants as LibreTranslate shows them: Argos packages code Brazilian Portuguese 'pb' and
Traditional Chinese 'zt'; LibreTranslate lists them as 'pt-BR' and 'zh-Hant' ('zh' as 'zh-Hans'),
accepts either, falls back to the other variant when only one is installed, and names languages
as the packages do. So do we."""

from __future__ import annotations

import json
import shutil

import pytest

from app.registry import Registry, load_model
from app.settings import Settings
from tests.conftest import ready_client


@pytest.fixture(scope="module")
def served(tiny_sentinel_checkpoint, tmp_path_factory):
    """en -> pb and en -> zt, as converted Argos packages say (with the packages' names)."""
    dirs = []
    for target, name in (("pb", "Portuguese (Brazil)"), ("zt", "Chinese (traditional)")):
        d = tmp_path_factory.mktemp(f"en-{target}") / "ckpt"
        shutil.copytree(tiny_sentinel_checkpoint, d)
        meta = json.loads((d / "metadata.json").read_text())
        meta.update(source_lang="en", target_lang=target,
                    imported_from={"format": "argos", "from_name": "English", "to_name": name})
        (d / "metadata.json").write_text(json.dumps(meta))
        dirs.append(str(d))
    return dirs


def test_requests_may_use_either_code_and_fall_back_to_the_other_variant(served):
    registry = Registry([load_model(d) for d in served])
    for asked in ("pb", "pt-BR", "PT-BR", "pt-br", "pt", "pt-PT"):
        assert registry.code(asked) == "pb", asked
    for asked in ("zt", "zh-Hant", "zh-TW", "zh", "zh-Hans", "zh-CN"):
        assert registry.code(asked) == "zt", asked  # no Simplified model: the Traditional one
    assert registry.code("EN-GB") == "en" and registry.code("auto") == "auto" and registry.code("fr") == "fr"
    assert registry.model("en", "pt-BR").id == "en-pb"
    with pytest.raises(ValueError, match="no model translates 'en' to 'fr'"):
        registry.model("en", "fr")


def test_lists_report_libretranslates_codes_and_the_packages_names(served):
    registry = Registry([load_model(d) for d in served])
    assert registry.languages() == [("en", "English", ["pt-BR", "zh-Hant"]),
                                    ("pt-BR", "Portuguese (Brazil)", []), ("zh-Hant", "Chinese (traditional)", [])]


def test_the_apis_take_and_give_those_codes(served):
    settings = Settings(model_dirs=served, workers=1, threads_per_worker=1, max_wait_ms=2, detect_languages=["en", "pt", "zh"])
    with ready_client(settings) as client:
        listed = {lang["code"]: (lang["name"], lang["targets"]) for lang in client.get("/languages").json()}
        assert listed["en"] == ("English", ["pt-BR", "zh-Hant"]) and "pb" not in listed
        texts = {}
        for target in ("pb", "pt-BR", "pt"):
            r = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": target})
            assert r.status_code == 200, r.text
            texts[target] = r.json()["translatedText"]
        assert len(set(texts.values())) == 1
        r = client.post("/translate", json={"q": "Open the file.", "source": "auto", "target": "zh-Hant"})
        assert r.status_code == 200 and r.json()["detectedLanguage"]["language"] == "en", r.text
        r = client.post("/v2/translate", json={"text": ["Open the file."], "target_lang": "PT-BR"})
        assert r.status_code == 200, r.text
        assert r.json()["translations"][0]["text"] == texts["pb"]
        deepl_targets = {t["language"] for t in client.get("/v2/languages", params={"type": "target"}).json()}
        assert {"PT-BR", "ZH-HANT"} <= deepl_targets
