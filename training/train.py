"""Training: the paper's optimisation recipe (Vaswani et al., 2017, section 5) scaled to a small
CPU, the training loop, and the `nmt train` / `nmt average` commands. The data it reads (the
corpus, SentencePiece, token batches) is training/data.py; a run's state on disk (resumable
snapshots, checkpoints, averaging) is training/checkpoints.py.

    python -m training.train train --data data/corpus --out data/runs/en-de --time-budget 100
    python -m training.train train --out data/runs/en-de --resume
    python -m training.train average --run data/runs/en-de --last 5 --out data/runs/en-de/final
    python -m training.train train --restore SNAPSHOT --data data/corpus --out data/runs/en-de-2

A run directory holds: spm.model (one joint vocabulary, used as source.spm and target.spm),
config.json, args.json, log.jsonl, checkpoints/step_NNNNNNN/{state.safetensors,state.json}
and, at the end, final/ (a checkpoint directory `Translator` loads).

The training state is tensors in safetensors (weights, Adam moments, the torch RNG) plus JSON
for the rest (step, epoch, batch position, counters). Pickles are never written or read.
Data order is a pure function of (seed, epoch), so a resumed run only needs the position.
A resumed run takes its settings from args.json; only the run-control options given on its
command line (time budget, max steps, threads, save/log intervals, bf16, cooldown) replace the
saved ones.
A run whose directory is lost goes on from a checkpoint `average` wrote of it (`--restore`): the
weights, the settings, the counters and the dev curve come back; Adam's moments do not.
A run ends with a cooldown (`--cooldown N`): the learning rate falls linearly to zero over N
updates, the "decay" of a warmup-stable-decay schedule (Hagele et al., 2024). A cooled run does
not go on, so cool a fork (`--fork RUN --out FORK`) and let the main run train on later.

    python -m training.train train --fork data/runs/en-de --out data/runs/en-de-cool --cooldown 500
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F

from model.checkpoint import load_checkpoint, save_checkpoint, stored_state
from model.config import ModelConfig
from model.terms import TERM_TAGS
from model.tokenizer import Tokenizer
from model.transformer import Transformer
from model.translator import Translator
from training.annotate import noun_glosses
from training.checkpoints import (
    TrainState,
    average_checkpoints,
    checkpoint_step,
    deepen_encoder,
    grow_weights,
    list_checkpoints,
    load_training_state,
    load_weights,
    save_training_state,
)
from training.corpus import read_lines
from training.data import (
    DIRECTIONS,
    SPECIAL_IDS,
    BatchStream,
    EncodedCorpus,
    collate,
    encode_corpus,
    languages,
    load_heldout,
    load_training_corpus,
    make_batches,
    train_sentencepiece,
    with_sentinels,
)
from training.terms_eval import ding_glosses

# Arguments a resumed run may change when given; everything else comes from the run's args.json.
RUN_CONTROL_DEFAULTS = {"time_budget": 0.0, "max_steps": 0, "threads": 2, "save_minutes": 5.0, "save_every": 0,
                        "log_every": 25, "bf16": False, "cooldown": 0}
DEFAULT_CACHE = "data/cache"  # `nmt corpus`'s download cache, where --term-annotations finds the Ding dictionary
# A run restored from weights alone (--restore) starts with empty Adam moments; its first updates
# would be sign(gradient) * lr for every parameter, so the learning rate ramps up over these steps.
RESTORE_REWARM_STEPS = 100


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- model, loss, schedule -----------------------------------------------------------------


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int) -> torch.Tensor:
    """Section 5.4: cross-entropy against (1 - eps) * one-hot + eps * uniform, summed over
    non-pad positions. logits: (B, T, V) -> scalar."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1),
                           ignore_index=pad_id, label_smoothing=smoothing, reduction="sum")


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """Section 5.3 written with its peak: linear warmup, then decay with 1/sqrt(step)."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def restore_rewarm(state: TrainState) -> float:
    """Learning-rate factor after a restore from weights alone: linear from 0 to 1 over
    RESTORE_REWARM_STEPS updates, 1 otherwise."""
    if state.restored_at < 0:
        return 1.0
    return min(1.0, (state.step + 1 - state.restored_at) / RESTORE_REWARM_STEPS)


def cooldown_factor(state: TrainState) -> float:
    """Learning-rate factor during a cooldown of N updates: N/N, (N-1)/N, ..., 1/N; 1 before it."""
    if state.cooldown_start < 0:
        return 1.0
    return (state.cooldown_end - state.step) / state.cooldown_steps


def build_config(args, vocab_size: int) -> ModelConfig:
    return ModelConfig(
        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=args.d_model, n_heads=args.heads,
        d_ff=args.ff, encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers, norm=args.norm,
        activation=args.activation, share_embeddings=True, tie_output=True, output_bias=False,
        scale_embedding=True, dropout=args.dropout, attention_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout, max_positions=args.max_positions,
        decoder_start_id=SPECIAL_IDS["bos_id"], **SPECIAL_IDS)


def make_optimizer(model: Transformer) -> torch.optim.Adam:
    """Section 5.3: Adam with beta1 0.9, beta2 0.98, eps 1e-9; lr is set every step."""
    return torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True)


# ---- evaluation during training ------------------------------------------------------------


@torch.no_grad()
def dev_loss(model: Transformer, data: EncodedCorpus, max_tokens: int) -> float:
    """Per-token cross-entropy (no smoothing) on the dev set, in nats."""
    c = model.config
    was_training = model.training
    model.eval()
    src_len, tgt_len = data.lengths()
    order = np.argsort(np.maximum(src_len, tgt_len), kind="stable")
    total, tokens, start = 0.0, 0, 0
    while start < len(order):
        width, end = 0, start
        while end < len(order) and max(width, max(src_len[order[end]], tgt_len[order[end]])) * (end - start + 1) <= max_tokens:
            width = max(width, src_len[order[end]], tgt_len[order[end]])
            end += 1
        end = max(end, start + 1)
        b = collate(data, order[start:end], c)
        total += float(label_smoothed_loss(model(b.src, b.tgt_in), b.tgt_out, 0.0, c.pad_id))
        tokens += b.n_tgt
        start = end
    model.train(was_training)
    return total / max(tokens, 1)


def greedy_translate(model: Transformer, tokenizer: Tokenizer, texts: list[str], batch_tokens: int = 4096) -> list[str]:
    """Greedy decoding through the Translator (spans masked, repaired and put back)."""
    was_training = model.training
    model.eval()
    results = Translator(model, tokenizer).translate(texts, beam_size=1, batch_tokens=batch_tokens)
    model.train(was_training)
    return [r.hypotheses[0].text for r in results]


def dev_bleu(model: Transformer, tokenizer: Tokenizer, en: list[str], de: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(greedy_translate(model, tokenizer, en), [de]).score


# ---- the training loop ---------------------------------------------------------------------


class Trainer:
    def __init__(self, args, run_dir: Path):
        self.args, self.run_dir = args, run_dir
        self.ckpt_dir = run_dir / "checkpoints"
        self.sp_path = run_dir / "spm.model"
        self.sp = spm.SentencePieceProcessor(model_file=str(self.sp_path))
        self.config = ModelConfig.load(run_dir / "config.json")
        torch.manual_seed(args.seed)
        self.model = Transformer(self.config)
        self.optimizer = make_optimizer(self.model)
        self.tokenizer = Tokenizer(self.sp_path, self.sp_path, self.config)
        self.state = TrainState()

    def load_data(self) -> None:
        a, c = self.args, self.config
        share = getattr(a, "term_annotations", 0.0)  # runs older than --term-annotations lack it
        glosses = None
        if share > 0:
            if not self.tokenizer.has_term_tags:
                raise SystemExit(f"--term-annotations: {self.sp_path} has no pieces for the annotation tags "
                                 f"{' '.join(TERM_TAGS)}, so the model could not read them; start a run from "
                                 "these weights with --init-from, which adds the tags to the vocabulary")
            glosses = noun_glosses(ding_glosses(Path(a.cache)))
            if languages(run_direction(a))[0] == "de":
                glosses = [(de, en) for en, de in glosses]
        corpus = load_training_corpus(Path(a.data), a.dict_keep, a.seed, a.short_keep, parse_counts(a.repeat),
                                      parse_counts(getattr(a, "subsample", "")),  # runs older than --subsample lack it
                                      direction=run_direction(a), term_share=share, glosses=glosses,
                                      back_translated=bool(getattr(a, "back_translated", None)))
        t0 = time.time()
        self.train_data = encode_corpus(self.sp, corpus.source, corpus.target, c.eos_id, a.max_len)
        self.data_description = dict(corpus.description, pairs_after_length_filter=len(self.train_data),
                                     max_len=a.max_len)
        src_lang, tgt_lang = languages(run_direction(a))
        dev_src, dev_tgt = Path(a.data) / f"dev.{src_lang}", Path(a.data) / f"dev.{tgt_lang}"
        self.dev_data = encode_corpus(self.sp, *load_heldout(dev_src, dev_tgt), c.eos_id, 10**9)
        self.dev_src = read_lines(dev_src)[: a.dev_bleu_size]
        self.dev_tgt = read_lines(dev_tgt)[: a.dev_bleu_size]
        n_tgt = int(sum(len(t) for t in self.train_data.tgt))
        log(f"data: {len(self.train_data)} training pairs ({n_tgt} target tokens), {len(self.dev_data)} dev pairs; "
            f"encoded in {time.time() - t0:.0f}s; {json.dumps(corpus.description['pairs_by_source'])}")

    def resume(self) -> None:
        ckpts = list_checkpoints(self.run_dir)
        if not ckpts:
            raise SystemExit(f"{self.run_dir}: --resume given but no checkpoint found")
        self.state, rng = load_training_state(ckpts[-1], self.model, self.optimizer)
        if self.state.step >= self.state.cooldown_end:
            raise SystemExit(f"{self.run_dir}: cooled down at step {self.state.step}; it does not train on "
                             "(next time, --fork the run and cool the fork)")
        torch.set_rng_state(rng)
        self.truncate_log(self.state.step)
        self.write_log({"resume": True, "step": self.state.step, "threads": torch.get_num_threads(),
                        "bf16": self.args.bf16})
        log(f"resumed from {ckpts[-1]} (step {self.state.step}, epoch {self.state.epoch}, "
            f"batch {self.state.position}, {self.state.elapsed / 60:.1f} min trained)")

    def restore(self, snapshot: Path, train_state: dict) -> None:
        """Go on from a checkpoint directory's weights and the counters of the run that wrote it;
        Adam's moments start empty (RESTORE_REWARM_STEPS), the RNG from the seed and the step."""
        model, _, _ = load_checkpoint(snapshot)
        load_weights(self.model, stored_state(model))
        self.state = TrainState(**{**train_state, "restored_at": train_state["step"]})
        if self.state.step >= self.state.cooldown_end:
            raise SystemExit(f"{snapshot}: weights of a run that cooled down at step {self.state.step}; it does "
                             "not train on (restore from a snapshot of the run it was forked from)")
        torch.manual_seed(self.args.seed + self.state.step)
        self.write_log({"restored_from": str(snapshot), "step": self.state.step, "threads": torch.get_num_threads(),
                        "bf16": self.args.bf16})
        log(f"restored from {snapshot} (step {self.state.step}, epoch {self.state.epoch}, "
            f"batch {self.state.position}, {self.state.elapsed / 60:.1f} min trained); Adam starts empty")

    def start_cooldown(self, steps: int) -> None:
        """From this step on, the learning rate falls linearly to zero over `steps` updates."""
        s = self.state
        if s.cooldown_start >= 0 and steps != s.cooldown_steps:
            raise SystemExit(f"{self.run_dir}: its cooldown of {s.cooldown_steps} updates began at step "
                             f"{s.cooldown_start}; --cooldown {steps} would change it")
        if s.cooldown_start < 0:
            s.cooldown_start, s.cooldown_steps = s.step, steps
            self.write_log({"cooldown": steps, "step": s.step})
            log(f"cooldown: the learning rate falls to zero over steps {s.step + 1}-{s.cooldown_end}")

    def switch_data(self, previous: str) -> None:
        """Go on with the corpus of this session (loaded by load_data) from the start of the
        next epoch: the saved position indexes the previous corpus's batches."""
        s = self.state
        s.epoch, s.position = s.epoch + 1, 0
        self.write_log({"data_switch": True, "step": s.step, "from": previous, "to": self.args.data,
                        "repeat": self.args.repeat, "pairs": self.data_description["pairs"]})
        log(f"switched from {previous} to {self.args.data}: epoch {s.epoch} starts at step {s.step}")

    def truncate_log(self, step: int) -> None:
        """Drop records of steps after the checkpoint: the resumed run redoes those steps."""
        path = self.run_dir / "log.jsonl"
        if path.exists():
            lines = [ln for ln in path.read_text().splitlines() if json.loads(ln).get("step", 0) <= step]
            path.write_text("".join(ln + "\n" for ln in lines))

    def write_log(self, record: dict) -> None:
        with open(self.run_dir / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def update(self, stream: BatchStream) -> tuple[float, int, int]:
        """One optimizer step over `accum` batches. Returns (smoothed loss sum, src, tgt tokens)."""
        a, c = self.args, self.config
        batches = [stream.next() for _ in range(a.accum)]
        n_tgt = sum(b.n_tgt for b in batches)
        total = 0.0
        for b in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                logits = self.model(b.src, b.tgt_in)  # (B, T, V)
            loss = label_smoothed_loss(logits, b.tgt_out, a.label_smoothing, c.pad_id)
            (loss / n_tgt).backward()  # gradient of the per-token mean over the whole update
            total += float(loss.detach())
        if a.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.clip_norm)
        s = self.state
        lr = inverse_sqrt_lr(s.step + 1, a.lr, a.warmup) * restore_rewarm(s) * cooldown_factor(s)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total, sum(b.n_src for b in batches), n_tgt

    def evaluate(self) -> dict:
        # forked RNG: evaluation must not change the training random stream
        with torch.random.fork_rng(devices=[]):
            t0 = time.time()
            loss = dev_loss(self.model, self.dev_data, self.args.max_tokens)
            bleu = dev_bleu(self.model, self.tokenizer, self.dev_src, self.dev_tgt) if self.args.dev_bleu_size else None
        return {"dev_loss": round(loss, 4), "dev_ppl": round(math.exp(min(loss, 50)), 2),
                "dev_bleu": None if bleu is None else round(bleu, 2), "eval_seconds": round(time.time() - t0, 1)}

    def checkpoint(self, evaluate: bool = True) -> None:
        s = self.state
        rng = torch.get_rng_state()
        if evaluate:
            s.last_dev = dict(self.evaluate(), step=s.step)
            self.write_log({"step": s.step, "elapsed": round(s.elapsed, 1), "tgt_tokens": s.tgt_tokens, **s.last_dev})
            log(f"dev | step {s.step} | loss {s.last_dev['dev_loss']:.3f} | ppl {s.last_dev['dev_ppl']:.1f} | "
                f"BLEU {s.last_dev['dev_bleu']} (greedy, {self.args.dev_bleu_size} sents) | {s.last_dev['eval_seconds']}s")
        path = save_training_state(self.ckpt_dir, self.model, self.optimizer, s, rng)
        for old in list_checkpoints(self.run_dir)[: -self.args.keep]:
            shutil.rmtree(old)
        log(f"saved {path}")

    def run(self) -> None:
        a, s = self.args, self.state
        stream = BatchStream(self.train_data, self.config, a.max_tokens, a.seed, a.sort_chunk, s.epoch, s.position)
        self.model.train()
        budget = a.time_budget * 60 if a.time_budget else math.inf
        start = time.time() - s.elapsed  # wall clock of step 0, counting earlier sessions
        last_save = time.time()
        window = {"loss": 0.0, "tgt": 0, "src": 0, "t": time.time(), "steps": 0}
        log(f"training {self.model.num_parameters():,} parameters; bf16 autocast {'on' if a.bf16 else 'off'}; "
            f"{torch.get_num_threads()} threads")
        while True:
            if a.max_steps and s.step >= a.max_steps:
                reason = f"reached --max-steps {a.max_steps}"
                break
            if s.elapsed >= budget:
                reason = f"reached --time-budget {a.time_budget} min"
                break
            if s.step >= s.cooldown_end:
                reason = f"cooled down over {s.cooldown_steps} updates"
                break
            loss, n_src, n_tgt = self.update(stream)
            s.step, s.epoch, s.position = s.step + 1, stream.epoch, stream.position
            s.src_tokens, s.tgt_tokens = s.src_tokens + n_src, s.tgt_tokens + n_tgt
            s.elapsed = time.time() - start
            for k, v in (("loss", loss), ("tgt", n_tgt), ("src", n_src), ("steps", 1)):
                window[k] += v
            if s.step % a.log_every == 0:
                self.progress(window, budget)
                window = {"loss": 0.0, "tgt": 0, "src": 0, "t": time.time(), "steps": 0}
            due = (a.save_every and s.step % a.save_every == 0) or time.time() - last_save >= a.save_minutes * 60
            if due:
                self.checkpoint()
                last_save = time.time()
                start = time.time() - s.elapsed if a.exclude_eval_time else start
        log(f"stopping: {reason}")
        if not list_checkpoints(self.run_dir) or list_checkpoints(self.run_dir)[-1].name != f"step_{s.step:07d}":
            self.checkpoint()
        self.finish()

    def progress(self, w: dict, budget: float) -> None:
        a, s = self.args, self.state
        dt = max(time.time() - w["t"], 1e-9)
        tok_s = (w["src"] + w["tgt"]) / dt
        loss = w["loss"] / max(w["tgt"], 1)
        lr = self.optimizer.param_groups[0]["lr"]
        eta = budget - s.elapsed
        if a.max_steps:
            eta = min(eta, (a.max_steps - s.step) * dt / w["steps"])
        eta_txt = "?" if math.isinf(eta) else f"{int(eta // 60)}:{int(eta % 60):02d}"
        log(f"step {s.step} | ep {s.epoch} | loss {loss:.3f} | lr {lr:.2e} | {tok_s:,.0f} tok/s "
            f"({w['tgt'] / dt:,.0f} tgt) | {s.elapsed / 60:.1f} min | ETA {eta_txt}")
        self.write_log({"step": s.step, "epoch": s.epoch, "loss": round(loss, 4), "lr": lr,
                        "tokens_per_s": round(tok_s), "tgt_tokens_per_s": round(w["tgt"] / dt),
                        "tgt_tokens": s.tgt_tokens, "elapsed": round(s.elapsed, 1)})

    def finish(self) -> Path:
        """Average the last K checkpoints; keep the average only if its dev loss is no worse."""
        a = self.args
        ckpts = list_checkpoints(self.run_dir)
        if self.state.cooldown_start >= 0:  # an average with weights from before the cooldown undoes it
            ckpts = [c for c in ckpts if checkpoint_step(c) > self.state.cooldown_start]
        ckpts = ckpts[-a.average_last:]
        last = {n: t.detach().clone() for n, t in stored_state(self.model).items()}
        last_loss = dev_loss(self.model, self.dev_data, a.max_tokens)
        choice = {"dev_loss_last": round(last_loss, 4), "averaged_checkpoints": [c.name for c in ckpts]}
        if len(ckpts) > 1:
            load_weights(self.model, average_checkpoints(ckpts))
            avg_loss = dev_loss(self.model, self.dev_data, a.max_tokens)
            choice["dev_loss_average"] = round(avg_loss, 4)
            if avg_loss > last_loss:
                load_weights(self.model, last)
        choice["shipped"] = "average" if choice.get("dev_loss_average", math.inf) <= last_loss else "last"
        log(f"final weights: {json.dumps(choice)}")
        return self.export(choice)

    def export(self, choice: dict) -> Path:
        a, s = self.args, self.state
        dtype = a.final_dtype
        if dtype == "auto":  # float32 unless it breaks the 60 MB budget of the shipped model
            size = sum(t.numel() for t in stored_state(self.model).values()) * 4
            dtype = "float32" if size < 58e6 else "float16"
        final_dev = self.evaluate()
        summary = {
            "steps": s.step, "epochs": round(s.epoch + s.position / max(1, self._epoch_len()), 2),
            "source_tokens": s.src_tokens, "target_tokens": s.tgt_tokens,
            "wall_time_minutes": round(s.elapsed / 60, 1), "hardware": hardware(a.threads), "bf16_autocast": a.bf16,
            "final_dev": final_dev, "weights": choice, "data": self.data_description,
            "parameters": self.model.num_parameters(), "storage_dtype": dtype,
            "recipe": {k: getattr(a, k) for k in ("lr", "warmup", "max_tokens", "accum", "label_smoothing",
                                                  "clip_norm", "seed")},
        }
        src_lang, tgt_lang = languages(run_direction(a))
        metadata = {"source_lang": src_lang, "target_lang": tgt_lang, "training": summary,
                    **term_annotation_metadata(a)}
        out = Path(a.final_dir) if a.final_dir else self.run_dir / "final"
        save_checkpoint(out, self.model, self.sp_path, self.sp_path, metadata, dtype=dtype)
        self.write_log({"final": True, "step": s.step, "elapsed": round(s.elapsed, 1), **final_dev})
        log(f"final checkpoint: {out} ({dtype}); dev {json.dumps(final_dev)}")
        return out

    def _epoch_len(self) -> int:
        src_len, tgt_len = self.train_data.lengths()
        return len(make_batches(src_len, tgt_len, self.args.max_tokens, self.args.seed, self.state.epoch,
                                self.args.sort_chunk))


