"""Whether this working tree translates byte for byte as another revision does (for refactors).

    .venv/bin/python scripts/same-translations.py REV [--texts FILE]

Both trees translate the same texts with the shipped models (en-de, de-en) on the CPU, greedy and
beam 4 (2 best), with and without a glossary, with the Translator and through the service
(/v1/translate likewise; LibreTranslate's /translate as text and HTML with an alternative and a
glossary; DeepL's /v2/translate); each text also in capitals, with an accelerator mark, with `_`
before a word and in lower case. The texts: FILE (one per line), else a built-in
list with placeholders, tags, paths, e-mail addresses and URLs. REV is checked out into a
temporary git worktree; its code runs with this environment's packages. Prints the differences
and exits 1 when there are any.
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

# run inside each tree: argv = tree, texts.json, out.json
RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from model.terms import Terminology
from model.translator import Translator
texts = json.load(open(sys.argv[2]))
glossary = Terminology({"file": "Akte", "document": "Schriftstück"}, ["Ctrl+S"])
out = {}
for directory in ("checkpoints/en-de", "checkpoints/de-en"):
    translator = Translator.load(sys.argv[1] + "/" + directory, device="cpu")
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


def main():
    os.chdir(tempfile.mkdtemp())  # the service's databases
    from fastapi.testclient import TestClient
    from app.main import create_app
    from app.settings import Settings
    texts = json.load(open(sys.argv[2]))
    settings = Settings(model_dirs=[sys.argv[1] + "/checkpoints/en-de", sys.argv[1] + "/checkpoints/de-en"],
                        detect_languages=["none"], cache=False, workers=1, device="cpu", max_items=len(texts))
    glossary = {"file": "Akte", "document": "Schriftstück"}
    out = {}
    with TestClient(create_app(settings)) as client:
        while client.get("/ready").status_code != 200:
            time.sleep(0.1)
        for source, target in (("en", "de"), ("de", "en")):
            for beam in (1, 4):
                for terms in (None, glossary):
                    body = {"text": texts, "source": source, "target": target, "beam_size": beam,
                            "n_best": min(beam, 2), "glossary": terms}
                    r = client.post("/v1/translate", json=body).json()
                    out[f"/v1/translate {source}-{target}, beam {beam}, glossary {terms is not None}"] = [
                        [t["text"]] + [a["text"] for a in t.get("alternatives", [])] + [repr(t.get("terms"))]
                        for t in r["translations"]]
            for format in ("text", "html"):
                r = client.post("/translate", json={"q": texts, "source": source, "target": target, "format": format,
                                                    "alternatives": 1, "glossary": glossary}).json()
                out[f"/translate {source}-{target}, {format}"] = [[t] + a for t, a in zip(r["translatedText"],
                                                                                          r["alternatives"])]
            r = client.post("/v2/translate", json={"text": texts, "source_lang": source.upper(),
                                                   "target_lang": target.upper()}).json()
            out[f"/v2/translate {source}-{target}"] = [[t["text"]] for t in r["translations"]]
    json.dump(out, open(sys.argv[3], "w"), ensure_ascii=False)


if __name__ == "__main__":  # the worker is spawned: it imports this file again
    main()
"""


def variants(text: str) -> list[str]:
    return [text, text.upper(), "&" + text, text.replace("file", "_file"), text.lower()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the revision to compare with")
    ap.add_argument("--texts", type=Path, help="one text per line (default: a built-in list)")
    ap.add_argument("--parts", nargs="+", choices=("run", "serve"), default=["run", "serve"],
                    help="run: the Translator; serve: the service's /v1/translate, /translate (text, html) "
                    "and /v2/translate (default: both)")
    args = ap.parse_args()
    base = [line.strip() for line in args.texts.read_text().splitlines() if line.strip()] if args.texts else TEXTS
    texts = [v for text in base for v in variants(text)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "texts.json").write_text(json.dumps(texts))
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
                                    str(tmp / f"{name}.json")], check=True)
                    outputs[name].update(json.loads((tmp / f"{name}.json").read_text()))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=False)
    differences = 0
    for setting, theirs in outputs["other"].items():
        for text, a, b in zip(texts, theirs, outputs["this"][setting]):
            if a != b:
                differences += 1
                print(f"{setting}: {text!r}\n  {args.rev}: {a}\n  this tree: {b}")
    print(f"{len(texts)} texts x {len(outputs['other'])} settings: {differences} differ")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
