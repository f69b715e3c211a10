"""Decoding speed on the same weights: ours (`Translator` / `beam_search`), Hugging Face
`MarianMTModel.generate`, and CTranslate2.

    python bench/engine.py --shape small
    python bench/engine.py --shape base --beams 4 --batches 32
    python bench/engine.py --model checkpoints/en-de --engines ours,ct2
    python bench/engine.py --shape argos --engines ours,ct2   # an Argos package: CTranslate2 int8 model.bin

A random MarianMT model of the chosen shape is built once (cached under --workdir), saved as a
HF directory with tokenizer files, imported into our format (`model.convert.marian.import_marian`)
and converted for CTranslate2 (`TransformersConverter`). Every engine then decodes the same
random 25-token sources (EOS included). `--shape argos` builds instead a random package as Argos
Translate ships them (OpenNMT-py Transformer base: 6+6 layers, d 512, ReLU, pre-norm, its stored
position table, shared 50k vocabulary, sources without </s>; CTranslate2 int8 `model.bin`), and
compares CTranslate2 on that file with ours reading the same package as the service does
(`model.convert.argos`); `--package DIR` does the same for a package of your own.

Equal work: every engine must produce exactly --tgt-len target tokens per sentence (EOS never
wins): HF with `min_new_tokens` = `max_new_tokens`, CTranslate2 with `min_decoding_length` =
`max_decoding_length`, ours with `min_length` = `max_length` (each bans EOS until then).
Each row's outputs are checked for that length. tokens/s counts source + target tokens of the
batch (beams do not multiply it). Each row: one warm-up, then --repeat timed runs, median;
torch threads (ours, HF) and CTranslate2 intra_threads are set per row. With T > 1 threads and
batch > 1 there is also an "inter" layout for ours and CTranslate2: the batch cut into T
sub-batches decoded at once, one thread each (ours: `Translator.translate(parallel=T)` with one
torch thread; CTranslate2: inter_threads=T, intra_threads=1, max_batch_size=batch/T), and a
"procs" layout for ours: T worker processes of one thread each, the service's layout. The timed
runs of all engines for one (threads, beam, batch) row are interleaved, so background load hits
them alike.
A second table puts each engine at its best (compute, threads) per (beam, batch): ours against
CTranslate2 int8 and HF. Results of these runs: BENCHMARKS.md.

On a shared or oversubscribed CPU run with OMP_WAIT_POLICY=PASSIVE: OpenMP's default spin-waiting
makes every small torch op wait for a descheduled thread, and multi-thread rows collapse.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

warnings.filterwarnings("ignore", message=".*(quantiz|sacremoses).*")  # torch.ao deprecation notes; tokenizer hint
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from model.checkpoint import load_checkpoint  # noqa: E402
from model.config import ModelConfig  # noqa: E402
from model.translator import Translator  # noqa: E402

SHAPES = {
    # OPUS-MT base: transformer-align, swish, shared vocabulary (real ones have ~58k pieces)
    "base": dict(d_model=512, heads=8, ffn=2048, layers=6, vocab=32000),
    "small": dict(d_model=256, heads=4, ffn=1024, layers=3, vocab=32000),
}
EOS, UNK = 0, 1


# ---- building the models ------------------------------------------------------------------


def _train_spm(directory: Path) -> Path:
    import sentencepiece as spm

    directory.mkdir(parents=True, exist_ok=True)
    text = directory / "text.txt"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma"]
    text.write_text("\n".join(" ".join(words[(i * 7 + j) % 10] for j in range(12)) for i in range(200)) + "\n")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(directory / "spm"), vocab_size=40,
                                   model_type="unigram", hard_vocab_limit=False, minloglevel=2)
    return directory / "spm.model"


def build_hf_model(directory: Path, shape: str, seed: int = 0) -> Path:
    """A random MarianMTModel of `shape` saved with the tokenizer files HF/CTranslate2 want."""
    from transformers import MarianConfig, MarianMTModel

    s = SHAPES[shape]
    pad = s["vocab"] - 1
    config = MarianConfig(
        vocab_size=s["vocab"], d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
        encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"],
        decoder_ffn_dim=s["ffn"], max_position_embeddings=512, activation_function="swish", scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, pad_token_id=pad, eos_token_id=EOS,
        decoder_start_token_id=pad, forced_eos_token_id=None, init_std=0.05,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    spm_path = _train_spm(directory / "spm")
    for name in ("source.spm", "target.spm"):
        (directory / name).write_bytes(spm_path.read_bytes())
    vocab = {"</s>": EOS, "<unk>": UNK}
    for i in range(2, pad):
        vocab[f"\u2581w{i}"] = i
    vocab["<pad>"] = pad
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"separate_vocabs": False, "source_lang": "xx", "target_lang": "yy", "tokenizer_class": "MarianTokenizer"}))
    return directory


def prepare(workdir: Path, shape: str, need_ct2: bool) -> dict[str, Path]:
    """Build (or reuse) the HF directory, our import and the CTranslate2 conversion."""
    from model.convert.marian import import_marian

    d = workdir / shape
    paths = {"hf": d / "hf", "ours": d / "ours", "ct2": d / "ct2"}
    if not (paths["hf"] / "model.safetensors").is_file():
        print(f"building a random {shape} MarianMT model in {paths['hf']}", file=sys.stderr)
        build_hf_model(paths["hf"], shape)
    if not (paths["ours"] / "model.safetensors").is_file():
        import_marian(paths["hf"], paths["ours"])
    if need_ct2 and not (paths["ct2"] / "model.bin").is_file():
        import ctranslate2

        ctranslate2.converters.TransformersConverter(str(paths["hf"])).convert(str(paths["ct2"]), force=True)
    return paths


def build_argos_package(directory: Path, seed: int = 0) -> Path:
    """A random package in Argos Translate's layout (metadata.json, model/ in CTranslate2 int8,
    sentencepiece.model) with the shape of its en-de packages."""
    import sentencepiece as spm

    from model.convert.ctranslate2 import export_ct2
    from model.transformer import Transformer

    vocab = 50000  # Argos en-de packages: ~50k shared pieces
    config = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=512, n_heads=8, d_ff=2048,
                         encoder_layers=6, decoder_layers=6, norm="pre", activation="relu", share_embeddings=True,
                         dropout=0.0, max_positions=1024, pad_id=0, unk_id=1, bos_id=2, eos_id=3, decoder_start_id=2,
                         source_eos=False, position_table=True)
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    with torch.no_grad():
        position = torch.arange(1024, dtype=torch.float64)[:, None]
        angles = position * torch.exp(-torch.arange(0, 512, 2, dtype=torch.float64) * (math.log(10000.0) / 512))
        model.positions[:, 0::2], model.positions[:, 1::2] = torch.sin(angles), torch.cos(angles)  # OpenNMT-py's
    tokens = ["<blank>", "<unk>", "<s>", "</s>"] + [f"\u2581t{i}" for i in range(vocab - 4)]
    directory.mkdir(parents=True, exist_ok=True)
    export_ct2(model, tokens, tokens, directory / "model", add_source_eos=False, quantization="int8")
    text = [f"t{i} t{(i * 7) % 300} t{(i * 13) % 500}" for i in range(2000)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(directory / "sentencepiece"),
                                   vocab_size=200, minloglevel=2)
    (directory / "metadata.json").write_text(json.dumps({"package_version": "1.0", "argos_version": "1.0",
                                                          "from_code": "en", "from_name": "English", "to_code": "de",
                                                          "to_name": "German"}))
    return directory


def pieces(n: int, by_id: dict[int, str] | None, sp) -> list[str]:
    """Token strings by id: the tokenizer's own table where it has one (an imported Marian
    vocabulary), else SentencePiece's."""
    return [by_id.get(i, f"<id{i}>") if by_id is not None else sp.id_to_piece(i) for i in range(n)]


