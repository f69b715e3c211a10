"""The served models as the server process sees them: languages, limits, tokenizer.

The server never loads weights (workers do); it reads each checkpoint's config, metadata and
SentencePiece models, so it can count tokens, reject over-long input and describe the model. Its
language detector (app/language.py) serves POST /detect and source 'auto'.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

from app.language import CLEAR, LanguageDetector
from app.language import language_name as detector_language_name
from model.config import SHORTLIST_FILE, CheckpointError, ModelConfig, length_penalty_of, read_header
from model.pipeline import Reader
from model.tokenizer import Tokenizer

LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German",
    "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French",
    "ga": "Irish", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "nb": "Norwegian Bokmål",
    "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}


# Argos packages name regional variants with codes of their own; LibreTranslate reports those as
# these (libretranslate/language.py), accepts either, and falls back to the language's other
# variant when only one is installed. So do we: models keep the package's code, requests may use
# either, and the languages lists report these.
VARIANT_CODES = {"pb": "pt-BR", "zh": "zh-Hans", "zt": "zh-Hant"}
_ALIASES = {v.lower(): k for k, v in VARIANT_CODES.items()} | {"zh-cn": "zh", "zh-tw": "zt"}
_OTHER_VARIANT = {"pt": "pb", "pb": "pt", "zh": "zt", "zt": "zh"}


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code) or detector_language_name(code)


def reported_code(code: str) -> str:
    """The code the languages lists and detectedLanguage show for a model's code ('pb' -> 'pt-BR')."""
    return VARIANT_CODES.get(code, code)


@dataclass
class ServedModel:
    id: str  # "<source>-<target>"
    source: str
    target: str
    directory: Path
    config: ModelConfig
    tokenizer: Tokenizer
    parameters: int
    fingerprint: str = ""  # SHA-256 of its weights (and shortlist): a cached translation belongs to these
    names: dict[str, str] = field(default_factory=dict)  # language names its package gives (Argos metadata)
    term_annotations: bool = False  # trained with inline term annotations (training/annotate.py)
    length_penalty: float = 1.0  # what it decodes with unless a request says (metadata.json: decoding)

    @property
    def max_source_tokens(self) -> int:
        return self.config.max_positions

    @property
    def protects_spans(self) -> bool:
        """Whether its vocabulary has sentinels for placeholders, tags, URLs (model/protect.py)."""
        return self.tokenizer.has_sentinels

    @property
    def reads_annotations(self) -> bool:
        """Whether it reads glossary terms inline with their target terms (model/terms.py)."""
        return self.term_annotations and self.tokenizer.has_term_tags

    @cached_property
    def reader(self) -> Reader:
        """What the text pipeline (model/pipeline.py) needs to know of it."""
        return Reader(self.tokenizer, self.source, self.reads_annotations, self.max_source_tokens)

    def config_summary(self) -> dict:
        keys = ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers", "src_vocab_size",
                "tgt_vocab_size", "max_positions", "norm", "activation", "share_embeddings")
        config = asdict(self.config)
        return {k: config[k] for k in keys}


def as_checkpoints(entries: list[str], cache: str) -> list[str]:
    """Our checkpoint directories for NMT_MODEL_DIRS's entries. Anything else (Argos packages) is
    converted by model/convert/argos.py in a child process, since converting needs torch, which
    this process never imports."""
    if all((Path(e).expanduser() / "model.safetensors").is_file() for e in entries):
        return entries
    run = subprocess.run([sys.executable, "-m", "model.convert.argos", "--cache", str(Path(cache).expanduser()),
                          *entries], capture_output=True, text=True)
    if run.returncode != 0:
        raise CheckpointError(f"NMT_MODEL_DIRS: {run.stderr.strip()[-2000:]}")
    return json.loads(run.stdout)


def load_model(directory: str | Path) -> ServedModel:
    try:
        header = read_header(directory)
    except CheckpointError as e:
        raise CheckpointError(f"{e} (is NMT_MODEL_DIRS right?)") from None
    source, target = header.metadata.get("source_lang"), header.metadata.get("target_lang")
    if not source or not target:
        raise CheckpointError(f"{header.directory / 'metadata.json'}: needs source_lang and target_lang")
    origin = header.metadata.get("imported_from") or {}
    names = {code: name for code, name in ((source, origin.get("from_name")), (target, origin.get("to_name")))
             if isinstance(name, str) and name}
    return ServedModel(f"{source}-{target}", source, target, header.directory, header.config,
                       Tokenizer.from_dir(header.directory, header.config), header.parameters,
                       _fingerprint(header.directory), names,
                       bool(header.metadata.get("term_annotations")), length_penalty_of(header.metadata))


def _fingerprint(directory: Path) -> str:
    """SHA-256 of what decides a model's translations: its weights, and its vocabulary shortlist
    when it has one (model/shortlist.py)."""
    digest = hashlib.sha256()
    for path in (directory / "model.safetensors", directory / SHORTLIST_FILE):
        if path.exists():
            with open(path, "rb") as f:
                while chunk := f.read(2**20):
                    digest.update(chunk)
    return digest.hexdigest()


