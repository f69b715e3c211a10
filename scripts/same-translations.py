"""Whether this working tree translates byte for byte as another revision does (for refactors).

    .venv/bin/python scripts/same-translations.py REV [--texts FILE | --corpus DIR] [--parts run serve]

Both trees translate the same texts with the shipped models (en-de, de-en) on the CPU, greedy and
beam 4 (2 best), with and without a glossary, with the Translator and through the service
(/v1/translate likewise; LibreTranslate's /translate as text and HTML with an alternative and a
glossary; DeepL's /v2/translate, requests of at most 200 texts); texts also in capitals, with an
accelerator mark, with `_` before a word and in lower case. The texts: FILE (one per line, both
models read it), or the test sets of a corpus that `nmt corpus --out DIR` built (test_sw,
test_general, test_protect: en-de reads their English side, de-en their German side; every 10th
text also in the four variants), else a built-in list with placeholders, tags, paths, e-mail
addresses and URLs. REV is checked out into a temporary git worktree; its code runs with this
environment's packages. Prints the differences and exits 1 when there are any.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Open the file and save your changes.", "Click the button to print the document.",
         "The quick brown fox jumps over the lazy dog.", "Choose Tools - Options and then click the General tab.",
         "Enter a name for the dialog and click OK.", "Delete %(count)s files from <b>{folder_name}</b>?",
         "Save the file to /tmp/out.txt or mail it to ada@example.com.", "Could not open %s: %d errors.",
         "Visit https://example.org/help for more information.", "Press Ctrl+S to save the document."]

# run inside each tree: argv = tree, texts.json, out.json, dtype (serve: and texts per request)
RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from model.terms import Terminology
from model.translator import Translator
by_language = json.load(open(sys.argv[2]))
glossary = Terminology({"file": "Akte", "document": "Schriftstück"}, ["Ctrl+S"])
out = {}
for directory, language in (("checkpoints/en-de", "en"), ("checkpoints/de-en", "de")):
    texts = by_language[language]
    translator = Translator.load(sys.argv[1] + "/" + directory, device="cpu", dtype=sys.argv[4])
    for beam in (1, 4):
        for terms in (None, glossary):
            results = translator.translate(texts, beam_size=beam, n_best=min(beam, 2), terms=terms)
            out[f"{directory}, beam {beam}, glossary {terms is not None}"] = [
                [h.text for h in r.hypotheses] + [repr(r.terms)] for r in results]
json.dump(out, open(sys.argv[3], "w"), ensure_ascii=False)
"""

# the same texts through the service (in-process, its worker a real process), each API's routes
SERVE = """
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
CHUNK = int(sys.argv[5])


def main():
    os.chdir(tempfile.mkdtemp())  # the service's databases
    from fastapi.testclient import TestClient
    from app.main import create_app
    from app.settings import Settings
    by_language = json.load(open(sys.argv[2]))
    settings = Settings(model_dirs=[sys.argv[1] + "/checkpoints/en-de", sys.argv[1] + "/checkpoints/de-en"],
                        detect_languages=["none"], cache=False, workers=1, device="cpu", max_items=CHUNK,
                        dtype=sys.argv[4])
    glossary = {"file": "Akte", "document": "Schriftstück"}
    out = {}
    with TestClient(create_app(settings)) as client:
        while client.get("/ready").status_code != 200:
            time.sleep(0.1)

        def post(path, texts, body, answers):  # requests of CHUNK texts at most; the answers of all
            rows = []
            for i in range(0, len(texts), CHUNK):
                r = client.post(path, json=body(texts[i: i + CHUNK]))
                assert r.status_code == 200, r.text
                rows += answers(r.json())
            return rows

        for source, target in (("en", "de"), ("de", "en")):
            texts = by_language[source]
            for beam in (1, 4):
                for terms in (None, glossary):
                    out[f"/v1/translate {source}-{target}, beam {beam}, glossary {terms is not None}"] = post(
                        "/v1/translate", texts,
                        lambda chunk: {"text": chunk, "source": source, "target": target, "beam_size": beam,
                                       "n_best": min(beam, 2), "glossary": terms},
                        lambda r: [[t["text"]] + [a["text"] for a in t.get("alternatives", [])]
                                   + [repr(t.get("terms"))] for t in r["translations"]])
            for format in ("text", "html"):
                out[f"/translate {source}-{target}, {format}"] = post(
                    "/translate", texts,
                    lambda chunk: {"q": chunk, "source": source, "target": target, "format": format,
                                   "alternatives": 1, "glossary": glossary},
                    lambda r: [[t] + a for t, a in zip(r["translatedText"], r["alternatives"])])
            out[f"/v2/translate {source}-{target}"] = post(
                "/v2/translate", texts,
                lambda chunk: {"text": chunk, "source_lang": source.upper(), "target_lang": target.upper()},
                lambda r: [[t["text"]] for t in r["translations"]])
    json.dump(out, open(sys.argv[3], "w"), ensure_ascii=False)


if __name__ == "__main__":  # the worker is spawned: it imports this file again
    main()
"""


