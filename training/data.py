"""Training data: the corpus read (with its repeats, subsamples and back-translated pairs), the
SentencePiece model, the encoded corpus, and token-bucketed batches."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

from model import protect
from model.config import ModelConfig
from model.terms import TERM_TAGS
from training.annotate import annotate_corpus
from training.backtranslate import backtranslated_files
from training.corpus import read_lines

SPECIAL_IDS = dict(pad_id=0, unk_id=1, bos_id=2, eos_id=3)


@dataclass
class Corpus:
    source: list[str]
    target: list[str]
    description: dict = field(default_factory=dict)


DIRECTIONS = ("en-de", "de-en")  # a corpus holds .en and .de files; a run reads them in one direction


def languages(direction: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'): the source and target language, also the corpus files' suffixes."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: one of {', '.join(DIRECTIONS)}")
    source, target = direction.split("-")
    return source, target


def load_training_corpus(data_dir: Path, dict_keep: int, seed: int, short_keep: int = -1,
                         repeat: dict[str, int] | None = None, subsample: dict[str, int] | None = None,
                         direction: str = "en-de", term_share: float = 0.0,
                         glosses: list[tuple[str, str]] | None = None, back_translated: bool = False) -> Corpus:
    """The training pairs of `direction`, weighted toward full sentences.

    - `ding_dict` word/phrase entries are subsampled to `dict_keep`: ~312k of the pairs are 1-3
      word dictionary entries; kept whole they would be a third of the updates and teach the model
      to emit fragments.
    - 1-2 word pairs of the other sources (menu labels, mostly) are subsampled to `short_keep`
      (-1: all), for the same reason.
    - `subsample` cuts a source's pairs to a count (e.g. {"bible": 30000}: its verses are long,
      so the whole Bible would be a large share of the target tokens).
    - `repeat` repeats a source's pairs (e.g. {"ding": 2}: the Ding example sentences are the
      little general, conversational language there is).
    - `term_share` of the pairs are examined for inline term annotations from `glosses`
      ((source-language, target-language) terms; training/annotate.py).
    - `back_translated` adds the corpus's synthetic pairs for `direction` (source `backtranslated`;
      training/backtranslate.py), which `repeat` and `subsample` weigh like any source.
    """
    d = Path(data_dir)
    en, de = read_lines(d / "train.en"), read_lines(d / "train.de")
    sources = read_lines(d / "train.source") if (d / "train.source").exists() else ["all"] * len(en)
    if not len(en) == len(de) == len(sources):
        raise ValueError(f"{d}: train.en/train.de/train.source differ in length")
    if back_translated:
        files = backtranslated_files(d, direction)
        if not all(path.exists() for path in files):
            raise SystemExit(f"{d} has no back-translated pairs for {direction} ({files[0].name}): write them with "
                             f"`nmt monolingual` and `nmt backtranslate --model <a {direction[3:]}-{direction[:2]} model>`")
        bt_en, bt_de = (read_lines(path) for path in files)
        if len(bt_en) != len(bt_de):
            raise ValueError(f"{d}: the back-translated files of {direction} differ in length")
        en, de, sources = en + bt_en, de + bt_de, sources + ["backtranslated"] * len(bt_en)
    chosen = np.ones(len(en), dtype=bool)
    rng = np.random.default_rng(seed)
    dict_rows = np.array([i for i, s in enumerate(sources) if s == "ding_dict"], dtype=np.int64)
    short_rows = np.array([i for i, s in enumerate(sources) if s != "ding_dict" and len(en[i].split()) <= 2],
                          dtype=np.int64)
    source_rows = [(np.array([i for i, s in enumerate(sources) if s == src], dtype=np.int64), n)
                   for src, n in (subsample or {}).items()]
    for rows, limit in ((dict_rows, dict_keep), (short_rows, short_keep), *source_rows):
        if 0 <= limit < len(rows):
            chosen[rows] = False
            chosen[rng.choice(rows, size=limit, replace=False)] = True
    rows = np.flatnonzero(chosen)
    repeat = repeat or {}
    rows = np.concatenate([rows] + [rows[[sources[i] == src for i in rows]] for src, n in repeat.items()
                                    for _ in range(n - 1)])
    rows.sort(kind="stable")
    counts: dict[str, int] = {}
    for i in rows:
        counts[sources[i]] = counts.get(sources[i], 0) + 1
    # protected spans become sentinels, numbered in a seeded random order (model/protect.py)
    rng = random.Random(seed)
    src, tgt = (en, de) if languages(direction)[0] == "en" else (de, en)  # the same rows either way
    masked = [protect.mask_pair(src[i], tgt[i], rng) for i in rows]
    kept = [m for m in masked if m is not None]
    annotated: dict[str, int] = {}
    if term_share > 0:
        annotated_sources, annotated_targets, annotated = annotate_corpus(
            [m[0] for m in kept], [m[1] for m in kept], glosses or [], term_share, seed)
        kept = list(zip(annotated_sources, annotated_targets))
    description = {"pairs": len(kept), "pairs_by_source": dict(sorted(counts.items())),
                   "ding_dict_available": int(len(dict_rows)), "ding_dict_kept": int(counts.get("ding_dict", 0)),
                   "short_available": int(len(short_rows)), "short_keep": short_keep, "subsample": subsample or {},
                   "repeat": repeat,
                   "pairs_with_spans": sum(any(c in protect.SENTINELS for c in m[0]) for m in kept),
                   "dropped_span_mismatch": len(masked) - len(kept), "term_annotated_pairs": sum(annotated.values()), **annotated}
    return Corpus([m[0] for m in kept], [m[1] for m in kept], description)


def load_heldout(path_en: Path, path_de: Path) -> tuple[list[str], list[str]]:
    """A held-out set with spans masked left to right, as the Translator masks its input."""
    pairs = [protect.mask_pair(e, d) for e, d in zip(read_lines(path_en), read_lines(path_de))]
    pairs = [p for p in pairs if p is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def with_sentinels(spm_path: Path, out: Path) -> Path:
    """A copy of a SentencePiece model with the sentinels of protected spans and the term
    annotation tags appended as user-defined pieces (ids after its own, which keep their ids),
    unless it has them already."""
    from sentencepiece import sentencepiece_model_pb2 as pb  # needs protobuf (the `train` extra)

    proto = pb.ModelProto()
    proto.ParseFromString(Path(spm_path).read_bytes())
    have = {p.piece for p in proto.pieces}
    for s in protect.SENTINELS + list(TERM_TAGS):
        if s not in have:
            piece = proto.pieces.add()
            piece.piece, piece.score, piece.type = s, 0.0, pb.ModelProto.SentencePiece.USER_DEFINED
    out.write_bytes(proto.SerializeToString())
    return out


def train_sentencepiece(corpus: Corpus, prefix: Path, vocab_size: int, sample_size: int, seed: int) -> Path:
    """A joint unigram model over both sides (shared embeddings need one vocabulary).

    Normalisation is `identity`: software strings use characters such as the ellipsis that
    NFKC would rewrite, and the output must reproduce them. Byte fallback means no <unk>.
    The sentinels of protected spans are user-defined symbols: always one piece each.
    """
    text = Path(f"{prefix}.train.txt")
    with open(text, "w", encoding="utf-8") as f:
        for line in corpus.source + corpus.target:
            if line.strip():
                f.write(line + "\n")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), model_type="unigram", vocab_size=vocab_size,
        input_sentence_size=sample_size, shuffle_input_sentence=True, seed_sentencepiece_size=1_000_000,
        character_coverage=0.9999, byte_fallback=True, normalization_rule_name="identity",
        user_defined_symbols=protect.SENTINELS + list(TERM_TAGS),  # one unsplittable piece each
        hard_vocab_limit=False, num_threads=max(1, torch.get_num_threads()), minloglevel=2,
        **SPECIAL_IDS, pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
    )
    text.unlink()
    return Path(f"{prefix}.model")


@dataclass
class EncodedCorpus:
    src: list[np.ndarray]  # each: source ids + EOS
    tgt: list[np.ndarray]  # each: target ids (no BOS/EOS)

    def __len__(self) -> int:
        return len(self.src)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Source length (with EOS) and decoder length (target + EOS/BOS) of every pair."""
        return (np.array([len(s) for s in self.src], dtype=np.int64),
                np.array([len(t) + 1 for t in self.tgt], dtype=np.int64))


