"""The GPU table: our engine in float16 and bfloat16 against Hugging Face `generate` (and
CTranslate2 where its wheel runs on the GPU) on the same random OPUS-MT-base-shaped weights, beam
4 x batch 1/32/128 (ours also without CUDA graphs, and pipelined, in float16); the shipped model's
milliseconds per decoder step at batch 1; and a training throughput figure (forward + backward +
Adam, bf16 autocast) of the shipped model's shape.

    python bench/gpu.py --out DIR            # on a CUDA machine: DIR/engine.md, DIR/train.md, DIR/gpu.json
    python bench/gpu.py --out DIR --profile 128   # and DIR/profile.txt: the operators of one beam search
    python bench/gpu.py --out DIR --check    # anywhere: the same code on a small shape, on the CPU

The model, sources and equal-work rule are bench/engine.py's: every engine writes exactly
--tgt-len tokens per sentence (EOS banned until then), checked; tokens/s counts source + target
tokens of the batch. Each row: one warm-up, then --repeat timed runs (median), with the device
synchronised around each. Run by scripts/gpu-check.sh.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore", message=".*(quantiz|sacremoses).*")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.engine import EOS, HF, SHAPES, check_outputs, make_sources, prepare  # noqa: E402
from model.config import ModelConfig  # noqa: E402
from model.translator import Translator  # noqa: E402

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Ours:
    """Our Translator; on a GPU each decoder step a CUDA graph (model/graphs.py), or with
    graphs=False ("ours-eager") the Transformer's own step, kernel by kernel; pipelined
    ("ours-pipelined"): the graphs, the host reading each step's flags while the next step runs
    (GraphedBeamSearch.pipelined)."""

    def __init__(self, ckpt: Path, device: str, compute: str, graphs: bool = True, pipelined: bool = False):
        self.name = "ours-pipelined" if pipelined else "ours" if graphs else "ours-eager"
        self.t = Translator.load(ckpt, device=device, dtype=compute, max_length_b=10_000, cuda_graphs=graphs)
        if self.t.graphed_search is not None:
            self.t.graphed_search.pipelined = pipelined

    def run(self, sources, beam: int, tgt_len: int):
        res = self.t.translate(sources, beam_size=beam, max_length=tgt_len, min_length=tgt_len,
                               batch_tokens=1 << 30)
        return [r.hypotheses[0].token_ids if not r.hypotheses[0].ended_with_eos else None for r in res]


class CT2:
    name = "ct2"

    def __init__(self, ct2_dir: Path, device: str, compute: str, id_to_token: list[str]):
        import ctranslate2

        self.t = ctranslate2.Translator(str(ct2_dir), device=device.split(":")[0], compute_type=compute)
        self.id_to_token = id_to_token

    def run(self, sources, beam: int, tgt_len: int):
        tokens = [[self.id_to_token[i] for i in s] for s in sources]
        res = self.t.translate_batch(tokens, beam_size=beam, max_decoding_length=tgt_len,
                                     min_decoding_length=tgt_len, num_hypotheses=1, length_penalty=1.0)
        return [r.hypotheses[0] if "</s>" not in r.hypotheses[0] else None for r in res]


def ct2_on(device: str) -> str | None:
    """Why CTranslate2 cannot run here, or None when it can."""
    try:
        import ctranslate2
    except ImportError:
        return "ctranslate2 is not installed"
    if device.startswith("cuda") and ctranslate2.get_cuda_device_count() == 0:
        return "this ctranslate2 wheel sees no CUDA device"
    return None


def timed(engine, sources, beam: int, tgt_len: int, repeat: int, device: str) -> float:
    check_outputs(engine, engine.run(sources, beam, tgt_len), tgt_len)  # warm-up and the equal-work check
    times = []
    for _ in range(repeat):
        synchronize(device)
        start = time.perf_counter()
        engine.run(sources, beam, tgt_len)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def engine_table(args, device: str) -> list[dict]:
    why_not_ct2 = ct2_on(device)
    paths = prepare(args.workdir, args.shape, need_ct2=why_not_ct2 is None)
    vocab = SHAPES[args.shape]["vocab"]
    id_to_token = None
    if why_not_ct2 is None:
        vocab_json = json.loads((paths["hf"] / "vocab.json").read_text())
        id_to_token = [None] * len(vocab_json)
        for token, i in vocab_json.items():
            id_to_token[i] = token
    else:
        print(f"CTranslate2 left out: {why_not_ct2}", file=sys.stderr)
    rows = []
    for compute in args.dtypes.split(","):
        engines = [Ours(paths["ours"], device, compute), HF(paths["hf"], device, TORCH_DTYPES[compute])]
        if compute in args.eager_dtypes.split(","):
            engines.insert(1, Ours(paths["ours"], device, compute, graphs=False))
        if compute in args.pipelined_dtypes.split(","):
            engines.insert(1, Ours(paths["ours"], device, compute, pipelined=True))
        if why_not_ct2 is None:
            engines.append(CT2(paths["ct2"], device, compute, id_to_token))
        for batch in [int(b) for b in args.batches.split(",")]:
            sources = make_sources(batch, args.src_len, vocab, {vocab - 1}, EOS)
            for engine in engines:
                seconds = timed(engine, sources, args.beam, args.tgt_len, args.repeat, device)
                rows.append({"engine": engine.name, "compute": compute, "beam": args.beam, "batch": batch,
                             "seconds": round(seconds, 4),
                             "tokens_per_s": round(batch * (args.src_len + args.tgt_len) / seconds, 1)})
                print(f"{engine.name} {compute} beam {args.beam} batch {batch}: {rows[-1]['tokens_per_s']:,.0f} "
                      "tokens/s", file=sys.stderr, flush=True)
        del engines
    return rows


def profile_ours(args, device: str) -> str:
    """torch.profiler's operator table for one beam search of ours (the first dtype) at --profile
    sentences: where a step's time goes, and how many kernels it launches."""
    from torch.profiler import ProfilerActivity, profile

    paths = prepare(args.workdir, args.shape, need_ct2=False)
    engine = Ours(paths["ours"], device, args.dtypes.split(",")[0])
    sources = make_sources(args.profile, args.src_len, SHAPES[args.shape]["vocab"], {SHAPES[args.shape]["vocab"] - 1}, EOS)
    engine.run(sources, args.beam, args.tgt_len)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        engine.run(sources, args.beam, args.tgt_len)
        synchronize(device)
    sort = "cuda_time_total" if device.startswith("cuda") else "cpu_time_total"
    return (f"ours, {args.dtypes.split(',')[0]}, beam {args.beam} x batch {args.profile}, {args.tgt_len} steps\n\n"
            + prof.key_averages().table(sort_by="cpu_time_total", row_limit=30) + "\n\n"
            + prof.key_averages().table(sort_by=sort, row_limit=30))


