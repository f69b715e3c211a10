"""What returning the attention adds to a beam search: the read-back of every hypothesis's
attention along its beams (`model.search.attention_along`), timed alone on the steps of a search.

    .venv/bin/python bench/attention_readback.py [--tree DIR] [--model checkpoints/en-de]

DIR: another checkout, whose model/ is timed instead (to compare). A small random model (2+2
layers, d 64, 800 pieces) on one thread, 32 sentences of 20 source tokens, beam 4, 4 hypotheses
each, 30 new tokens at most; or with --model that checkpoint's Translator, beam 4, its first
batch of the first 32 sentences of --data (bench/sentences.py: a file, prose@REV; else its six).
The search runs once and its steps and hypotheses are read back 20 times over, best of 5 (timing
the whole search with and without attention instead buries a few milliseconds in its noise on a
shared machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the checkout whose model/ to time (default: this one)")
    p.add_argument("--model", help="a checkpoint directory: its Translator's search instead of the random model's")
    p.add_argument("--data", help="with --model: sentences as bench/sentences.py reads them (e.g. prose@REV)")
    args = p.parse_args()
    sys.path.insert(0, str(args.tree))
    import torch

    from model import search
    from model.config import ModelConfig
    from model.search import attention_along
    from model.transformer import Transformer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.model:
        sys.path.insert(1, str(Path(__file__).resolve().parent))
        from sentences import load_sentences

        from model.translator import Translator

        translator = Translator.load(args.model)
        sentences = load_sentences(args.data, 32)

        def search_once() -> None:
            translator.translate(sentences, beam_size=4, attention=True)
    else:
        config = ModelConfig(src_vocab_size=800, tgt_vocab_size=800, d_model=64, n_heads=4, d_ff=128,
                             encoder_layers=2, decoder_layers=2, dropout=0.0, pad_id=0, bos_id=1, eos_id=2,
                             decoder_start_id=1)
        model = Transformer(config).eval()
        src = torch.randint(4, 800, (32, 20))
        src[:, -1] = config.eos_id

        def search_once() -> None:
            search.beam_search(model, src, 4, 4, 1.0, 30, True)

    captured = []

    def capture(steps, paths):
        captured.append((steps, paths))
        return attention_along(steps, paths)

    search.attention_along = capture
    search_once()
    search.attention_along = attention_along
    steps, paths = captured[0]

    def seconds() -> float:
        start = time.perf_counter()
        for _ in range(20):
            attention_along(steps, paths)
        return (time.perf_counter() - start) / 20

    seconds()  # warm-up
    print(f"{args.tree}: the read-back of {len(paths)} hypotheses' attention over {len(steps)} steps "
          f"{min(seconds() for _ in range(5)) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
