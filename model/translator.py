"""The public API: load a checkpoint directory once, translate lists of sentences.

    translator = Translator.load("checkpoints/en-de")          # device and dtype "auto"
    [result] = translator.translate(["Hello world."], beam_size=4, attention=True)
    result.hypotheses[0].text, result.hypotheses[0].attention.shape  # (L, H, T, S)

`Translator(model, tokenizer)` wraps a model already in memory (training's dev decoding does).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from model import accelerators, casing, kernels, protect
from model.checkpoint import load_checkpoint
from model.clean import clean_text, lone_surrogate
from model.config import length_penalty_of
from model.cpu.fused import FusedInt8Decoder, can_fuse, fuse
from model.cpu.weights import Int8Linear, can_prepack_bf16, prepack_linear_bf16, quantize_linear_int8
from model.graphs import GraphedBeamSearch
from model.options import DecodingOptions
from model.results import Translation, TranslationResult, restore, terms_first
from model.search import IncrementalDecoder, SelectFn, beam_search, select
from model.shortlist import Shortlist
from model.terms import Terminology, report, retry_beam_size, strip_tags
from model.tokenizer import Tokenizer
from model.transformer import Transformer, attention, inference_attention_backends


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def auto_dtype(device: str | torch.device) -> str:
    """What dtype "auto" means on this device, the fastest that keeps quality:
    - CUDA: bfloat16 on GPUs from Ampere on, else float32;
    - CPUs with AMX: bfloat16 (oneDNN's AMX matrix kernels);
    - other CPUs where our int8 kernels run a vector path (AVX-512 VNNI or AVX2,
      model/kernels/int8.cpp): int8 Linear layers and the fused decoder step (on AVX-512 VNNI
      1.5-2x bf16 products, and at a few decoder rows several times any PyTorch step);
    - CPUs with AVX-512 BF16 but no built kernels: bfloat16; else float32.
    The shipped model's dev-set BLEU moves by less than 0.2 either way (its model card);
    search scores stay float32."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float32"
    if kind != "cpu":
        return "float32"
    if torch.cpu._is_amx_tile_supported():
        return "bfloat16"
    if kernels.int8_path() in ("avx512_vnni", "avx2"):
        return "int8"
    return "bfloat16" if torch.cpu._is_avx512_bf16_supported() else "float32"


@dataclass
class Plan:
    """One source on its way through `Translator.translate`: what the model reads, and what
    `finish` needs to turn the hypotheses into its result (`prepare` makes it)."""

    source: str | list[int]  # as given
    ids: list[int]  # what the model reads
    masked: protect.Masked | None = None  # a text's protected spans and terms (None: ids were given)
    stripped: protect.Stripped | None = None  # spans taken out, for a model without sentinel pieces
    mark: accelerators.Marked | None = None  # the accelerator mark taken out
    shouting: bool = False  # written in capitals: read in sentence case, written back in capitals
    terms: Terminology | None = None  # its glossary and do-not-translate terms
    annotated: bool = False  # its glossary terms inline (a model trained to read annotations)


class Translator:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, metadata: dict | None = None,
                 decoder: IncrementalDecoder | None = None, select_fn: SelectFn = select,
                 max_length_a: float = 1.5, max_length_b: int = 10, max_length_cap: int = 256):
        """A model in memory, used on its device and in its dtype as it is. decoder: what beam
        search runs (default: the model itself; the fused int8 engine, say), and select_fn its step
        after the decoder (search.select or kernels.select). Without a max_length, a
        translation gets at most max_length_a * source length + max_length_b new tokens, never
        more than max_length_cap."""
        self.model, self.tokenizer, self.metadata = model, tokenizer, metadata or {}
        self.decoder, self.select_fn = decoder or model, select_fn
        self.config = model.config
        weight = model.tgt_embed.weight
        self.device = weight.device
        int8 = isinstance(model.output_proj, Int8Linear)
        self.dtype = "int8" if int8 else str(weight.dtype).removeprefix("torch.")
        # whether the C++ kernels run (built or loaded now rather than in the first request)
        self.cpu_kernels = self.device.type == "cpu" and kernels.available()
        # the int8 product path ("avx512_vnni", "avx2", "scalar"), or None: not int8, or no kernels
        self.int8_path = kernels.int8_path() if int8 else None
        self.max_length_a, self.max_length_b = max_length_a, max_length_b
        self.max_length_cap = min(max_length_cap, self.config.max_positions)
        # a model trained with inline term annotations (training/annotate.py) reads glossary terms that way
        self.reads_annotations = tokenizer.has_term_tags and bool(self.metadata.get("term_annotations"))
        # the target pieces each batch may write (model/shortlist.py): on the CPU, from the model's directory
        self.shortlist: Shortlist | None = None
        # on a GPU: beam search with each step a replayed CUDA graph (model/graphs.py), else None
        self.graphed_search: GraphedBeamSearch | None = None
        # what translate() uses when no length penalty is given: the model's own (chosen on its dev set)
        self.length_penalty = length_penalty_of(self.metadata)

    @classmethod
    def load(cls, directory: str | Path, device: str | None = None, dtype: str = "auto", prepack: bool = True,
             shortlist: bool = True, cuda_graphs: bool = True, **limits) -> Translator:
        """A checkpoint directory, on `device` (None: CUDA when there is one) in `dtype` ("auto":
        see auto_dtype). prepack: on a CPU with native bf16, a bfloat16 model's Linear weights are
        reordered once into oneDNN's layout (model/cpu/weights.py); False keeps plain Linear layers.
        shortlist: on the CPU, decode over the directory's vocabulary shortlist when it has one
        (model/shortlist.py). cuda_graphs: on a GPU, each decoder step replays a CUDA graph
        (model/graphs.py); False runs the Transformer's own step, kernel by kernel."""
        device = torch.device(device or default_device())
        dtype = auto_dtype(device) if dtype == "auto" else dtype
        if dtype == "int8" and device.type != "cpu":
            raise ValueError("dtype int8 (int8 Linear layers) runs on the CPU only")
        # the engine is chosen here, once: on a CPU with the kernels built, the C++ attention of a
        # decoder step and search step; else the PyTorch references
        cpu_kernels = device.type == "cpu" and kernels.available()
        attention_fn = kernels.decoder_attention if cpu_kernels else attention
        model, tokenizer, metadata = load_checkpoint(Path(directory), device, "float32" if dtype == "int8" else dtype,
                                                     attention_fn)
        decoder = model
        if dtype == "int8":
            model = quantize_linear_int8(model)
            if can_fuse(model):  # the encoder and the decoder step in one C++ call each
                decoder = fuse(model)
        elif prepack and can_prepack_bf16(model):
            prepack_linear_bf16(model)
        translator = cls(model, tokenizer, metadata, decoder, kernels.select if cpu_kernels else select, **limits)
        if device.type == "cuda" and cuda_graphs:
            translator.graphed_search = GraphedBeamSearch(model)
        if shortlist and device.type == "cpu":
            translator.shortlist = Shortlist.load(Path(directory), copy_source=model.config.share_embeddings)
        return translator

    def release_memory(self) -> None:
        """Give back what the search keeps between calls (the GPU search's buffers and graphs)."""
        if self.graphed_search is not None:
            self.graphed_search.release()

    @property
    def fused(self) -> bool:
        """Whether an int8 model's encoder and decoder step run as one C++ call each."""
        return isinstance(self.decoder, FusedInt8Decoder)

    @property
    def max_source_tokens(self) -> int:
        return self.config.max_positions

    def encode(self, text: str) -> list[int]:
        """Source ids of a text, its protected spans masked when the vocabulary has sentinels."""
        return self.tokenizer.encode_source(self.mask(text).text)

    def mask(self, text: str, terms: Terminology | None = None, annotate: bool = False) -> protect.Masked:
        """The text as the model reads it: control characters removed (model/clean.py) and, with
        sentinels in the vocabulary, protected spans masked (and `terms`' glossary and
        do-not-translate terms: model/terms.py; with `annotate`, glossary terms inline). ValueError
        for a lone surrogate."""
        at = lone_surrogate(text)
        if at is not None:
            raise ValueError(f"a lone surrogate (U+{ord(text[at]):04X}) at character {at} is not valid Unicode")
        text = clean_text(text)
        tok = self.tokenizer
        if not tok.has_sentinels:
            return protect.Masked(text)
        return protect.mask(text, foreign=tok.cannot_spell, terms=terms, annotate_glossary=annotate)

    def length_cap(self, source_len: int, max_length: int | None) -> int:
        """New target tokens allowed (EOS included): max_length when given (within the
        model's positions), else a * source length + b within the hard cap."""
        if max_length:
            return max(1, min(max_length, self.config.max_positions))
        return max(1, min(self.max_length_cap, math.ceil(self.max_length_a * source_len + self.max_length_b)))

    def translate(self, sources: list[str] | list[list[int]], options: DecodingOptions | None = None, *,
                  batch_tokens: int = 4096, parallel: int = 1, terms: Terminology | list[Terminology | None] | None = None,
                  term_method: str = "auto", **option_fields) -> list[TranslationResult]:
        """Translate strings (or EOS-terminated source id lists) as `options` say (model/options.py:
        beam_size, n_best, length_penalty, max_length, min_length, attention), or as the keyword
        arguments of those names say (`translate(texts, beam_size=1)`). A length penalty of None is
        the model's own (`self.length_penalty`); without max_length a translation gets at most
        max_length_a * source length + max_length_b new tokens.

        Sentences are sorted by length and packed into batches of at most batch_tokens source
        tokens (counting padding, and beams); results come back in input order. parallel > 1
        decodes that many batches at once, each on its own thread (torch releases the GIL inside
        its ops; the largest batches are halved until there are enough): with
        torch.set_num_threads(1), one core per batch, which on a small model gains more than
        intra-op threads, whose work per op is too small to split. `terms`: glossary entries the
        translations must use and terms they keep as written (model/terms.py), or a list of
        them, one per source (sources with different glossaries still share batches); each
        result's `terms` says which were applied. term_method, for glossary entries: "spans" (sentinels,
        the target term written as given), "annotate" (inline, for a model trained to read
        annotations: it writes and inflects the term itself), "auto" (annotate when the model
        reads annotations, and translate with "spans" again the texts where a term is missing).
        """
        options = replace(options or DecodingOptions(), **option_fields)  # validated there
        if options.length_penalty is None:
            options = replace(options, length_penalty=self.length_penalty)
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {parallel}")
        plans = self.prepare(sources, terms, term_method)
        batches = self.batches([p.ids for p in plans], batch_tokens // options.beam_size)
        while len(batches) < min(parallel, len(plans)):
            largest = max(batches, key=len)
            batches.remove(largest)
            batches += [largest[: len(largest) // 2], largest[len(largest) // 2:]]

        # with annotated terms, every finished beam comes back: the best one that writes the terms
        # is chosen before a text is translated again (the beams cost the same; only n_best are read)
        choose_terms = any(p.annotated for p in plans) and term_method == "auto"
        decode = replace(options, n_best=options.beam_size) if choose_terms else options

        def run(batch: list[int]):
            attention = options.attention or any(self.needs_attention(plans[i]) for i in batch)
            return self.translate_ids([plans[i].ids for i in batch], replace(decode, attention=attention))

        if parallel > 1:
            with ThreadPoolExecutor(parallel) as pool:
                outputs = list(pool.map(run, batches))
        else:
            outputs = map(run, batches)
        results: list[TranslationResult | None] = [None] * len(plans)
        for batch, hyps in zip(batches, outputs):
            for i, h in zip(batch, hyps):
                results[i] = self.finish(plans[i], h, options, choose_terms)
        if choose_terms:
            # an annotated term no beam wrote: that text again, its terms as sentinels
            again = [i for i, p in enumerate(plans) if p.masked and lacks_terms(p.masked, results[i].hypotheses[0].text)]
            if again:
                wider = replace(options, beam_size=retry_beam_size(options.beam_size, options.n_best))
                redone = self.translate([sources[i] for i in again], wider, batch_tokens=batch_tokens, parallel=parallel,
                                        terms=[plans[i].terms for i in again], term_method="spans")
                for i, again_result in zip(again, redone):
                    results[i] = again_result
        return results  # type: ignore[return-value]

    def prepare(self, sources: list[str] | list[list[int]], terms: Terminology | list[Terminology | None] | None = None,
                term_method: str = "auto") -> list[Plan]:
        """The first half of translating: each source as the model reads it, and what `finish`
        needs to make its result. A text: control characters removed, protected spans masked (or
        taken out, for a model without sentinel pieces), glossary terms as spans or inline; then,
        for a text or ids, without its accelerator mark (model/accelerators.py) and in sentence
        case when written in capitals (model/casing.py)."""
        if term_method not in ("auto", "annotate", "spans"):
            raise ValueError(f"term_method must be auto, annotate or spans, got {term_method!r}")
        each_terms = terms if isinstance(terms, list) else [terms] * len(sources)
        if len(each_terms) != len(sources):
            raise ValueError(f"{len(each_terms)} terminologies for {len(sources)} sources")
        plans = []
        for i, (source, own) in enumerate(zip(sources, each_terms)):
            annotated = bool(own and own.glossary) and self.reads_annotations and term_method != "spans"
            masked = self.mask(source, own, annotated) if isinstance(source, str) else None
            stripped = None
            if masked and not self.tokenizer.has_sentinels:
                # a model without sentinel pieces reads text without its spans; they go back by the
                # attention (not foreign words: spelt as they are)
                found = protect.take_out(masked.text, terms=own)
                if found.spans:
                    stripped, masked = found, protect.Masked(found.text)
            ids = self.tokenizer.encode_source(masked.text) if masked else list(source)
            if not 1 <= len(ids) <= self.max_source_tokens:
                raise ValueError(f"source {i} has {len(ids)} tokens; allowed: 1 to {self.max_source_tokens}")
            plans.append(Plan(source, ids, masked, stripped, terms=own, annotated=annotated))
        for plan in plans:
            text = plan.masked.text if plan.masked else self.tokenizer.decode_source(plan.ids)
            plan.mark = accelerators.find(text) if plan.stripped is None else None
            read = plan.mark.text if plan.mark else text
            plan.shouting = casing.is_shouting(read)
            if plan.shouting:
                read = casing.sentence_case(read, self.metadata.get("source_lang"),
                                            pieces=lambda word: len(self.tokenizer.source_sp.encode(word)))
            if read != text:
                read_ids = self.tokenizer.encode_source(read)
                if len(read_ids) <= self.max_source_tokens:
                    plan.ids = read_ids
                else:
                    plan.mark, plan.shouting = None, False
        return plans

    def needs_attention(self, plan: Plan) -> bool:
        """Whether the attention must be computed for this text: a repair places a missing span,
        and an accelerator mark or a taken-out span is placed, by the attention."""
        return self.has_sentinel(plan.ids) or bool(plan.mark) or bool(plan.stripped)

    def finish(self, plan: Plan, hyps, options: DecodingOptions, choose_terms: bool = False) -> TranslationResult:
        """The second half: a text's hypotheses (best first) as its result, options.n_best of them;
        with `choose_terms`, the beams that write the annotated terms first; and which of the
        text's terms were applied."""
        how = (options.attention, plan.masked, plan.shouting, plan.mark, plan.stripped)
        result = self.to_result(plan.ids, hyps[: options.n_best], *how)
        # the other beams, where the best lacks a term or alternatives are asked for
        if choose_terms and (options.n_best > 1 or lacks_terms(plan.masked, result.hypotheses[0].text)):
            result = self.to_result(plan.ids, hyps, *how)
            result.hypotheses = terms_first(result.hypotheses, partial(lacks_terms, plan.masked))[: options.n_best]
        if plan.terms and plan.masked is not None:  # the repair (or the placement) puts every sentinel term in
            found = {m.entry for m in plan.terms.find(clean_text(plan.source))}
            used = (set(plan.stripped.terms.values()) if plan.stripped
                    else plan.masked.terms_used(result.hypotheses[0].text))
            result.terms = report(plan.terms, found, used)
        return result

    @staticmethod
    def batches(ids: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Indices grouped into length-sorted batches of at most max_tokens padded tokens."""
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        batches, current = [], []
        for i in order:
            if current and (len(current) + 1) * len(ids[i]) > max_tokens:
                batches.append(current)
                current = []
            current.append(i)
        return batches + ([current] if current else [])

    def translate_ids(self, ids: list[list[int]], options: DecodingOptions):
        """Hypotheses of EOS-terminated source ids, one batch: the options turned into the search's
        arguments (its names are Hugging Face `generate`'s: max_new_tokens, min_new_tokens, ...)."""
        S = max(len(x) for x in ids)
        src = torch.full((len(ids), S), self.config.pad_id, dtype=torch.long)
        for row, x in enumerate(ids):
            src[row, : len(x)] = torch.tensor(x)
        caps = torch.tensor([self.length_cap(len(x), options.max_length) for x in ids]).to(self.device)
        o = options if options.length_penalty is not None else replace(options, length_penalty=self.length_penalty)
        with inference_attention_backends(self.device):
            if self.graphed_search is not None:
                return self.graphed_search(src.to(self.device), o.beam_size, o.n_best, o.length_penalty, caps,
                                           o.attention, o.min_length)
            decoder = self.decoder
            if self.shortlist is not None:
                decoder = decoder.shortlisted(self.shortlist.columns(ids, always=[self.config.eos_id]).to(self.device))
            return beam_search(decoder, src.to(self.device), o.beam_size, o.n_best, o.length_penalty, caps, o.attention,
                               o.min_length, self.select_fn)

    def has_sentinel(self, ids: list[int]) -> bool:
        return self.tokenizer.has_sentinels and any(i in self.tokenizer.sentinel_ids for i in ids)

    def to_result(self, source_ids: list[int], hyps, with_attention: bool,
                  masked: protect.Masked | None = None, shouting: bool = False,
                  marked: accelerators.Marked | None = None,
                  stripped: protect.Stripped | None = None) -> TranslationResult:
        """Hypotheses as text; each holds the source's sentinels once (protect.repair), gets the
        source's accelerator mark back (`marked`), is written in capitals when the source was
        (`shouting`; its spans keep their case), and with `masked` (the source was text) has its
        spans put back; `stripped` (a model without sentinels): the spans taken out of the source
        go back where the attention points (protect.place)."""
        tok = self.tokenizer
        source_pieces = tok.source_pieces(source_ids)
        result = TranslationResult(source_tokens=source_pieces)
        for h in hyps:
            pieces = tok.target_pieces(h.token_ids)
            # a term tag the model wrote is no text
            t = Translation(strip_tags(tok.decode_target(h.token_ids)), pieces, h.token_ids, h.score, h.log_prob,
                            h.ended_with_eos)
            repairable = tok.has_sentinels and (self.has_sentinel(source_ids) or self.has_sentinel(h.token_ids))
            attention = None if h.attention is None or not (repairable or marked) else h.attention.float().cpu().numpy()
            text_pieces, text_attention = pieces, attention  # the pieces of t.text, and their attention rows
            if repairable:
                fixed = protect.repair(source_pieces, pieces, attention)
                if fixed.changed:
                    t.text, t.spans_inserted, t.spans_removed = tok.decode_pieces(fixed.pieces), fixed.inserted, fixed.removed
                    text_pieces = fixed.pieces
                    text_attention = None if attention is None else fixed.attention_of_pieces(attention)
            if marked:
                t.text = accelerators.place(t.text, text_pieces, text_attention, source_pieces, marked)
            if shouting:
                t.text = casing.shout(t.text)  # sentinels have no case: the spans come back as written
            if stripped is not None:
                weights = h.attention.float().mean(dim=(0, 1)).cpu().numpy()  # (target rows, source pieces)
                decode = (lambda p: casing.shout(tok.decode_pieces(p))) if shouting else tok.decode_pieces
                t.text = protect.place(stripped, protect.piece_starts(source_pieces), pieces, weights, decode)
            if with_attention:
                # the rows are the model's steps: the pieces it wrote, before any repair of the text
                t.attention = h.attention.float().cpu()
                t.target_tokens = pieces + (["</s>"] if h.ended_with_eos else [])
            result.hypotheses.append(t)
        return restore(result, masked.spans, masked.text) if masked and masked.spans else result


def lacks_terms(masked: protect.Masked | None, text: str) -> bool:
    """Whether a translation lacks a target term annotated in its source."""
    return masked is not None and not {a.entry for a in masked.annotations} <= masked.terms_used(text)