def step_times(device: str, steps: int = 64, repeat: int = 5) -> list[dict]:
    """Milliseconds per decoder step of the shipped en-de model (its default dtype on the device)
    at batch 1, beam 4: (time of `steps` forced steps - time of 2) / (steps - 2), median of
    `repeat`; with CUDA graphs (the host waiting for each step, and pipelined) and without."""
    rows = []
    sentence = ["Open the file and save your changes before you close the window."]
    variants = [(True, False), (True, True), (False, False)] if device.startswith("cuda") else [(False, False)]
    for graphs, pipelined in variants:
        t = Translator.load(ROOT / "checkpoints" / "en-de", device=device, cuda_graphs=graphs)
        if t.graphed_search is not None:
            t.graphed_search.pipelined = pipelined

        def run(n, t=t):
            t.translate(sentence, beam_size=4, max_length=n, min_length=n)

        run(steps)  # warm-up: graphs captured, kernels loaded
        per_step = []
        for _ in range(repeat):
            seconds = {}
            for n in (2, steps):
                synchronize(device)
                start = time.perf_counter()
                run(n)
                synchronize(device)
                seconds[n] = time.perf_counter() - start
            per_step.append((seconds[steps] - seconds[2]) / (steps - 2))
        rows.append({"model": "en-de (shipped)", "dtype": t.dtype, "cuda_graphs": graphs and device.startswith("cuda"),
                     "pipelined": pipelined, "batch": 1, "beam": 4,
                     "ms_per_step": round(1000 * statistics.median(per_step), 3)})
        print(f"en-de step, graphs={graphs}, pipelined={pipelined}: {rows[-1]['ms_per_step']} ms", file=sys.stderr,
              flush=True)
    return rows


