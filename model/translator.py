"""The public API: load a checkpoint directory once, translate lists of sentences.

    translator = Translator.load("checkpoints/en-de")          # device and dtype "auto"
    [result] = translator.translate(["Hello world."], beam_size=4, attention=True)
    result.hypotheses[0].text, result.hypotheses[0].attention.shape  # (L, H, T, S)

`Translator(model, tokenizer)` wraps a model already in memory (training's dev decoding does).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

from model import kernels, pipeline
from model.checkpoint import load_checkpoint
from model.config import length_penalty_of
from model.cpu.fused import FusedInt8Decoder, can_fuse, fuse
from model.cpu.weights import Int8Linear, can_prepack_bf16, prepack_linear_bf16, quantize_linear_int8
from model.graphs import GraphedBeamSearch
from model.options import MAX_LENGTH_A, MAX_LENGTH_B, MAX_LENGTH_CAP, DecodingOptions, length_cap
from model.pipeline import Decoded
from model.results import TranslationResult
from model.search import Hypothesis, IncrementalDecoder, SelectFn, padded, select
from model.shortlist import Shortlist
from model.strategies import make_search
from model.terms import Terminology
from model.tokenizer import Tokenizer
from model.transformer import Transformer, attention, inference_attention_backends


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def auto_dtype(device: str | torch.device) -> str:
    """What dtype "auto" means on this device, the fastest that keeps quality:
    - CUDA: bfloat16 on GPUs from Ampere on, else float32;
    - CPUs where our int8 kernels run a vector path (AVX-512 VNNI or AVX2,
      model/kernels/int8.cpp), AMX CPUs included: int8 Linear layers and the fused decoder step.
      At the batches a service forms it is the fastest everywhere: on an AMX Xeon, beam 4, one
      sentence 3.7-5.3x bfloat16 and batches of 32 0.85-1.03x (`bench/engine.py`, BENCHMARKS.md);
      and a sentence translates the same whatever it is batched with;
    - CPUs with AMX or AVX-512 BF16 but no built kernels: bfloat16; else float32.
    The shipped model's dev-set BLEU moves by less than 0.2 either way (its model card);
    search scores stay float32."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float32"
    if kind != "cpu":
        return "float32"
    if kernels.int8_path() in ("avx512_vnni", "avx2"):
        return "int8"
    native_bf16 = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    return "bfloat16" if native_bf16 else "float32"


