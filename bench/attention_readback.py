"""What returning the attention adds to a beam search: the read-back of every hypothesis's
attention along its beams, as the difference between a search with and without it.

    .venv/bin/python bench/attention_readback.py [--tree DIR]   # DIR: another checkout, to compare

A small random model (2+2 layers, d 64, 800 pieces) on one thread, 32 sentences of 20 source
tokens, beam 4, 4 hypotheses each, 30 new tokens at most: the search itself is cheap, so the
read-back shows. Best of 3 runs of 5 searches each.
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
    args = p.parse_args()
    sys.path.insert(0, str(args.tree))
    import torch

    from model.config import ModelConfig
    from model.search import beam_search
    from model.transformer import Transformer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=800, tgt_vocab_size=800, d_model=64, n_heads=4, d_ff=128, encoder_layers=2,
                         decoder_layers=2, dropout=0.0, pad_id=0, bos_id=1, eos_id=2, decoder_start_id=1)
    model = Transformer(config).eval()
    src = torch.randint(4, 800, (32, 20))
    src[:, -1] = config.eos_id

    def seconds(attention: bool) -> float:
        start = time.perf_counter()
        for _ in range(5):
            beam_search(model, src, 4, 4, 1.0, 30, attention)
        return (time.perf_counter() - start) / 5

    seconds(True), seconds(False)  # warm-up
    with_attention = min(seconds(True) for _ in range(3))
    without = min(seconds(False) for _ in range(3))
    print(f"{args.tree}: a search {without * 1e3:.1f} ms, with attention {with_attention * 1e3:.1f} ms: "
          f"the read-back of 128 hypotheses' attention {(with_attention - without) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