def run_direction(args) -> str:
    """The run's direction; runs from before --direction are en-de."""
    return getattr(args, "direction", None) or "en-de"


def hardware(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {threads} torch threads, torch {torch.__version__}"


# ---- command line --------------------------------------------------------------------------


def prepare_run(args) -> Path:
    """Fresh run: subsampled corpus -> SentencePiece -> config.json + args.json."""
    run_dir = Path(args.out)
    if list_checkpoints(run_dir):
        raise SystemExit(f"{run_dir} already has checkpoints; pass --resume or choose another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log.jsonl").unlink(missing_ok=True)
    if args.init_from:  # the checkpoint's vocabulary (plus sentinels) and shape; weights: train_command
        with_sentinels(Path(args.init_from) / "source.spm", run_dir / "spm.model")
    elif args.spm:
        shutil.copyfile(args.spm, run_dir / "spm.model")
    else:
        t0 = time.time()
        corpus = load_training_corpus(Path(args.data), args.dict_keep, args.seed, args.short_keep,
                                      parse_counts(args.repeat), parse_counts(args.subsample))
        train_sentencepiece(corpus, run_dir / "spm", args.vocab_size, args.spm_sample, args.seed)
        log(f"sentencepiece: {args.vocab_size} pieces in {time.time() - t0:.0f}s")
    vocab = spm.SentencePieceProcessor(model_file=str(run_dir / "spm.model")).get_piece_size()
    if args.init_from:
        config = ModelConfig.load(Path(args.init_from) / "config.json")
        config.src_vocab_size = config.tgt_vocab_size = vocab
        if args.grow_encoder:
            if config.norm != "pre":
                raise SystemExit("--grow-encoder needs a pre-norm checkpoint (its new layers start as the identity)")
            if args.grow_encoder % config.encoder_layers:
                raise SystemExit(f"--grow-encoder {args.grow_encoder} is not a multiple of the checkpoint's "
                                 f"{config.encoder_layers} encoder layers")
            config.encoder_layers = args.grow_encoder
        config.save(run_dir / "config.json")
    else:
        build_config(args, vocab).save(run_dir / "config.json")
    (run_dir / "args.json").write_text(json.dumps(vars_of(args), indent=1) + "\n")
    return run_dir


def run_record(run_dir: Path, checkpoint: Path) -> dict:
    """What a run needs to go on from weights alone (`nmt train --restore`): its settings, the
    counters of `checkpoint` and its dev curve so far, carried across earlier restores."""
    path = run_dir / "log.jsonl"
    records = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    return {"args": json.loads((run_dir / "args.json").read_text()),
            "train_state": json.loads((checkpoint / "state.json").read_text())["train_state"],
            "dev_curve": [r for r in records if ("dev_loss" in r and "final" not in r) or "resume" in r
                          or "restored_from" in r or "data_switch" in r or "forked_from" in r or "cooldown" in r]}


def prepare_restored_run(args, given: dict) -> tuple[argparse.Namespace, dict]:
    """A new run directory from a checkpoint with a run record (`nmt average` writes one): the
    record's settings, with --data and the run-control options `given` on this command line."""
    snapshot, run_dir = Path(args.restore), Path(args.out)
    record = json.loads((snapshot / "metadata.json").read_text()).get("run")
    if not record:
        raise SystemExit(f"{snapshot}: its metadata.json has no run record (checkpoints from `nmt average` have one)")
    if list_checkpoints(run_dir):
        raise SystemExit(f"{run_dir} already has checkpoints; pass --resume or choose another --out")
    args = argparse.Namespace(**{**RUN_CONTROL_DEFAULTS, **record["args"], **given, "data": args.data,
                                 "out": str(run_dir), "resume": False, "restore": str(snapshot)})
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(snapshot / "source.spm", run_dir / "spm.model")
    shutil.copyfile(snapshot / "config.json", run_dir / "config.json")
    (run_dir / "args.json").write_text(json.dumps(vars_of(args), indent=1) + "\n")
    (run_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in record["dev_curve"]))
    return args, record


