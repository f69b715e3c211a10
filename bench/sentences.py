"""The sentences the benchmarks translate: a file (one a line), the English prose of this
repository's Markdown as a commit had it (`prose@REV`: any checkout has it, so anyone can
re-run a number measured on it), or six built-in short sentences.

    --data data/corpus/test_sw.en     # a file (the training corpus's test set, not in git)
    --data prose@c7b0ed3               # the Markdown prose at that commit (sentences of 5-30 words)
    --data prose+code@HEAD             # and the docstrings and comments of its Python files (~450)
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FALLBACK = ["Open the file and save your changes.", "Click the button to print the document.",
            "The quick brown fox jumps over the lazy dog.", "Hello world, this is a small test sentence.",
            "Choose Tools - Options and then click the General tab.", "Enter a name for the dialog and click OK."]


def prose_sentences(commit: str | None = None) -> list[str]:
    """The English sentences of this repository's Markdown prose (README.md, SECURITY.md,
    BENCHMARKS.md, docs/; no tables, code or headings; 5-30 words), as the working tree has it or
    as `commit` had it."""
    names = ["README.md", "SECURITY.md", "BENCHMARKS.md"]
    if commit is None:
        names += [str(path.relative_to(ROOT)) for path in sorted((ROOT / "docs").glob("*.md"))]
        texts = [(ROOT / name).read_text(encoding="utf-8") for name in names if (ROOT / name).is_file()]
    else:
        listed = subprocess.run(["git", "ls-tree", "--name-only", commit, "docs/"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.split()
        names += sorted(name for name in listed if name.endswith(".md"))
        texts = [subprocess.run(["git", "show", f"{commit}:{name}"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout for name in names]
    text = re.sub(r"`[^`]*`", "", "\n\n".join(texts))
    found: dict[str, None] = {}
    for block in re.split(r"\n\s*\n|\n(?=- )", text):
        block = block.strip().removeprefix("- ")
        if block.startswith(("|", "#", "```")) or block.startswith("    "):
            continue
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(block.split())):
            if 5 <= len(sentence.split()) <= 30 and sentence[-1] in ".!?" and not re.search(r"[_/=<>{}\[\]*|]", sentence):
                found[sentence] = None
    return list(found)


def code_sentences(commit: str) -> list[str]:
    """The English sentences of the docstrings and comments of the Python files `commit` had, with
    prose_sentences' filter (and none with parentheses or a #); new ones only, after the prose's."""
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    texts = []
    for name in sorted(n for n in listed if n.endswith(".py")):
        source = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        texts += [ast.get_docstring(node) or "" for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        texts.append("\n\n".join(re.findall(r"^\s*# (.*)$", source, re.M)))
    found: dict[str, None] = {}
    for block in re.split(r"\n\s*\n", re.sub(r"`[^`]*`", "", "\n\n".join(texts))):
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(block.split())):
            if (5 <= len(sentence.split()) <= 30 and sentence[-1] in ".!?" and sentence[0].isupper()
                    and not re.search(r"[_/=<>{}\[\]*|#()]", sentence)):
                found[sentence] = None
    return list(found)


def load_sentences(data: str | None, limit: int) -> list[str]:
    """The first `limit` sentences of `data` (a file, prose@REV or prose+code@REV), else FALLBACK."""
    if data and data.startswith("prose+code@"):
        commit = data.removeprefix("prose+code@")
        prose = prose_sentences(commit)
        seen = set(prose)
        return (prose + [s for s in code_sentences(commit) if s not in seen])[:limit]
    if data and data.startswith("prose@"):
        return prose_sentences(data.removeprefix("prose@"))[:limit]
    if data and Path(data).is_file():
        lines = [line.strip() for line in Path(data).read_text(encoding="utf-8").splitlines()]
        return [line for line in lines if line][:limit]
    return FALLBACK


def sentences_used(data: str | None, sentences: list[str]) -> str:
    """Which sentences a run translated, for its output: numbers from the built-in six short ones
    (where --data is missing) are not comparable with a corpus's."""
    if sentences is FALLBACK:
        return f"the {len(FALLBACK)} built-in sentences" + (f" ({data} not found)" if data else "")
    words = sorted(len(s.split()) for s in sentences)
    return f"{data}: {len(sentences)} sentences, median {words[len(words) // 2]} words"
