"""Build a model's vocabulary shortlist (model/shortlist.py) from training pairs.

For each source piece s, the target pieces t that occur in the same sentence pairs most often,
ranked by p(t | s) = pairs with both / pairs with s (the `frequent` pieces, which every batch
gets anyway, are left out of the ranking). Counted over a seeded sample of the corpus, each
side encoded with the model's own SentencePiece models.

    nmt shortlist --model checkpoints/en-de --data data/corpus    # checkpoints/en-de/shortlist.safetensors
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

from model.shortlist import Shortlist
from training.corpus import read_lines


def cooccurrence(sources: list[list[int]], targets: list[list[int]], source_vocab: int, target_vocab: int):
    """(pair counts (S, T), source piece counts (S,), target piece counts (T,)): in how many
    sentence pairs each piece, and each (source piece, target piece), occurs."""
    both = np.zeros(source_vocab * target_vocab, dtype=np.int64)
    source_count, target_count = np.zeros(source_vocab, np.int64), np.zeros(target_vocab, np.int64)
    for start in range(0, len(sources), 65536):
        keys = []
        for s, t in zip(sources[start: start + 65536], targets[start: start + 65536]):
            s, t = np.unique(np.asarray(s, np.int64)), np.unique(np.asarray(t, np.int64))
            source_count[s] += 1
            target_count[t] += 1
            keys.append((s[:, None] * target_vocab + t[None, :]).ravel())
        if keys:
            both += np.bincount(np.concatenate(keys), minlength=both.size)
    return both.reshape(source_vocab, target_vocab), source_count, target_count


def build_shortlist(sources: list[list[int]], targets: list[list[int]], source_vocab: int, target_vocab: int,
                    per_piece: int, frequent: int, copy_source: bool, always: list[int] = ()) -> Shortlist:
    """The `frequent` target pieces found in the most pairs (and `always`), and for each source
    piece its `per_piece` best other target pieces by p(t | s); -1 pads a piece seen with fewer."""
    both, source_count, target_count = cooccurrence(sources, targets, source_vocab, target_vocab)
    common = np.union1d(np.argsort(-target_count, kind="stable")[:frequent], np.asarray(always, np.int64))
    score = both / np.maximum(source_count, 1)[:, None]  # p(t | s), (S, T)
    score[:, common] = 0
    k = min(per_piece, target_vocab)
    best = np.argsort(-score, axis=1, kind="stable")[:, :k]  # (S, k)
    best = np.where(np.take_along_axis(score, best, axis=1) > 0, best, -1)
    return Shortlist(torch.from_numpy(best), torch.from_numpy(common), copy_source)


def shortlist_command(args: argparse.Namespace) -> None:
    model = Path(args.model)
    meta = json.loads((model / "metadata.json").read_text())
    config = json.loads((model / "config.json").read_text())
    src_lang, tgt_lang = meta["source_lang"], meta["target_lang"]
    data = Path(args.data)
    src_lines, tgt_lines = read_lines(data / f"train.{src_lang}"), read_lines(data / f"train.{tgt_lang}")
    rows = sorted(random.Random(args.seed).sample(range(len(src_lines)), min(args.pairs, len(src_lines))))
    source_sp = spm.SentencePieceProcessor(model_file=str(model / "source.spm"))
    target_sp = spm.SentencePieceProcessor(model_file=str(model / "target.spm"))
    sources = source_sp.encode([src_lines[i] for i in rows])
    targets = target_sp.encode([tgt_lines[i] for i in rows])
    shortlist = build_shortlist(sources, targets, config["src_vocab_size"], config["tgt_vocab_size"], args.per_piece,
                                args.frequent, config.get("share_embeddings", False), [config["eos_id"]])
    shortlist.save(model)
    print(f"{model}/shortlist.safetensors: {len(shortlist.frequent)} frequent pieces, up to {args.per_piece} per "
          f"source piece, from {len(rows)} pairs of {data}")


def register(subparsers) -> None:
    p = subparsers.add_parser("shortlist", help="build a model's vocabulary shortlist from a corpus's training pairs "
                              "(faster int8 decoding on the CPU)")
    p.add_argument("--model", required=True, help="checkpoint directory; the shortlist is written into it")
    p.add_argument("--data", required=True, help="corpus directory (train.<source>, train.<target>)")
    p.add_argument("--pairs", type=int, default=300_000, help="pairs sampled for the counts")
    p.add_argument("--per-piece", type=int, default=64, help="target pieces kept per source piece")
    p.add_argument("--frequent", type=int, default=512, help="most frequent target pieces, always in")
    p.add_argument("--seed", type=int, default=1)
    p.set_defaults(func=shortlist_command)