def encode_corpus(sp: spm.SentencePieceProcessor, en: list[str], de: list[str], eos_id: int,
                  max_len: int) -> EncodedCorpus:
    """Encode pairs; drop pairs with an empty side or longer than max_len tokens."""
    src_ids, tgt_ids = sp.encode(en), sp.encode(de)
    src, tgt = [], []
    for s, t in zip(src_ids, tgt_ids):
        if 0 < len(s) < max_len and 0 < len(t) < max_len:
            src.append(np.array(s + [eos_id], dtype=np.int64))
            tgt.append(np.array(t, dtype=np.int64))
    return EncodedCorpus(src, tgt)


def make_batches(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int, seed: int, epoch: int,
                 sort_chunk: int) -> list[np.ndarray]:
    """One epoch of token-based batches, a pure function of (seed, epoch).

    Shuffle, sort each chunk of `sort_chunk` pairs by length (so a batch holds similar
    lengths and little padding), pack greedily so that rows x longest side <= max_tokens,
    then shuffle the batches (so length does not drift across the epoch).
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src_len))
    longest = np.maximum(src_len, tgt_len)
    batches = []
    for start in range(0, len(order), sort_chunk):
        chunk = order[start : start + sort_chunk]
        chunk = chunk[np.lexsort((src_len[chunk], tgt_len[chunk]))]  # by target, then source length
        current, width = [], 0
        for i in chunk:
            w = max(width, int(longest[i]))
            if current and w * (len(current) + 1) > max_tokens:
                batches.append(np.array(current))
                current, w = [], int(longest[i])
            current.append(i)
            width = w
        if current:
            batches.append(np.array(current))
    return [batches[i] for i in rng.permutation(len(batches))]


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) PAD-padded, EOS-terminated
    tgt_in: torch.Tensor  # (B, T) decoder_start + target
    tgt_out: torch.Tensor  # (B, T) target + EOS
    n_src: int  # real source tokens
    n_tgt: int  # real target tokens (the loss normaliser)


def collate(data: EncodedCorpus, rows: np.ndarray, c: ModelConfig) -> Batch:
    S = max(len(data.src[i]) for i in rows)
    T = max(len(data.tgt[i]) for i in rows) + 1
    src = torch.full((len(rows), S), c.pad_id, dtype=torch.long)
    tgt_in = torch.full((len(rows), T), c.pad_id, dtype=torch.long)
    tgt_out = torch.full((len(rows), T), c.pad_id, dtype=torch.long)
    for r, i in enumerate(rows):
        s, t = torch.from_numpy(data.src[i]), torch.from_numpy(data.tgt[i])
        src[r, : len(s)] = s
        tgt_in[r, 0] = c.decoder_start_id
        tgt_in[r, 1 : len(t) + 1] = t
        tgt_out[r, : len(t)] = t
        tgt_out[r, len(t)] = c.eos_id
    n_tgt = int((tgt_out != c.pad_id).sum())
    return Batch(src, tgt_in, tgt_out, int((src != c.pad_id).sum()), n_tgt)


class BatchStream:
    """Endless stream of batches over epochs; its position is (epoch, index in epoch)."""

    def __init__(self, data: EncodedCorpus, config: ModelConfig, max_tokens: int, seed: int, sort_chunk: int,
                 epoch: int = 0, position: int = 0):
        self.data, self.config = data, config
        self.max_tokens, self.seed, self.sort_chunk = max_tokens, seed, sort_chunk
        self.src_len, self.tgt_len = data.lengths()
        self.epoch, self.position = epoch, position
        self.batches = self.epoch_batches(epoch)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        return make_batches(self.src_len, self.tgt_len, self.max_tokens, self.seed, epoch, self.sort_chunk)

    def next(self) -> Batch:
        if self.position >= len(self.batches):
            self.epoch, self.position = self.epoch + 1, 0
            self.batches = self.epoch_batches(self.epoch)
        rows = self.batches[self.position]
        self.position += 1
        return collate(self.data, rows, self.config)
