"""SentencePiece tokenization for the source and target sides.

Token ids are SentencePiece's own, unless the checkpoint carries a vocabulary file
(`source_vocab.json` / `target_vocab.json`, piece -> id, as Marian models do); then pieces
are mapped through it and unknown pieces become UNK. The special ids come from the model
config, which the checkpoint records. A source is its pieces followed by EOS.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import sentencepiece as spm

from model.config import ModelConfig
from model.protect import SENTINELS
from model.terms import TERM_TAGS


class Tokenizer:
    def __init__(self, source_spm: Path, target_spm: Path, config: ModelConfig,
                 source_vocab: dict[str, int] | None = None, target_vocab: dict[str, int] | None = None):
        self.source_sp = spm.SentencePieceProcessor(model_file=str(source_spm))
        self.target_sp = spm.SentencePieceProcessor(model_file=str(target_spm))
        self.config = config
        self.source_vocab, self.target_vocab = source_vocab, target_vocab
        self.source_pieces_by_id = None if source_vocab is None else {i: p for p, i in source_vocab.items()}
        self.target_pieces_by_id = None if target_vocab is None else {i: p for p, i in target_vocab.items()}
        self.special_ids = {config.pad_id, config.bos_id, config.eos_id, config.decoder_start_id}
        # whether both vocabularies hold the sentinels of protected spans as single pieces
        # (model/protect.py); models trained before them do not, and get their input unmasked
        self.has_sentinels = source_vocab is None and target_vocab is None and all(
            sp.piece_to_id(s) != sp.unk_id() for sp in (self.source_sp, self.target_sp) for s in SENTINELS)
        self.sentinel_ids = {sp.piece_to_id(s) for sp in (self.source_sp, self.target_sp)
                             for s in SENTINELS} if self.has_sentinels else set()
        # whether they also hold the tags of inline term annotations (model/terms.py) as pieces
        self.has_term_tags = self.has_sentinels and all(
            sp.piece_to_id(s) != sp.unk_id() for sp in (self.source_sp, self.target_sp) for s in TERM_TAGS)
        # bounded: a text can hold any of Unicode's characters
        self.cannot_spell = functools.lru_cache(maxsize=1 << 16)(self._cannot_spell)

    def _cannot_spell(self, char: str) -> bool:
        """Whether the source vocabulary has no piece for this character: it would go in as bytes
        (or as <unk>), and the model would have to write it back byte by byte."""
        sp = self.source_sp
        return any(sp.is_byte(i) or sp.is_unknown(i) for i in sp.encode(char))

    @classmethod
    def from_dir(cls, directory: Path, config: ModelConfig) -> Tokenizer:
        d = Path(directory)
        vocabs = [json.loads((d / f).read_text()) if (d / f).exists() else None
                  for f in ("source_vocab.json", "target_vocab.json")]
        return cls(d / "source.spm", d / "target.spm", config, *vocabs)

    def encode_source(self, text: str) -> list[int]:
        """Source ids, EOS-terminated (unless the model was trained without: config.source_eos)."""
        if self.source_vocab is None:
            ids = self.source_sp.encode(text)
        else:
            unk = self.config.unk_id
            ids = [self.source_vocab.get(p, unk) for p in self.source_sp.encode(text, out_type=str)]
        return ids + [self.config.eos_id] if self.config.source_eos else ids

    def encode_target(self, text: str) -> list[int]:
        """Target ids without BOS/EOS (for training and teacher forcing)."""
        if self.target_vocab is None:
            return self.target_sp.encode(text)
        unk = self.config.unk_id
        return [self.target_vocab.get(p, unk) for p in self.target_sp.encode(text, out_type=str)]

    def source_pieces(self, ids: list[int]) -> list[str]:
        if self.source_pieces_by_id is None:
            return self.source_sp.id_to_piece(list(ids))  # one call for all: a quarter of the time of one each
        return [self.source_pieces_by_id.get(i, "<unk>") for i in ids]

    def target_pieces(self, ids: list[int]) -> list[str]:
        if self.target_pieces_by_id is None:
            return self.target_sp.id_to_piece(list(ids))
        return [self.target_pieces_by_id.get(i, "<unk>") for i in ids]

    def decode_source(self, ids: list[int]) -> str:
        """The text of source ids (EOS and the other special ids left out)."""
        return self.source_sp.decode_pieces(self.source_pieces([i for i in ids if i not in self.special_ids]))

    def decode_pieces(self, pieces: list[str]) -> str:
        return self.target_sp.decode_pieces(pieces)

    def decode_target(self, ids: list[int]) -> str:
        ids = [i for i in ids if i not in self.special_ids]
        if self.target_pieces_by_id is None:
            return self.target_sp.decode(ids)
        return self.target_sp.decode_pieces(self.target_pieces(ids))