def variants(text: str) -> list[str]:
    return [text, text.upper(), "&" + text, text.replace("file", "_file"), text.lower()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the revision to compare with")
    ap.add_argument("--texts", type=Path, help="one text per line, for both models (default: a built-in list)")
    ap.add_argument("--corpus", type=Path, help="a corpus directory with test_{sw,general,protect}.{en,de}")
    ap.add_argument("--limit", type=int, help="with --corpus: its first N texts per language")
    ap.add_argument("--chunk", type=int, default=200, help="texts per request to the service (1: each alone, "
                    "so no text shares a batch with another; default 200)")
    ap.add_argument("--no-variants", action="store_true", help="the texts as given, no capitals, marks, lower case")
    ap.add_argument("--dtype", default="auto", help="the models' dtype (default: auto; float32 takes the "
                    "batch-composition effects of bf16 and int8 out of the comparison)")
    ap.add_argument("--parts", nargs="+", choices=("run", "serve"), default=["run", "serve"],
                    help="run: the Translator; serve: the service's /v1/translate, /translate (text, html) "
                    "and /v2/translate (default: both)")
    args = ap.parse_args()
    if args.corpus:
        by_language = {}
        for language in ("en", "de"):
            base = [line.strip() for name in ("test_sw", "test_general", "test_protect")
                    for line in (args.corpus / f"{name}.{language}").read_text().splitlines() if line.strip()]
            base = base[: args.limit] if args.limit else base
            by_language[language] = base + ([] if args.no_variants else
                                            [v for text in base[::10] for v in variants(text)[1:]])
    else:
        base = [line.strip() for line in args.texts.read_text().splitlines() if line.strip()] if args.texts else TEXTS
        texts = base if args.no_variants else [v for text in base for v in variants(text)]
        by_language = {"en": texts, "de": texts}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "texts.json").write_text(json.dumps(by_language))
        (tmp / "run.py").write_text(RUN)
        (tmp / "serve.py").write_text(SERVE)
        other = tmp / "other"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(other), args.rev], cwd=ROOT, check=True)
        try:
            outputs = {}
            for name, tree in (("other", other), ("this", ROOT)):
                outputs[name] = {}
                for script in args.parts:
                    subprocess.run([sys.executable, str(tmp / f"{script}.py"), str(tree), str(tmp / "texts.json"),
                                    str(tmp / f"{name}.json"), args.dtype, str(args.chunk)], check=True)
                    outputs[name].update(json.loads((tmp / f"{name}.json").read_text()))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=False)
    differences = 0
    for setting, theirs in outputs["other"].items():
        texts = by_language["de" if "de-en" in setting else "en"]
        assert len(theirs) == len(outputs["this"][setting]) == len(texts), setting
        for text, a, b in zip(texts, theirs, outputs["this"][setting]):
            if a != b:
                differences += 1
                print(f"{setting}: {text!r}\n  {args.rev}: {a}\n  this tree: {b}")
    sizes = " and ".join(f"{len(texts)} {language}" for language, texts in by_language.items())
    print(f"{sizes} texts x {len(outputs['other'])} settings: {differences} differ")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