def parse_counts(text: str | None) -> dict[str, int]:
    """"ding=2,lohelp=1" -> {"ding": 2, "lohelp": 1}."""
    out = {}
    for item in (text or "").split(","):
        if item.strip():
            name, _, n = item.partition("=")
            out[name.strip()] = int(n)
    return out


def vars_of(args) -> dict:
    return {k: v for k, v in vars(args).items() if k != "func"}


def data_switch(saved: dict, corpus: str, repeat: str | None, back_translated: bool | None = None,
                term_annotations: float | None = None, cache: str | None = None) -> dict:
    """The settings a resumed run takes on with --switch-data, after checking that the new
    corpus holds out the very dev set the run's dev curve was measured on."""
    old, new = Path(saved["data"]), Path(corpus)
    for name in ("dev.en", "dev.de"):
        if not (new / name).exists() or (new / name).read_bytes() != (old / name).read_bytes():
            raise SystemExit(f"--switch-data {new}: its {name} is not the run's ({old / name}); the dev curve "
                             "would not be comparable")
    switch = {"data": str(new), "repeat": repeat if repeat is not None else saved.get("repeat"),
              "back_translated": back_translated if back_translated is not None else saved.get("back_translated")}
    if term_annotations is not None:  # e.g. a fork that learns to read glossaries while it cools
        switch.update(term_annotations=term_annotations, cache=cache or saved.get("cache", DEFAULT_CACHE))
    return switch