class Translator:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, metadata: dict | None = None,
                 decoder: IncrementalDecoder | None = None, select_fn: SelectFn = select,
                 max_length_a: float = MAX_LENGTH_A, max_length_b: int = MAX_LENGTH_B,
                 max_length_cap: int = MAX_LENGTH_CAP):
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
        # what the text pipeline (model/pipeline.py) needs to know of the model
        self.reader = pipeline.Reader(tokenizer, self.metadata.get("source_lang"), self.reads_annotations,
                                      self.config.max_positions)

    @classmethod
    def load(cls, directory: str | Path, device: str | None = None, dtype: str = "auto", prepack: bool = True,
             shortlist: bool = True, cuda_graphs: bool = True, pipelined_steps: bool = False, **limits) -> Translator:
        """A checkpoint directory, on `device` (None: CUDA when there is one) in `dtype` ("auto":
        see auto_dtype). prepack: on a CPU with native bf16, a bfloat16 model's Linear weights are
        reordered once into oneDNN's layout (model/cpu/weights.py); False keeps plain Linear layers.
        shortlist: on the CPU, decode over the directory's vocabulary shortlist when it has one
        (model/shortlist.py). cuda_graphs: on a GPU, each decoder step replays a CUDA graph
        (model/graphs.py); False runs the Transformer's own step, kernel by kernel. pipelined_steps:
        that graphed search queues each step before it waits for the one before
        (GraphedBeamSearch.pipelined)."""
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
            translator.graphed_search.pipelined = pipelined_steps
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
        return self.tokenizer.encode_source(pipeline.mask(self.reader, text).text)

    def length_cap(self, source_len: int, max_length: int | None) -> int:
        """New target tokens allowed (EOS included): model/options.py's `length_cap`, with this
        Translator's a, b and cap."""
        return length_cap(source_len, max_length, self.config.max_positions, self.max_length_a, self.max_length_b,
                          self.max_length_cap)

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
        plans = pipeline.prepare(self.reader, sources, terms, term_method)
        outputs = self.decode_all([p.ids for p in plans], pipeline.decoding(plans, options),
                                  [p.needs_attention(self.reader) for p in plans], batch_tokens, parallel)
        results = [as_torch(pipeline.finish(self.reader, plan, hyps, options)) for plan, hyps in zip(plans, outputs)]
        again = pipeline.missed_terms(plans, results)
        if again:  # an annotated term no beam wrote: that text again, its terms as sentinels
            redone = self.translate([sources[i] for i in again], pipeline.retry_options(options),
                                    batch_tokens=batch_tokens, parallel=parallel,
                                    terms=[plans[i].terms for i in again], term_method="spans")
            for i, again_result in zip(again, redone):
                results[i] = again_result
        return results

    def decode_all(self, ids: list[list[int]], options: DecodingOptions, weights: list[bool] | None = None,
                   batch_tokens: int = 4096, parallel: int = 1) -> list[list[Decoded]]:
        """`decode` over length-sorted batches of at most batch_tokens source tokens (padding and
        beams counted), in input order; a batch computes the attention when one of its sources
        needs its `weights`. parallel > 1: that many batches at once, each on its own thread (the
        largest halved until there are enough)."""
        weights = weights or [False] * len(ids)
        batches = self.batches(ids, batch_tokens // options.beam_size)
        while len(batches) < min(parallel, len(ids)):
            largest = max(batches, key=len)
            batches.remove(largest)
            batches += [largest[: len(largest) // 2], largest[len(largest) // 2:]]

        def run(batch: list[int]) -> list[list[Decoded]]:
            return self.decode([ids[i] for i in batch], options, any(weights[i] for i in batch))

        if parallel > 1:
            with ThreadPoolExecutor(parallel) as pool:
                outputs = list(pool.map(run, batches))
        else:
            outputs = map(run, batches)
        decoded: list[list[Decoded] | None] = [None] * len(ids)
        for batch, hyps in zip(batches, outputs):
            for i, h in zip(batch, hyps):
                decoded[i] = h
        return decoded  # type: ignore[return-value]

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

    def decode(self, ids: list[list[int]], options: DecodingOptions, weights: bool = False) -> list[list[Decoded]]:
        """The search on EOS-terminated source ids, one batch: each source's hypotheses, best
        first, torch-free (what finish reads, and what crosses a worker's pipe); with `weights`
        (or options.attention) each has its attention's mean over layers and heads, and with
        options.attention the attention itself (L, H, T, S)."""
        hyps = self.translate_ids(ids, replace(options, attention=options.attention or weights))
        return [[as_decoded(h, options.attention) for h in each] for each in hyps]

    def translate_ids(self, ids: list[list[int]], options: DecodingOptions) -> list[list[Hypothesis]]:
        """Hypotheses of EOS-terminated source ids, one batch, by the search the options name
        (model/strategies.py), on this Translator's engine."""
        src = padded(ids, self.config.pad_id)  # (B, S)
        caps = torch.tensor([self.length_cap(len(x), options.max_length) for x in ids]).to(self.device)
        o = options if options.length_penalty is not None else replace(options, length_penalty=self.length_penalty)
        columns = None  # the target pieces this batch may write, with a shortlist
        if self.shortlist is not None:
            columns = self.shortlist.columns(ids, always=[self.config.eos_id]).to(self.device)
        search = make_search(o, self.decoder, self.select_fn, self.graphed_search, columns)  # model/strategies.py
        with inference_attention_backends(self.device):
            return search.run(src.to(self.device), caps)


def as_decoded(h: Hypothesis, attention: bool) -> Decoded:
    """A search hypothesis without torch: its attention's mean over layers and heads (what the
    pipeline reads), and with `attention` the attention itself."""
    full = None if h.attention is None else h.attention.float().cpu().numpy()  # (L, H, T, S)
    return Decoded(h.token_ids, h.score, h.log_prob, h.ended_with_eos,
                   weights=None if full is None else full.mean(axis=(0, 1)), attention=full if attention else None)


def as_torch(result: TranslationResult) -> TranslationResult:
    """The library's results hold attention as torch tensors (the service's, numpy arrays)."""
    for h in result.hypotheses:
        if h.attention is not None:
            h.attention = torch.from_numpy(h.attention)
    return result