def converted_for_ct2(ckpt: Path, workdir: Path) -> Path:
    """Our checkpoint as a CTranslate2 model under workdir, converted once per version of its weights."""
    version = int((ckpt / "model.safetensors").stat().st_mtime)
    out = workdir / f"ct2-{ckpt.resolve().name}-{version}"
    if not (out / "model.bin").is_file():
        our_checkpoint_to_ct2(ckpt, out)
    return out


def our_checkpoint_to_ct2(ckpt: Path, out: Path) -> Path:
    """Write one of our checkpoints as a CTranslate2 model (model/convert/ctranslate2.py)."""
    from model.convert.ctranslate2 import export_ct2

    model, tokenizer, _ = load_checkpoint(ckpt)
    c = model.config
    # the benchmark hands CTranslate2 sources with their </s> already: it must not add another
    return export_ct2(model, pieces(c.src_vocab_size, tokenizer.source_pieces_by_id, tokenizer.source_sp),
                      pieces(c.tgt_vocab_size, tokenizer.target_pieces_by_id, tokenizer.target_sp), out,
                      add_source_eos=False)


# ---- the engines ----------------------------------------------------------------------------


@dataclass
class Row:
    engine: str
    compute: str
    threads: int
    beam: int
    batch: int
    tokens_per_s: float
    seconds: float
    layout: str = "intra"  # intra: one batch, `threads` intra-op threads; inter: `threads` batches at once, 1 thread
    # each; procs (ours): `threads` worker processes, 1 thread each

    @property
    def setting(self) -> str:
        return f"{self.threads}" + ("" if self.layout == "intra" else f" {self.layout}")


