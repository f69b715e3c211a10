"""NMT_MAX_LOADED_MODELS: a worker loads the first model at start and each other on first use,
keeps at most N (the least recently used goes), translates as a worker holding all of them
would, and /v1/models says which worker holds which."""

from __future__ import annotations

import json
import shutil

from app.settings import Settings
from tests.conftest import ready_client


def test_models_load_on_first_use_and_the_least_recently_used_goes(tiny_sentinel_checkpoint, tmp_path):
    fr_en = tmp_path / "fr-en"
    shutil.copytree(tiny_sentinel_checkpoint, fr_en)
    meta = json.loads((fr_en / "metadata.json").read_text())
    (fr_en / "metadata.json").write_text(json.dumps({**meta, "source_lang": "fr", "target_lang": "en"}))
    dirs = [str(tiny_sentinel_checkpoint), str(fr_en)]
    body = lambda source, target: {"text": "Open the file.", "source": source, "target": target}  # noqa: E731

    def loaded(client) -> dict[str, list[int]]:
        return {m["id"]: m["loaded_on"] for m in client.get("/v1/models").json()["models"]}

    with ready_client(Settings(model_dirs=dirs, workers=1, threads_per_worker=1, max_loaded_models=1,
                               cache=False)) as client:
        assert loaded(client) == {"en-de": [0], "fr-en": []}  # the first at start, the other not yet
        first = client.post("/v1/translate", json=body("fr", "en"))
        assert first.status_code == 200, first.text
        assert loaded(client) == {"en-de": [], "fr-en": [0]}
        again = client.post("/v1/translate", json=body("en", "de"))
        assert loaded(client) == {"en-de": [0], "fr-en": []}
    with ready_client(Settings(model_dirs=dirs, workers=1, threads_per_worker=1, cache=False)) as everything:
        assert loaded(everything) == {"en-de": [0], "fr-en": [0]}
        for r, (source, target) in ((first, ("fr", "en")), (again, ("en", "de"))):
            same = everything.post("/v1/translate", json=body(source, target))
            assert same.json()["translations"] == r.json()["translations"]