def fork_run(source: Path, run_dir: Path) -> None:
    """A new run directory that goes on from `source`'s last checkpoint (weights, Adam, counters,
    data position) with its settings; `source` is left as it was and can train on."""
    ckpts = list_checkpoints(source)
    if not ckpts:
        raise SystemExit(f"--fork {source}: no checkpoint to fork from")
    if list_checkpoints(run_dir):
        raise SystemExit(f"{run_dir} already has checkpoints; --fork needs a new --out")
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "spm.model", "log.jsonl"):
        shutil.copyfile(source / name, run_dir / name)
    saved = json.loads((source / "args.json").read_text())
    (run_dir / "args.json").write_text(json.dumps(dict(saved, out=str(run_dir)), indent=1) + "\n")
    shutil.copytree(ckpts[-1], run_dir / "checkpoints" / ckpts[-1].name)
    with open(run_dir / "log.jsonl", "a") as f:
        f.write(json.dumps({"forked_from": str(ckpts[-1]), "step": checkpoint_step(ckpts[-1])}) + "\n")


def train_command(args) -> Path:
    given = {k: getattr(args, k) for k in RUN_CONTROL_DEFAULTS if getattr(args, k) is not None}
    record = None
    switch = None
    changes_mix = args.repeat is not None or args.back_translated is not None or args.term_annotations is not None
    if (args.fork or args.resume) and changes_mix and not args.switch_data:
        raise SystemExit("--repeat, --back-translated or --term-annotations on --resume or --fork changes the "
                         "data mix: it goes with --switch-data")
    if args.fork:
        if args.resume or args.restore:
            raise SystemExit("--fork starts a new run from another's last checkpoint: no --resume or --restore")
        fork_run(Path(args.fork), Path(args.out))
        args.resume = True
    if args.resume:
        run_dir = Path(args.out)
        saved = json.loads((run_dir / "args.json").read_text())
        if args.switch_data:
            switch = data_switch(saved, args.switch_data, args.repeat, args.back_translated,
                                 args.term_annotations, args.cache)
            given.update(switch)
        args = argparse.Namespace(**{**RUN_CONTROL_DEFAULTS, **saved, **given, "resume": True, "switch_data": None})
    elif args.switch_data:
        raise SystemExit("--switch-data goes with --resume")
    elif args.restore and (args.repeat is not None or args.back_translated is not None):
        raise SystemExit("--restore takes the run's data mix from the checkpoint: --repeat and --back-translated "
                         "go with a fresh run")
    elif args.restore:
        args, record = prepare_restored_run(args, given)
        run_dir = Path(args.out)
    else:
        args = argparse.Namespace(**{**vars(args), **RUN_CONTROL_DEFAULTS, **given})
        args.term_annotations = args.term_annotations or 0.0
        args.cache = args.cache or DEFAULT_CACHE
        run_dir = prepare_run(args)
    # deliberate: 2 cores, shared with other jobs; see --threads
    torch.set_num_threads(args.threads)
    trainer = Trainer(args, run_dir)
    trainer.load_data()
    if args.resume:
        trainer.resume()
        if switch:
            trainer.switch_data(saved["data"])
            (run_dir / "args.json").write_text(json.dumps(vars_of(args), indent=1) + "\n")
    elif record:
        trainer.restore(Path(args.restore), record["train_state"])
    else:
        if args.init_from:
            model, _, _ = load_checkpoint(Path(args.init_from))
            weights = stored_state(model)
            if args.grow_encoder:
                weights = deepen_encoder(weights, model.config.encoder_layers, args.grow_encoder)
            grow_weights(trainer.model, weights)
        trainer.write_log({"start": True, "parameters": trainer.model.num_parameters(), "init_from": args.init_from,
                           "config": json.loads((run_dir / "config.json").read_text())})
    if args.cooldown:
        trainer.start_cooldown(args.cooldown)
    trainer.run()
    return run_dir