def our_translator(ckpt: Path, compute: str, **options) -> Translator:
    """Our Translator on the CPU in `compute`; "int8-per-batch", for comparison only: PyTorch's
    dynamic quantization as it is, one activation scale per batch (what ours ran before
    model/cpu/weights.py's Int8Linear)."""
    # without the model's vocabulary shortlist: the other engines decode over the whole vocabulary
    options.setdefault("shortlist", False)
    if compute != "int8-per-batch":
        return Translator.load(ckpt, device="cpu", dtype=compute, **options)
    translator = Translator.load(ckpt, device="cpu", dtype="float32", **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice
        torch.ao.quantization.quantize_dynamic(translator.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    return translator


class Ours:
    name = "ours"

    def __init__(self, ckpt: Path, compute: str, parallel: int = 1):
        self.t = our_translator(ckpt, compute, max_length_b=10_000)
        self.parallel = parallel
        self.torch_threads = 1 if parallel > 1 else None  # inter layout: one torch thread per batch

    def run(self, sources: list[list[int]], beam: int, tgt_len: int):
        res = self.t.translate(sources, beam_size=beam, max_length=tgt_len, min_length=tgt_len, batch_tokens=1 << 30,
                               parallel=self.parallel)
        return [r.hypotheses[0].token_ids if not r.hypotheses[0].ended_with_eos else None for r in res]


_worker_ours: Ours | None = None


def _start_worker(ckpt: Path, compute: str) -> None:
    global _worker_ours
    torch.set_num_threads(1)
    _worker_ours = Ours(ckpt, compute)


def _worker_run(job):
    return _worker_ours.run(*job)


class OursProcesses:
    """Ours in the service's layout: T worker processes with one thread each (app/worker.py
    without HTTP), the batch cut into T sub-batches, one per process. Each process is its own
    pool: a shared pool may hand two sub-batches to one process while the other idles."""

    name = "ours"

    def __init__(self, ckpt: Path, compute: str, processes: int):
        import multiprocessing

        spawn = multiprocessing.get_context("spawn")
        self.pools = [spawn.Pool(1, _start_worker, (ckpt, compute)) for _ in range(processes)]

    def run(self, sources: list[list[int]], beam: int, tgt_len: int):
        size = -(-len(sources) // len(self.pools))
        chunks = [sources[i:i + size] for i in range(0, len(sources), size)]
        jobs = [pool.apply_async(_worker_run, ((c, beam, tgt_len),)) for pool, c in zip(self.pools, chunks)]
        return [out for job in jobs for out in job.get()]

    def __del__(self):
        for pool in self.pools:
            pool.terminate()


class HF:
    name = "hf"

    def __init__(self, hf_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import MarianMTModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        self.device = device
        self.model = MarianMTModel.from_pretrained(hf_dir).to(device, dtype).eval()
        self.pad = self.model.config.pad_token_id

    def run(self, sources: list[list[int]], beam: int, tgt_len: int):
        ids = torch.tensor(sources, device=self.device)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=beam, early_stopping=True,
                max_new_tokens=tgt_len, min_new_tokens=tgt_len, do_sample=False, length_penalty=1.0,
                num_return_sequences=1, forced_eos_token_id=None, bad_words_ids=[[self.pad]], use_cache=True)
        return [[t for t in row[1:] if t not in (self.pad, EOS)] for row in out.tolist()]


class CT2:
    name = "ct2"

    def __init__(self, ct2_dir: Path, compute: str, threads: int, id_to_token: list[str], pad: str | None = None,
                 inter: bool = False):
        import ctranslate2

        # inter: `threads` sub-batches decoded at once, one thread each (CTranslate2's inter_threads)
        self.inter = threads if inter else 1
        self.t = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute,
                                        intra_threads=1 if inter else threads, inter_threads=self.inter)
        self.id_to_token = id_to_token
        # our search never emits PAD; a converted Marian model has no PAD entry, ours do
        self.suppress = [[pad]] if pad is not None else None

    def run(self, sources: list[list[int]], beam: int, tgt_len: int):
        tokens = [[self.id_to_token[i] for i in s] for s in sources]
        res = self.t.translate_batch(tokens, beam_size=beam, max_decoding_length=tgt_len,
                                     min_decoding_length=tgt_len, num_hypotheses=1, length_penalty=1.0,
                                     max_batch_size=-(-len(tokens) // self.inter) if self.inter > 1 else 0,
                                     return_scores=False, suppress_sequences=self.suppress)
        return [r.hypotheses[0] if "</s>" not in r.hypotheses[0] else None for r in res]


def make_sources(n: int, length: int, vocab: int, special: set[int], eos: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < n:
        ids = [int(i) for i in torch.randint(2, vocab - 1, (length - 1,), generator=g) if int(i) not in special]
        if len(ids) == length - 1:
            out.append(ids + [eos])
    return out


def check_outputs(engine, outputs, tgt_len: int) -> None:
    bad = [i for i, o in enumerate(outputs) if o is None or len(o) != tgt_len]
    if bad:
        lengths = [None if outputs[i] is None else len(outputs[i]) for i in bad[:5]]
        raise AssertionError(f"{engine.name}: rows {bad[:5]} did not produce exactly {tgt_len} tokens: {lengths}")


def time_rows(engines: list, sources, beam: int, tgt_len: int, repeat: int, threads: int) -> list[float]:
    """Median seconds per engine. One warm-up each (also the equal-work check), then the timed
    runs interleaved round-robin, so that load from other processes hits all engines alike."""
    for engine in engines:
        torch.set_num_threads(getattr(engine, "torch_threads", None) or threads)
        check_outputs(engine, engine.run(sources, beam, tgt_len), tgt_len)
    times: list[list[float]] = [[] for _ in engines]
    for _ in range(repeat):
        for engine, t in zip(engines, times):
            torch.set_num_threads(getattr(engine, "torch_threads", None) or threads)
            start = time.perf_counter()
            engine.run(sources, beam, tgt_len)
            t.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def agreement(live, sources, beams: list[int], tgt_len: int, token_to_id: dict[str, int]) -> None:
    """Token agreement of the float32 engines on the same weights (they should be identical)."""
    fp32 = [(name, e) for name, compute, e in live if compute == "float32"]
    for beam in beams:
        outs = {}
        for name, e in fp32:
            out = e.run(sources, beam, tgt_len)
            outs[name] = [[token_to_id.get(t, -1) if isinstance(t, str) else t for t in row] for row in out]
        names = list(outs)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                same = sum(x == y for ra, rb in zip(outs[a], outs[b]) for x, y in zip(ra, rb))
                print(f"agreement beam {beam}: {a} vs {b}: {same / (tgt_len * len(sources)):.1%} of tokens identical",
                      file=sys.stderr)


def profile_ours(ckpt: Path, compute: str, threads: int, beam: int, sources, tgt_len: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    engine = Ours(ckpt, compute)
    engine.run(sources, beam, tgt_len)
    start = time.perf_counter()
    engine.run(sources, beam, tgt_len)
    print(f"ours {compute}, {threads} threads, beam {beam}, batch {len(sources)}: "
          f"{time.perf_counter() - start:.3f} s unprofiled")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        engine.run(sources, beam, tgt_len)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=20,
                                                             max_name_column_width=40, max_shapes_column_width=70))


def fmt_table(rows: list[Row]) -> str:
    base = {(r.threads, r.beam, r.batch): r.tokens_per_s for r in rows if r.engine == "hf"}
    lines = ["| engine | compute | threads | beam | batch | tokens/s | ratio vs HF |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        hf = base.get((r.threads, r.beam, r.batch))
        ratio = f"{r.tokens_per_s / hf:.2f}" if hf else "-"
        lines.append(f"| {r.engine} | {r.compute} | {r.setting} | {r.beam} | {r.batch} | {r.tokens_per_s:,.0f} | {ratio} |")
    return "\n".join(lines)


def fmt_goal(rows: list[Row]) -> str:
    """Each engine at its best (compute, threads) per (beam, batch): ours against CTranslate2 int8
    and HF float32, the comparison issue 6 asks for. Rows timed in different runs do not mix."""
    def best(engine, compute=None):
        out = {}
        for r in rows:
            if r.engine == engine and compute in (None, r.compute):
                key = (r.beam, r.batch)
                if key not in out or r.tokens_per_s > out[key].tokens_per_s:
                    out[key] = r
        return out

    ours, ct2, hf = best("ours"), best("ct2", "int8"), best("hf")
    lines = ["| beam | batch | ours best (compute, threads) | tokens/s | ct2 int8 best (threads) | tokens/s "
             "| ours / ct2 int8 | HF best | ours / HF |", "|---:|---:|---|---:|---|---:|---:|---:|---:|"]
    for key in sorted(ours):
        o, c, h = ours[key], ct2.get(key), hf.get(key)
        vs_ct2 = f"{c.setting} | {c.tokens_per_s:,.0f} | {o.tokens_per_s / c.tokens_per_s:.2f}" if c else "- | - | -"
        vs_hf = f"{h.tokens_per_s:,.0f} | {o.tokens_per_s / h.tokens_per_s:.2f}" if h else "- | -"
        lines.append(f"| {key[0]} | {key[1]} | {o.compute}, {o.setting} | {o.tokens_per_s:,.0f} | {vs_ct2} | {vs_hf} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES) + ["argos"], default="small")
    ap.add_argument("--package", type=Path, help="an Argos package folder: CTranslate2 on its model/, ours on the "
                    "package read as the service reads it")
    ap.add_argument("--model", type=Path, help="one of our checkpoints instead of a random HF model (ours + ct2)")
    ap.add_argument("--engines", default="ours,hf,ct2")
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--ours-compute", default="float32,int8,bfloat16",
                    help="float32, int8, bfloat16; int8-per-batch: PyTorch's dynamic quantization unchanged")
    ap.add_argument("--ct2-compute", default="float32,int8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-inter", action="store_true",
                    help="skip the inter layout (with T threads: T sub-batches at once, one thread each)")
    ap.add_argument("--no-procs", action="store_true",
                    help="skip ours in T worker processes (the service's layout)")
    ap.add_argument("--src-len", type=int, default=25, help="source tokens, EOS included")
    ap.add_argument("--tgt-len", type=int, default=30, help="forced target tokens")
    ap.add_argument("--workdir", type=Path, default=ROOT / "artifacts" / "bench")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--agree", action="store_true",
                    help="first check that the float32 engines produce the same tokens (8 sentences, each beam)")
    ap.add_argument("--profile", action="store_true",
                    help="instead of timing: torch.profiler over ours (first compute, beam, batch, thread count)")
    args = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    engines = [e for e in args.engines.split(",") if e]
    unknown = set(engines) - {"ours", "hf", "ct2"}
    if unknown:
        ap.error(f"unknown engines {sorted(unknown)}")

    if args.shape == "argos" or args.package:
        from model.convert.argos import converted

        package = args.package or args.workdir / "argos" / "package"
        if not args.package and not (package / "model" / "model.bin").is_file():
            print(f"building a random Argos-shaped package in {package}", file=sys.stderr)
            build_argos_package(package)
        if "hf" in engines:
            engines.remove("hf")
        (args.workdir / "argos" / "cache").mkdir(parents=True, exist_ok=True)
        ckpt, hf_dir, ct2_dir = converted(package, args.workdir / "argos" / "cache"), None, package / "model"
        args.model = ckpt  # ids as CTranslate2's vocabulary: the import keeps them
    elif args.model:
        if "hf" in engines:
            print("--model: skipping hf (no HF model for our checkpoints)", file=sys.stderr)
            engines.remove("hf")
        ckpt, hf_dir, ct2_dir = args.model, None, None
        if "ct2" in engines:
            try:
                ct2_dir = converted_for_ct2(args.model, args.workdir)
            except Exception as e:  # noqa: BLE001 - report and go on without it
                print(f"skipping ct2: conversion failed ({e})", file=sys.stderr)
                engines.remove("ct2")
    else:
        paths = prepare(args.workdir, args.shape, "ct2" in engines)
        ckpt, hf_dir, ct2_dir = paths["ours"], paths["hf"], paths["ct2"]

    _, tok, _ = load_checkpoint(ckpt)
    c = tok.config
    # sentinels of protected spans too: real text rarely holds them, and each would make the search
    # keep attention for the repair
    special = {c.pad_id, c.eos_id, c.unk_id, c.bos_id, c.decoder_start_id} | tok.sentinel_ids
    id_to_token = pieces(c.src_vocab_size, tok.source_pieces_by_id, tok.source_sp)
    tgt_token_to_id = {token: i for i, token in enumerate(pieces(c.tgt_vocab_size, tok.target_pieces_by_id,
                                                                 tok.target_sp))}
    max_batch = max(ints(args.batches))
    all_sources = make_sources(max_batch, args.src_len, c.src_vocab_size, special, c.eos_id)

    if args.profile:
        profile_ours(ckpt, args.ours_compute.split(",")[0], ints(args.threads)[0], ints(args.beams)[0],
                     all_sources[: ints(args.batches)[0]], args.tgt_len)
        return []

    rows: list[Row] = []
    header = f"shape {args.model or args.shape}: {args.src_len}-token sources, {args.tgt_len} forced target tokens, " \
             f"median of {args.repeat}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    print(header, file=sys.stderr)
    variants = []  # (engine name, compute, layout, factory(threads)); "inter" rows only for threads > 1
    if "ours" in engines:
        for ct in args.ours_compute.split(","):
            variants.append(("ours", ct, "intra", lambda t, ct=ct: Ours(ckpt, ct)))
            variants.append(("ours", ct, "inter", lambda t, ct=ct: Ours(ckpt, ct, parallel=t)))
            variants.append(("ours", ct, "procs", lambda t, ct=ct: OursProcesses(ckpt, ct, t)))
    if "hf" in engines:
        variants.append(("hf", "float32", "intra", lambda t: HF(hf_dir)))
    if "ct2" in engines:
        for ct in args.ct2_compute.split(","):
            pad = {i: t for t, i in tgt_token_to_id.items()}[c.pad_id] if args.model else None
            variants.append(("ct2", ct, "intra", lambda t, ct=ct, pad=pad: CT2(ct2_dir, ct, t, id_to_token, pad)))
            variants.append(("ct2", ct, "inter",
                             lambda t, ct=ct, pad=pad: CT2(ct2_dir, ct, t, id_to_token, pad, inter=True)))
    if args.no_inter:
        variants = [v for v in variants if v[2] == "intra"]
    if args.no_procs:
        variants = [v for v in variants if v[2] != "procs"]
    for threads in ints(args.threads):
        torch.set_num_threads(threads)
        live = [(name, compute, layout, factory(threads)) for name, compute, layout, factory in variants
                if layout == "intra" or threads > 1]
        if args.agree and threads == ints(args.threads)[0]:
            agreement([(n, c_, e) for n, c_, _, e in live], all_sources[:8], ints(args.beams), args.tgt_len,
                      tgt_token_to_id)
        for beam in ints(args.beams):
            for batch in ints(args.batches):
                engines_here = [(n, c_, lay, e) for n, c_, lay, e in live if lay == "intra" or batch > 1]
                seconds = time_rows([e for *_, e in engines_here], all_sources[:batch], beam, args.tgt_len,
                                    args.repeat, threads)
                for (name, compute, layout, _), sec in zip(engines_here, seconds):
                    tps = batch * (args.src_len + args.tgt_len) / sec
                    rows.append(Row(name, compute, threads, beam, batch, tps, sec, layout))
                    print(f"  {name:4} {compute:8} threads {rows[-1].setting:8} beam {beam} batch {batch:3}: "
                          f"{tps:9,.0f} tokens/s ({sec:.3f} s)", file=sys.stderr, flush=True)
        del live
    rows.sort(key=lambda r: (r.threads, r.beam, r.batch, ["hf", "ours", "ct2"].index(r.engine), r.layout, r.compute))
    print(header)
    print(fmt_table(rows))
    print()
    print(fmt_goal(rows))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return rows


if __name__ == "__main__":
    main()