class Registry:
    def __init__(self, models: list[ServedModel], detector: LanguageDetector | None = None):
        self.models: dict[str, ServedModel] = {}
        for m in models:
            if m.id in self.models:
                raise CheckpointError(f"two checkpoints serve {m.id}: {self.models[m.id].directory} and {m.directory}")
            self.models[m.id] = m
        self.detector = detector  # None: language detection is off (tests of everything else)
        self.served = {m.source for m in models} | {m.target for m in models}  # every language code

    @classmethod
    def load(cls, directories: list[str], detector: LanguageDetector | None = None,
             cache: str = "~/.cache/nmt/models") -> Registry:
        """The models NMT_MODEL_DIRS names: our checkpoints, or Argos packages (folders, .argosmodel
        files, folders of them, `argos` for the installed ones), converted once into `cache`."""
        if not directories:
            raise CheckpointError("no model directories given (NMT_MODEL_DIRS)")
        return cls([load_model(d) for d in as_checkpoints(directories, cache)], detector)

    def code(self, requested: str) -> str:
        """The served code a request's language code means: itself; else, case aside, LibreTranslate's
        name of a regional variant ('pt-BR', 'zh-Hans'); else the language of a regional code
        ('en-GB' -> 'en'); else the language's other variant when only that one is served ('pt' for
        'pb'). Anything else comes back lower-cased, for the caller's "not served" answer."""
        served = self.served
        if requested in served or requested == "auto":
            return requested
        code = _ALIASES.get(requested.lower(), requested.lower())
        language = code.split("-")[0]  # 'en-gb' -> 'en'
        for candidate in (code, language, _OTHER_VARIANT.get(code), _OTHER_VARIANT.get(language)):
            if candidate in served:
                return candidate
        return code

    def name(self, code: str) -> str:
        """A language's name: as a served package gives it, else the usual English name."""
        given = next((m.names[code] for m in self.models.values() if code in m.names), None)
        return given or language_name(code)

    def sources(self) -> list[str]:
        return sorted({m.source for m in self.models.values()})

    def targets(self, source: str) -> list[str]:
        """What `source` translates into: directly, or through a pivot language (`pivot`)."""
        source = self.code(source)
        direct = {m.target for m in self.models.values() if m.source == source}
        through = {m.target for b in direct for m in self.models.values() if m.source == b and m.target != source}
        return sorted(direct | through)

    def pivot(self, source: str, target: str) -> str | None:
        """With no model for source -> target but source -> B and B -> target, the language B
        (English when it can be, as packages are English-centric); None otherwise."""
        source, target = self.code(source), self.code(target)
        if f"{source}-{target}" in self.models or source == target:
            return None
        options = sorted(m.target for m in self.models.values() if m.source == source and f"{m.target}-{target}" in
                         self.models)
        return "en" if "en" in options else (options[0] if options else None)

    def languages(self) -> list[tuple[str, str, list[str]]]:
        """(code, name, targets) of every served language (no targets for a target-only one), with
        the codes LibreTranslate reports (`reported_code`)."""
        codes = sorted(self.served)
        return [(reported_code(c), self.name(c), [reported_code(t) for t in self.targets(c)]) for c in codes]

    def pairs(self) -> str:
        pivots = [f"{s}-{t} (through {self.pivot(s, t)})" for s in self.sources() for t in self.targets(s)
                  if self.pivot(s, t)]
        return ", ".join(sorted(self.models) + pivots)

    def resolve(self, source: str, target: str, text: str = "") -> tuple[ServedModel | None, float | None]:
        """(the model for source -> target, None), or with source 'auto' (the model, the confidence in
        percent of the source language it chose); ValueError says what is served. The model is
        None where the text is already in the target language (`source` is `target`, or 'auto'
        finds the target language likeliest): the text is kept as it is, as Argos's identity
        translation keeps it for LibreTranslate and as DeepL answers.

        'auto' detects the language of `text` (app/language.py) and takes it when a model translates
        from it into target, or a served language nearly as likely; a text that is clearly in
        another language is refused, naming it. A text without letters takes the one source
        language served into target, when there is one.
        """
        source, target = self.code(source), self.code(target)
        if source == target and target in self.served:
            return None, None
        if source != "auto":
            return self.model(source, target), None
        sources = [s for s in self.sources() if f"{s}-{target}" in self.models]
        if not sources:
            raise ValueError(f"no model translates into {target!r}; served pairs: {self.pairs()}")
        if self.detector is None:
            if len(sources) == 1:
                return self.models[f"{sources[0]}-{target}"], 100.0
            raise ValueError(f"source 'auto' needs language detection, which is off; choose one of: "
                             f"{', '.join(sources)}")
        language, confidence, found = self.detector.choose(text, sources)
        if found and found[0][0] == target:  # a German text asked for in German
            return None, found[0][1]
        if language:
            return self.models[f"{language}-{target}"], confidence
        if not found:
            if len(sources) == 1:
                return self.models[f"{sources[0]}-{target}"], 100.0
            raise ValueError(f"source 'auto': no language detected (the text has no letters); choose one of: "
                             f"{', '.join(sources)}")
        best, best_confidence = found[0]
        if best_confidence < CLEAR:
            raise ValueError(f"source 'auto': cannot tell the language of the text (best guess {language_name(best)}, "
                             f"{best_confidence:.1f}%); choose one of: {', '.join(sources)}")
        raise ValueError(f"source 'auto': the text looks {language_name(best)} ({best}, {best_confidence:.1f}%), and "
                         f"no model translates {best!r} to {target!r}; served pairs: {self.pairs()}")

    def model(self, source: str, target: str) -> ServedModel:
        model = self.models.get(f"{self.code(source)}-{self.code(target)}")
        if model is None:
            raise ValueError(f"no model translates {source!r} to {target!r}; served pairs: {self.pairs()}")
        return model
