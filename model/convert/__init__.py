"""Readers of other toolkits' checkpoints into ours: Hugging Face MarianMT (`marian`), Marian
release folders (`marian_npz`), CTranslate2 directories (`ctranslate2`), Argos packages (`argos`)."""

from __future__ import annotations


def check_mapping(problems: list[str], out: dict, expected: dict, unused: list[str], described_by: str) -> None:
    """Add to `problems` what is wrong with tensors read from a foreign file: ours (`expected`:
    name -> shape) that nothing maps to (unless a problem names it already), shapes other than
    what `described_by` implies, and the file's tensors left `unused` (they would change the
    computation)."""
    for name, shape in expected.items():
        if name not in out:
            if not any(name in p for p in problems):
                problems.append(f"nothing in the file for our {name}")
        elif tuple(out[name].shape) != tuple(shape):
            problems.append(f"{name}: shape {tuple(out[name].shape)} from the file, {described_by} implies "
                            f"{tuple(shape)}")
    if unused:
        problems.append(f"unexpected tensors (they would change the computation): {', '.join(unused[:8])}"
                        + (f" and {len(unused) - 8} more" if len(unused) > 8 else ""))
