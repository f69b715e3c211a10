"""Every request and response body of the HTTP API. The OpenAPI schema at /docs is built from
these, so each field carries its description and an example."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from model.config import MAX_BEAM, MAX_LENGTH_PENALTY
from model.options import MAX_REPETITION_PENALTY

Attention = list[list[list[list[float]]]]
ATTENTION_DOC = "Cross-attention as [layer][head][target token][source token]; each row sums to 1."


class DeepLErrorResponse(BaseModel):
    message: str = Field(description="What is wrong and what is allowed (DeepL's error shape, under /v2/).",
                         examples=["Glossary not found: def3a26b-3e84-45b3-84ae-0c0aaf3525f7"])


class ErrorResponse(BaseModel):
    error: str = Field(description="What was wrong and what is allowed.",
                       examples=["beam_size: Input should be less than or equal to 16 (got 32)"])


# --- /v1/translate ----------------------------------------------------------------------------

class TermsFields(BaseModel):
    """Terminology fields of the translate requests (model/terms.py, app/glossaries.py)."""

    glossary: dict[str, str] | str | None = Field(
        None, description="Terms the translation must use: source term -> target term (in a form: that object "
        "as JSON). Matched as whole words, ignoring case; the target term is written as given.",
        examples=[{"file": "Akte"}])
    glossary_id: str | None = Field(None, description="A stored glossary (POST /v2/glossaries) of this key and "
                                    "language pair; its entries join `glossary`'s.", examples=[None])
    do_not_translate: list[str] | str | None = Field(
        None, description="Terms kept exactly as written, such as product names (in a form: a JSON list or one "
        "term).", examples=[["Nextcloud"]])


class TranslateRequest(TermsFields):
    model_config = ConfigDict(extra="forbid")

    text: str | list[str] = Field(description="A text, or a list of texts translated independently (results "
                                  "keep their order). Each text is translated as one sequence, without sentence "
                                  "splitting (its alignments and scores are of that sequence); send one sentence "
                                  "per text.", examples=["Hello world.", ["Open the file.", "Save it."]])
    source: str = Field(description="Source language code, or 'auto': each text's language is detected "
                        "(app/language.py); all texts of a request must then be in one language.", examples=["en"],
                        max_length=32)
    target: str = Field(description="Target language code.", examples=["de"], max_length=32)
    beam_size: int = Field(4, ge=1, le=MAX_BEAM, description="Beam width (1 = greedy).", examples=[4])
    n_best: int = Field(1, ge=1, le=MAX_BEAM, description="Hypotheses per text: the best plus n_best-1 "
                        "alternatives; at most beam_size.", examples=[1])
    length_penalty: float | None = Field(None, ge=0.0, le=MAX_LENGTH_PENALTY, description="Score = log-prob / "
                                         "length^length_penalty; larger favours longer output. Default: the "
                                         "model's own (GET /v1/models), chosen on its dev set.", examples=[None])
    max_length: int | None = Field(None, ge=1, le=1024, description="Most tokens to generate (EOS included), in "
                                   "place of the default 1.5 x source length + 10 (at most 256); never more than "
                                   "the model's positions.", examples=[None])
    repetition_penalty: float = Field(1.0, ge=1.0, le=MAX_REPETITION_PENALTY, description="A token a hypothesis "
                                      "wrote already has its logit divided by this (multiplied when negative), "
                                      "CTRL's repetition penalty; 1 is none.", examples=[1.0])
    alignments: bool = Field(False, description="Store each hypothesis's attention and return an alignment_id "
                             "for GET /v1/alignments/{id}.", examples=[False])
    include_attention: bool = Field(False, description="Return the best hypothesis's attention and tokens inline.",
                                    examples=[False])
    api_key: str | None = Field(None, description="Needed when the server has API keys (the X-API-Key header "
                                "works too).", examples=[None])

    @model_validator(mode="after")
    def _n_best_within_beam(self):
        if self.n_best > self.beam_size:
            raise ValueError(f"n_best ({self.n_best}) must be at most beam_size ({self.beam_size})")
        return self


class TermsReport(BaseModel):
    applied: list[str] = Field(description="Entries (glossary source terms, do-not-translate terms) found in the "
                               "text whose term the translation holds.", examples=[["file"]])
    not_applied: list[str] = Field(description="Entries found in the text that could not be applied (the text "
                                   "has more than 32 protected spans).",
                                   examples=[[]])
    not_found: list[str] = Field(description="Entries not in the text (whole words, ignoring case).",
                                 examples=[["Nextcloud"]])


class SpanRepair(BaseModel):
    inserted: list[str] = Field(description="Protected spans (placeholders, tags, URLs, e-mail addresses, Weblate "
                                "masks) the model left out, put back before the target token whose attention "
                                "weighed them most.", examples=[["%(name)s"]])
    removed: list[str] = Field(description="Spans the model wrote more than once: the extra copies, removed "
                               "(the one its attention points to most is kept).", examples=[[]])
    removed_unknown: int = Field(0, description="Sentinels the model wrote that stand for no span of the source: "
                                 "removed.", examples=[0])


SPAN_REPAIR_DOC = ("Present when the model's output did not hold each protected span of the source exactly once "
                   "and was repaired (every span is in the returned text, exactly as written).")


class Alternative(BaseModel):
    text: str = Field(description="Another hypothesis, in n-best order.", examples=["Hallo, Welt."])
    score: float = Field(description="Its length-normalised log-probability.", examples=[-0.71])
    alignment_id: str | None = Field(None, description="Present when alignments were requested.",
                                     examples=["6f1c0c3d9a7e4b0f8e2d5a1b3c4d5e6f"])
    span_repair: SpanRepair | None = Field(None, description=SPAN_REPAIR_DOC)


class TranslationOut(BaseModel):
    text: str = Field(description="The best translation.", examples=["Hallo Welt."])
    score: float = Field(description="Length-normalised log-probability: log_prob / length^length_penalty.",
                         examples=[-0.42])
    alternatives: list[Alternative] = Field(description="The other n_best-1 hypotheses, best first.",
                                            examples=[[]])
    alignment_id: str | None = Field(None, description="Present when alignments were requested.",
                                     examples=["0b7c3e5f2a9d4c1e8f6a2b4d6c8e0f1a"])
    span_repair: SpanRepair | None = Field(None, description=SPAN_REPAIR_DOC)
    leg_alignment_ids: list[str | None] | None = Field(
        None, description="Through a pivot, with alignments: the alignment ids of the first leg (source -> pivot) "
        "and the second (pivot -> target), each model's own attention; alignment_id is then their composition, "
        "source -> target (one layer, one head: the product of the legs' mean attention, joined word by word "
        "over the pivot text), or null where the two models split the pivot text into different words.",
        examples=[["6f1c0c3d9a7e4b0f8e2d5a1b3c4d5e6f", "0b7c3e5f2a9d4c1e8f6a2b4d6c8e0f1a"]])
    source_tokens: list[str] | None = Field(None, description="Source pieces (columns of attention), with "
                                            "'</s>'; present with include_attention.",
                                            examples=[["▁Hello", "▁world", ".", "</s>"]])
    target_tokens: list[str] | None = Field(None, description="Target pieces (rows of attention), with '</s>' "
                                            "when the hypothesis ended; present with include_attention. They "
                                            "are the pieces the model wrote: a span_repair changes the text, "
                                            "not these rows.",
                                            examples=[["▁Hallo", "▁Welt", ".", "</s>"]])
    attention: Attention | None = Field(None, description=ATTENTION_DOC + " Present with include_attention.",
                                        examples=[[[[[0.9, 0.1], [0.2, 0.8]]]]])
    terms: TermsReport | None = Field(None, description="With glossary, glossary_id or do_not_translate: what "
                                      "became of each entry.")


class Timing(BaseModel):
    queue_ms: float = Field(description="From arrival until the first batch with this request's texts started.",
                            examples=[3.1])
    compute_ms: float = Field(description="From then until the last of its texts was translated.",
                              examples=[41.7])
    total_ms: float = Field(description="Whole request, validation and serialisation included.", examples=[46.0])


class TranslateResponse(BaseModel):
    model: str = Field(description="Model id: '<source>-<target>'.", examples=["en-de"])
    pivot: str | None = Field(None, description="Present when no model translates source into target directly: "
                              "the language translated through (source -> pivot -> target).", examples=["en"])
    translations: list[TranslationOut] = Field(description="One per input text, in input order.")
    timing: Timing = Field(description="Where the time went.")


# --- /v1/alignments ---------------------------------------------------------------------------

class AlignmentResponse(BaseModel):
    id: str = Field(description="The alignment id.", examples=["0b7c3e5f2a9d4c1e8f6a2b4d6c8e0f1a"])
    model: str = Field(description="Model id that produced it.", examples=["en-de"])
    source_tokens: list[str] = Field(description="Columns of attention (pieces, or words with "
                                     "granularity=word), '</s>' included.", examples=[["▁Hello", "▁world", "</s>"]])
    target_tokens: list[str] = Field(description="Rows of attention, '</s>' included when the hypothesis ended "
                                     "with it: what the model wrote, before any span_repair of the text.",
                                     examples=[["▁Hallo", "▁Welt", "</s>"]])
    layers: int = Field(description="Decoder layers of the model.", examples=[6])
    heads: int = Field(description="Attention heads per layer.", examples=[8])
    granularity: Literal["subword", "word"] = Field(description="Token unit of the axes.", examples=["subword"])
    layer: int | Literal["mean"] | None = Field(description="Layer selection; null: all layers.", examples=["mean"])
    head: int | Literal["mean"] | None = Field(description="Head selection; null: all heads.", examples=[None])
    attention: Attention = Field(description=ATTENTION_DOC + " A selected axis has size 1.",
                                 examples=[[[[[0.9, 0.1], [0.2, 0.8]]]]])
    hard_alignment: str | None = Field(None, description="Pharaoh pairs 'source-target' (with hard=true): each "
                                       "target token's most attended source token, '</s>' excluded.",
                                       examples=["0-0 1-1"])


# --- /v1/models, /v1/languages ----------------------------------------------------------------

class ModelConfigSummary(BaseModel):
    d_model: int = Field(description="Model width.", examples=[512])
    n_heads: int = Field(description="Attention heads.", examples=[8])
    d_ff: int = Field(description="Feed-forward width.", examples=[2048])
    encoder_layers: int = Field(description="Encoder layers.", examples=[6])
    decoder_layers: int = Field(description="Decoder layers.", examples=[6])
    src_vocab_size: int = Field(description="Source vocabulary size.", examples=[32000])
    tgt_vocab_size: int = Field(description="Target vocabulary size.", examples=[32000])
    max_positions: int = Field(description="Longest source (and target) in tokens.", examples=[1024])
    norm: str = Field(description="'post' or 'pre' layer norm.", examples=["post"])
    activation: str = Field(description="Feed-forward activation.", examples=["relu"])
    share_embeddings: bool = Field(description="One embedding matrix for source and target.", examples=[True])


class ModelInfo(BaseModel):
    id: str = Field(description="Model id.", examples=["en-de"])
    source: str = Field(description="Source language code.", examples=["en"])
    target: str = Field(description="Target language code.", examples=["de"])
    config: ModelConfigSummary = Field(description="Architecture summary.")
    parameters: int = Field(description="Unique parameters (tied matrices counted once).", examples=[60_000_000])
    device: str = Field(description="Where its workers run it.", examples=["cpu"])
    dtype: str = Field(description="Weights dtype its workers run (NMT_DTYPE=auto resolved).", examples=["bfloat16"])
    cpu_kernels: bool = Field(description="Whether its CPU workers run the compiled C++ kernels for attention and "
                                          "candidate selection (false: PyTorch ops only, slower; always false on GPU).",
                              examples=[True])
    fused: bool = Field(description="Whether its CPU workers run the int8 model's encoder and decoder step as one "
                                    "compiled call each (model/kernels/fused.cpp; only with dtype int8).", examples=[True])
    int8_path: str | None = Field(description="With dtype int8, which integer product path runs: avx512_vnni, avx2 "
                                              "or scalar (model/kernels/int8.cpp); null otherwise.",
                                  examples=["avx512_vnni"])
    max_source_tokens: int = Field(description="Longest accepted text in source tokens (EOS included).",
                                   examples=[1024])
    length_penalty: float = Field(description="The length penalty it decodes with when a request gives none "
                                  "(chosen on its dev set; 1.0 for a model that has none).", examples=[1.4])
    loaded_on: list[int] = Field(description="The workers that hold it loaded now (NMT_MAX_LOADED_MODELS: the others "
                                 "load it on first use).", examples=[[0, 1]])


class ModelsResponse(BaseModel):
    models: list[ModelInfo] = Field(description="Every served model.")


class Language(BaseModel):
    code: str = Field(description="Language code.", examples=["en"])
    name: str = Field(description="English name.", examples=["English"])
    targets: list[str] = Field(description="Codes it can be translated into.", examples=[["de"]])


class LanguagePair(BaseModel):
    source: str = Field(description="Source language code.", examples=["en"])
    target: str = Field(description="Target language code.", examples=["de"])
    model: str = Field(description="Model id serving the pair.", examples=["en-de"])


class LanguagesResponse(BaseModel):
    languages: list[Language] = Field(description="Source languages and their targets.")
    pairs: list[LanguagePair] = Field(description="Served pairs.")


# --- LibreTranslate compatibility -------------------------------------------------------------

class LTTranslateRequest(TermsFields):
    model_config = ConfigDict(extra="ignore")  # LibreTranslate ignores fields it does not know

    q: str | list[str] = Field(description="Text, or list of texts.", examples=["Hello world."])
    source: str = Field(description="Source language code, or 'auto': each text's language is detected and "
                        "it is translated from it; a text in a language no model translates is a 400 naming it.",
                        examples=["en"], max_length=32)
    target: str = Field(description="Target language code.", examples=["de"], max_length=32)
    format: Literal["text", "html"] = Field("text", description="'text': plain text, translated sentence by "
                                            "sentence; whitespace and text without letters are kept. 'html': the "
                                            "text between tags, sentence by sentence; tags with their attributes, "
                                            "comments and whitespace come back as sent, and so does text without "
                                            "letters or inside code, pre, script, style, textarea or an element "
                                            "with translate=\"no\" or class \"notranslate\".",
                                            examples=["html"])
    alternatives: int = Field(0, ge=0, le=MAX_BEAM - 1, description="Alternative translations to return "
                              "besides the best; alternative k of a text takes the k-th alternative of each "
                              "of its sentences.", examples=[0])
    api_key: str | None = Field(None, description="API key, when the server requires one.", examples=[None])


class LTTranslateFileResponse(BaseModel):
    translatedFileUrl: str = Field(description="Where to download the translated file (GET; it expires after "
                                   "NMT_FILE_TTL_S).",
                                   examples=["http://localhost:8000/download_file/5f0c9e1a2b3c4d5e6f708192a3b4c5d6."
                                             "guide_de.docx"])


class LTSuggestRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    q: str = Field(description="The original text.", examples=["Hello world."])
    s: str = Field(description="The translation suggested for it.", examples=["Hallo Welt."])
    source: str = Field(description="Language code of q.", examples=["en"], max_length=32)
    target: str = Field(description="Language code of s.", examples=["de"], max_length=32)
    api_key: str | None = Field(None, description="API key, when the server requires one.", examples=[None])


class LTSuggestResponse(BaseModel):
    success: bool = Field(description="The suggestion was stored.", examples=[True])


class LTLanguageRef(BaseModel):
    code: str = Field(description="Language code ('auto' for detection).", examples=["auto"])
    name: str = Field(description="English name.", examples=["Auto Detect"])


class LTFrontendLanguages(BaseModel):
    source: LTLanguageRef = Field(description="The source a front end starts with.")
    target: LTLanguageRef = Field(description="The target a front end starts with.")


class LTFrontendSettings(BaseModel):
    charLimit: int = Field(description="Characters per text for a client without a key of its own "
                           "(NMT_CHAR_LIMIT, else NMT_MAX_CHARS).", examples=[5000])
    frontendTimeout: int = Field(description="Milliseconds a front end waits after typing before it translates.",
                                 examples=[500])
    apiKeys: bool = Field(description="The server knows API keys (NMT_API_KEYS or NMT_KEYS_DB).", examples=[False])
    keyRequired: bool = Field(description="Every call needs a key.", examples=[False])
    suggestions: bool = Field(description="POST /suggest is on.", examples=[False])
    filesTranslation: bool = Field(description="POST /translate_file is on.", examples=[True])
    supportedFilesFormat: list[str] = Field(description="File extensions /translate_file takes.",
                                            examples=[[".txt", ".po", ".docx"]])
    language: LTFrontendLanguages = Field(description="Default languages of a front end.")


class LTDetectRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    q: str | list[str] = Field(description="Text, or list of texts (each detected on its own).",
                               examples=["Öffnen Sie die Datei."])
    api_key: str | None = Field(None, description="API key, when the server requires one.", examples=[None])


class DetectedLanguage(BaseModel):
    confidence: float = Field(description="0-100: the detector's (lingua's) confidence in this language relative to "
                              "the others it knows; the candidates of a text sum to at most 100. 100 for source "
                              "'auto' on a text without letters when one source language is served.",
                              examples=[97.3])
    language: str = Field(description="Language code.", examples=["en"])


class LTTranslateResponse(BaseModel):
    translatedText: str | list[str] = Field(description="Translation (a list when q was a list).",
                                            examples=["Hallo Welt."])
    alternatives: list[str] | list[list[str]] | None = Field(None, description="With alternatives > 0: the "
                                                             "other hypotheses (per text when q was a list).",
                                                             examples=[["Hallo, Welt."]])
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = Field(
        None, description="With source 'auto': the language each text was translated from (a list when q was "
        "a list).",
        examples=[{"confidence": 97.3, "language": "en"}])
    terms: TermsReport | list[TermsReport] | None = Field(
        None, description="With glossary, glossary_id or do_not_translate: what became of each entry (a list "
        "when q was a list).")


# --- health -----------------------------------------------------------------------------------

class Health(BaseModel):
    status: Literal["ok"] = Field(description="The process is up.", examples=["ok"])


class WorkerStatus(BaseModel):
    index: int = Field(description="Worker number.", examples=[0])
    device: str = Field(description="Its device.", examples=["cpu"])
    state: str = Field(description="starting | idle | busy | restarting | failed | stopped.", examples=["idle"])
    restarts: int = Field(description="Times it was replaced after dying or hanging.", examples=[0])
    batches: int = Field(description="Batches it ran (with running batches: jobs it was sent).", examples=[120])
    busy_seconds: float = Field(description="Seconds spent on batches.", examples=[3.5])
    cancelled: int = Field(0, description="With running batches: sentences it dropped unfinished, their requests "
                           "gone.", examples=[0])
    reason: str | None = Field(None, description="Why it is not serving, if so.", examples=[None])


class Ready(BaseModel):
    ready: bool = Field(description="Models loaded and every worker alive.", examples=[True])
    reason: str | None = Field(None, description="Why not, when not ready.", examples=[None])
    models: list[str] = Field(description="Served model ids.", examples=[["en-de"]])
    workers: list[WorkerStatus] = Field(description="Each worker's state.")
    storage: str = Field("ok", description="'ok', or why the shared store (Redis, NMT_REDIS_URL) cannot be used: "
                         "translation goes on, while alignments, files, shared limits and the cache wait for it.",
                         examples=["ok"])