def term_annotation_metadata(args) -> dict:
    """What tells the Translator that a model reads inline term annotations (model/terms.py)."""
    share = getattr(args, "term_annotations", 0.0)
    return {"term_annotations": share} if share > 0 else {}


def average_command(args) -> Path:
    """Average the last K checkpoints of a run into a checkpoint directory; of several runs (forks
    of one run, cooled on different data, say: a "model soup", Wortsman et al., 2022), the last K
    of each. The first run's settings and counters go into the metadata."""
    run_dirs = [Path(r) for r in args.run]
    per_run = [list_checkpoints(run_dir)[-args.last:] for run_dir in run_dirs]
    for run_dir, found in zip(run_dirs, per_run):
        if not found:
            raise SystemExit(f"{run_dir}: no checkpoints")
    ckpts = [c for found in per_run for c in found]
    first = run_dirs[0]
    for run_dir in run_dirs[1:]:
        for name in ("config.json", "spm.model"):
            if (run_dir / name).read_bytes() != (first / name).read_bytes():
                raise SystemExit(f"{run_dir}: its {name} is not {first}'s; only runs of one model average")
    config = ModelConfig.load(first / "config.json")
    model = Transformer(config)
    load_weights(model, average_checkpoints(ckpts))
    record = run_record(first, per_run[0][-1])
    src_lang, tgt_lang = languages(run_direction(argparse.Namespace(**record["args"])))
    names = [c.name for c in ckpts] if len(run_dirs) == 1 else [f"{c.parent.parent}/{c.name}" for c in ckpts]
    metadata = {"source_lang": src_lang, "target_lang": tgt_lang, "averaged_checkpoints": names,
                "run": record, **term_annotation_metadata(argparse.Namespace(**record["args"]))}
    save_checkpoint(Path(args.out), model, first / "spm.model", first / "spm.model", metadata, dtype=args.dtype)
    log(f"averaged {len(ckpts)} checkpoints into {args.out}")
    return Path(args.out)


