"""An int8 model's encoder and decoder step, each in one C++ call (model/kernels/fused.cpp).

In PyTorch `Transformer.decode_step` makes ~100 small calls a step and `encode` ~20 a layer,
each with a fixed cost in Python and dispatch that does not shrink with the batch; at a few
sentences that cost is most of the work. `fuse(model)`, for a CPU model whose Linear layers are
all `Int8Linear`, returns a `FusedInt8Decoder`: the incremental-decoder interface beam search
takes (model/search.py), with `encode` and `decode_step` in C++ over the same weights (and, for
the step, the same `DecoderCache`), with the same results bit for bit. The one difference: the
fused encoder skips the source's padding (its tokens packed, self-attention within each sentence
by kernels.packed_self_attention; memory 0 at padding), where PyTorch's attends through SDPA over
the padded batch: the same up to float32 rounding, and bit for bit with PyTorch's encoder attending
through that kernel. The model's PyTorch code stays the reference, and the tests compare the two.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from model import kernels
from model.cpu.weights import Int8Linear
from model.transformer import DecoderCache, Transformer


class FusedInt8Decoder:
    """Transformer.encode and Transformer.decode_step of an int8 model, one C++ call each."""

    def __init__(self, model: Transformer):
        c, module = model.config, kernels.load()
        self.model, self.config = model, c
        self.columns: Tensor | None = None  # the target ids of the logits' columns (None: all); see shortlisted
        # encode works on the source's tokens alone, so a batch of unlike lengths costs it no padding
        # (search.encode_by_length need not cut it into length groups)
        self.skips_padding = True
        self.shortlist = None  # the output projection's rows of them

        def norms(modules):
            eps = {n.eps for n in modules}
            if len(eps) != 1:
                raise ValueError(f"fused calls take one LayerNorm epsilon, the model has {sorted(eps)}")
            return [p.detach() for n in modules for p in (n.weight, n.bias)], eps.pop()

        def linears(modules):
            return [(m.q, m.scale, m.qsum, m.bias) for m in modules]

        common = dict(pre_norm=c.norm == "pre", activation=c.activation, n_heads=c.n_heads,
                      embed_scale=model.embed_scale, positions=model.positions)
        layers = model.encoder_layers
        encoder_norms, eps = norms([sub.norm for layer in layers for sub in layer.sublayers]
                                   + ([model.encoder_norm] if c.norm == "pre" else []))
        self.encoder = module.Encoder(
            **common, eps=eps, pad_id=c.pad_id, embedding=model.src_embed.weight.detach(), norms=encoder_norms,
            linears=linears([m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.out_proj,
                                                             layer.ffn.w1, layer.ffn.w2)]))
        layers = model.decoder_layers
        decoder_norms, eps = norms([sub.norm for layer in layers for sub in layer.sublayers]
                                   + ([model.decoder_norm] if c.norm == "pre" else []))
        self.decoder_step = module.DecoderStep(
            **common, eps=eps, embedding=model.tgt_embed.weight.detach(), norms=decoder_norms,
            linears=linears([m for layer in layers for m in (
                layer.self_attn.qkv_proj, layer.self_attn.out_proj, layer.cross_attn.q_proj, layer.cross_attn.out_proj,
                layer.ffn.w1, layer.ffn.w2)] + [model.output_proj]))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D) and src_mask (B, 1, 1, S)."""
        if src.size(1) > self.config.max_positions:
            raise ValueError(f"source has {src.size(1)} tokens; the model accepts at most {self.config.max_positions}")
        memory, src_mask = self.encoder.forward(src)  # a list of two tensors from C++
        return memory, src_mask

    def start_cache(self, memory: Tensor, src_mask: Tensor, group: int, capacity: int) -> DecoderCache:
        """The model's own cache (its encoder-decoder keys and values in PyTorch, once a batch)."""
        return self.model.start_cache(memory, src_mask, group, capacity)

    def shortlisted(self, columns: Tensor) -> FusedInt8Decoder:
        """This decoder computing the logits of the target ids `columns` (V',) only, sorted
        (model/shortlist.py); the weights are shared."""
        rows = self.model.output_proj.shortlisted(columns)
        view = copy.copy(self)
        view.columns, view.shortlist = columns, (rows.q, rows.scale, rows.qsum, rows.bias)
        return view

    def decode_step(self, tokens: Tensor, cache: DecoderCache, need_weights: bool = False):
        """tokens (N,) -> logits (N, V), or (N, V') when shortlisted, and, if asked,
        encoder-decoder attention (L, N, H, S)."""
        T = cache.step_positions()
        cross_kv = [t for kv in cache.cross_kv for t in kv]
        logits, weights = self.decoder_step.forward(tokens, cache.length, cache.self_kv, cache.slot, cache.table,
                                                    cross_kv, cache.src_bias.view(cache.src_bias.size(0), -1),
                                                    cache.group, need_weights, self.shortlist, cache.position,
                                                    cache.entry)
        cache.advance(T)
        return logits, weights


def can_fuse(model: Transformer) -> bool:
    """True for a float32 CPU model whose Linear layers are all Int8Linear, with the kernels built
    and a head size the decoder's attention kernel takes (1, 2, 4, 8 or 16 vector registers)."""
    p, module = model.tgt_embed.weight, kernels.load()
    if module is None or p.device.type != "cpu" or p.dtype != torch.float32:
        return False
    d_head, width = model.config.d_model // model.config.n_heads, module.vector_size
    return (d_head % width == 0 and d_head // width in (1, 2, 4, 8, 16) and isinstance(model.output_proj, Int8Linear)
            and not any(isinstance(m, nn.Linear) for m in model.modules()))


def fuse(model: Transformer) -> FusedInt8Decoder:
    """The model's encode and decode_step as one C++ call each (see the module docstring)."""
    if not can_fuse(model):
        raise ValueError("fused calls need an int8 model (quantize_linear_int8) on the CPU, the kernels built and a "
                         "head size their attention takes")
    return FusedInt8Decoder(model)