def training_throughput(args, device: str) -> dict:
    """Updates of the shipped model's shape on random batches (bf16 autocast on CUDA)."""
    from model.transformer import Transformer
    from training.train import label_smoothed_loss

    config = ModelConfig.load(ROOT / "checkpoints" / "en-de" / "config.json")
    model = Transformer(config).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    g = torch.Generator().manual_seed(0)
    batch, length = args.train_batch, 32

    def step():
        src = torch.randint(4, config.src_vocab_size, (batch, length), generator=g).to(device)
        tgt = torch.randint(4, config.tgt_vocab_size, (batch, length + 1), generator=g).to(device)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            logits = model(src, tgt[:, :-1])
        loss = label_smoothed_loss(logits, tgt[:, 1:], 0.1, config.pad_id) / tgt[:, 1:].numel()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(args.train_steps):
        step()
    synchronize(device)
    seconds = time.perf_counter() - start
    tokens = args.train_steps * batch * (2 * length)
    return {"shape": f"{config.encoder_layers}+{config.decoder_layers} layers, d_model {config.d_model}",
            "batch": f"{batch} x {length} source + {length} target tokens", "steps": args.train_steps,
            "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds),
            "target_tokens_per_s": round(tokens / 2 / seconds)}


def markdown(rows: list[dict], train: dict, device_name: str, steps: list[dict]) -> tuple[str, str]:
    hf = {(r["compute"], r["batch"]): r["tokens_per_s"] for r in rows if r["engine"] == "hf"}
    lines = [f"Device: {device_name}", "", "| engine | compute | beam | batch | tokens/s | ratio vs HF |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        base = hf.get((r["compute"], r["batch"]))
        ratio = f"{r['tokens_per_s'] / base:.2f}" if base else "-"
        lines.append(f"| {r['engine']} | {r['compute']} | {r['beam']} | {r['batch']} | {r['tokens_per_s']:,.0f} | {ratio} |")
    lines += ["", "| model | dtype | CUDA graphs | batch | beam | ms per decoder step |", "|---|---|---|---:|---:|---:|"]
    graphs = {(True, False): "yes", (True, True): "yes, pipelined", (False, False): "no"}
    lines += [f"| {r['model']} | {r['dtype']} | {graphs[r['cuda_graphs'], r.get('pipelined', False)]} | {r['batch']} | "
              f"{r['beam']} | {r['ms_per_step']} |" for r in steps]
    training = [f"Device: {device_name}", "", "| model | batch | steps | tokens/s (source + target) | target tokens/s |",
                "|---|---|---:|---:|---:|",
                f"| {train['shape']} | {train['batch']} | {train['steps']} | {train['tokens_per_s']:,} | "
                f"{train['target_tokens_per_s']:,} |"]
    return "\n".join(lines) + "\n", "\n".join(training) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for engine.md, train.md and gpu.json")
    ap.add_argument("--check", action="store_true", help="a small shape on the CPU: proves the code runs")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="base")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--eager-dtypes", default="float16",
                    help="dtypes that also get a row of ours without CUDA graphs (ours-eager)")
    ap.add_argument("--pipelined-dtypes", default="float16",
                    help="dtypes that also get a row of ours with pipelined steps (ours-pipelined)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--src-len", type=int, default=25, help="source tokens, EOS included")
    ap.add_argument("--tgt-len", type=int, default=30, help="forced target tokens")
    ap.add_argument("--train-batch", type=int, default=256)
    ap.add_argument("--train-steps", type=int, default=30)
    ap.add_argument("--profile", type=int, default=0, metavar="BATCH",
                    help="also profile one beam search of ours at this batch (DIR/profile.txt: the top operators)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "artifacts" / "bench")
    args = ap.parse_args(argv)
    if args.check:
        device = "cpu"
        args.shape, args.batches, args.dtypes, args.repeat, args.tgt_len = "small", "1,2", "float32", 1, 4
        args.pipelined_dtypes = "float32"  # (the same as ours on a CPU: its constructor runs)
        args.train_batch, args.train_steps = 4, 2
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --check to test this script on the CPU")
    else:
        device = "cuda"
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (--check)"
    rows = engine_table(args, device)
    steps = step_times(device, steps=8 if args.check else 64, repeat=1 if args.check else 5)
    if args.profile:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile.txt").write_text(profile_ours(args, device))
    train = training_throughput(args, device)
    engine_md, train_md = markdown(rows, train, device_name, steps)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine.md").write_text(engine_md)
    (args.out / "train.md").write_text(train_md)
    report = {"device": device_name, "torch": torch.__version__, "engine": rows, "steps": steps, "training": train}
    (args.out / "gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    print(engine_md + "\n" + train_md)
    return report


if __name__ == "__main__":
    main()