def add_train_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--data", default="data/corpus", help="corpus directory (train/dev .en/.de, train.source)")
    g.add_argument("--out", required=True, help="run directory")
    g.add_argument("--direction", choices=DIRECTIONS, default="en-de", help="which side of the corpus is the source")
    g.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    # run-control options default to None so that --resume can tell "given" from "default"
    g.add_argument("--time-budget", type=float, help="minutes of training, then finish cleanly (default: none)")
    g.add_argument("--max-steps", type=int, help="optimizer steps, then finish cleanly (default: none)")
    g.add_argument("--threads", type=int, help="torch intra-op threads (default 2; 1 is faster when other "
                   "jobs load the cores, as 2 OpenMP threads then wait on each other)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--switch-data", metavar="CORPUS", help="with --resume: go on with this corpus instead of the "
                   "run's (its dev set must be the run's, so the dev curve stays comparable), from the start of "
                   "the next epoch; --repeat given with it replaces the run's")
    g.add_argument("--restore", help="go on with a run whose directory is gone, from a checkpoint that `average` "
                   "wrote of it (its weights, settings and counters; Adam starts empty)")
    g.add_argument("--fork", metavar="RUN", help="a new run (--out) that goes on from RUN's last checkpoint, "
                   "Adam included; RUN is left as it was")
    g.add_argument("--cooldown", type=int, metavar="N", help="end the run: the learning rate falls linearly to "
                   "zero over the next N updates (a cooled run does not go on; see --fork)")
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, help="bf16 autocast for forward/backward "
                   "(default off; a resumed run keeps its setting unless given: fast with AMX or AVX-512 BF16, "
                   "slow without)")
    g = p.add_argument_group("data")
    g.add_argument("--dict-keep", type=int, default=60000, help="ding_dict entries kept (-1: all)")
    g.add_argument("--short-keep", type=int, default=-1, help="1-2 word pairs of the other sources kept (-1: all)")
    g.add_argument("--subsample", default="", help="subsample sources' pairs to these counts, e.g. bible=30000")
    g.add_argument("--repeat", help="repeat sources' pairs, e.g. ding=2 (default: none)")
    g.add_argument("--back-translated", action="store_true", default=None,
                   help="also train on the corpus's back-translated pairs of this direction (source "
                   "`backtranslated`; `nmt backtranslate` writes them); with --resume, goes with --switch-data")
    g.add_argument("--vocab-size", type=int, default=8000)
    g.add_argument("--spm-sample", type=int, default=300000, help="sentences sampled to train SentencePiece")
    g.add_argument("--spm", help="use this SentencePiece model instead of training one")
    g.add_argument("--init-from", help="start from this checkpoint directory's weights, vocabulary (plus the "
                   "sentinels of protected spans) and shape; Adam and the schedule start afresh")
    g.add_argument("--grow-encoder", type=int, help="with --init-from: this many encoder layers, a multiple of "
                   "the checkpoint's; each trained layer is followed by copies that start as the identity")
    g.add_argument("--term-annotations", type=float, metavar="SHARE",
                   help="examine this share of the pairs for inline target-term annotations from the Ding "
                   "dictionary (training/annotate.py; needs --cache); the model then reads glossaries that way "
                   "(default 0; with --resume, goes with --switch-data)")
    g.add_argument("--cache", help=f"`nmt corpus`'s cache (the Ding dictionary; default {DEFAULT_CACHE})")
    g.add_argument("--max-len", type=int, default=128, help="drop pairs with a side this long (tokens)")
    g.add_argument("--max-tokens", type=int, default=2500, help="padded tokens (longest side) per batch")
    g.add_argument("--accum", type=int, default=2, help="batches per optimizer step")
    g.add_argument("--sort-chunk", type=int, default=20000, help="pairs sorted together when bucketing")
    g = p.add_argument_group("model")
    g.add_argument("--d-model", type=int, default=256)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--ff", type=int, default=1024)
    g.add_argument("--encoder-layers", type=int, default=6)
    g.add_argument("--decoder-layers", type=int, default=2)
    g.add_argument("--norm", default="pre", choices=["pre", "post"])
    g.add_argument("--activation", default="relu", choices=["relu", "gelu", "swish"])
    g.add_argument("--dropout", type=float, default=0.1)
    g.add_argument("--attention-dropout", type=float, default=0.0)
    g.add_argument("--activation-dropout", type=float, default=0.0)
    g.add_argument("--max-positions", type=int, default=512)
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (reached after warmup)")
    g.add_argument("--warmup", type=int, default=800)
    g.add_argument("--label-smoothing", type=float, default=0.1)
    g.add_argument("--clip-norm", type=float, default=1.0)
    g = p.add_argument_group("checkpoints and evaluation")
    g.add_argument("--save-minutes", type=float, help="checkpoint (with dev eval) this often (default 5)")
    g.add_argument("--save-every", type=int, help="also checkpoint every N steps (default: off)")
    g.add_argument("--keep", type=int, default=5, help="checkpoints kept on disk")
    g.add_argument("--average-last", type=int, default=5, help="checkpoints averaged into the final model")
    g.add_argument("--exclude-eval-time", action="store_true", help="do not count dev evaluation in the budget")
    g.add_argument("--dev-bleu-size", type=int, default=300, help="dev sentences decoded for BLEU (0: none)")
    g.add_argument("--log-every", type=int, help="progress line every N steps (default 25)")
    g.add_argument("--final-dir", help="where the final checkpoint goes (default RUN/final)")
    g.add_argument("--final-dtype", default="auto", choices=["auto", "float32", "float16"])


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train an en-de Transformer (resumable)")
    add_train_args(p)
    p.set_defaults(func=train_command)
    p = subparsers.add_parser("average", help="average the last K checkpoints of a run (or of each of several)")
    p.add_argument("--run", required=True, action="append", help="run directory; again for more runs of one model")
    p.add_argument("--last", type=int, default=5, help="checkpoints of each run")
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.set_defaults(func=average_command)


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m training.train")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    main()
