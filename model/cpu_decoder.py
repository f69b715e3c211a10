"""A decoder step in one C++ call (model/cpu_decoder.cpp) for int8 models on the CPU.

`Transformer.decode_step` in PyTorch makes ~100 small calls a step, each with a fixed cost in
Python and dispatch that does not shrink with the batch; at a few decoder rows that cost is most
of the step. `fuse_decoder_step(model)` hands the step of a model whose Linear layers are all
`Int8Linear` to one C++ call over the same weights and the same `DecoderCache`; decode_step then
takes it (logits and attention as before). The PyTorch step stays the reference, and the tests
compare the two.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model import cpu_kernels
from model.cpu_weights import Int8Linear
from model.transformer import DecoderCache, Transformer


class FusedDecoderStep:
    """Transformer.decode_step(tokens, cache, need_weights) of an int8 model, in one call."""

    def __init__(self, model: Transformer):
        c = model.config
        layers = model.decoder_layers
        linears = [getattr(attn, name) for layer in layers for attn, name in (
            (layer.self_attn, "qkv_proj"), (layer.self_attn, "out_proj"),
            (layer.cross_attn, "q_proj"), (layer.cross_attn, "out_proj"),
            (layer.ffn, "w1"), (layer.ffn, "w2"))] + [model.output_proj]
        norms = [sub.norm for layer in layers for sub in layer.sublayers]
        if c.norm == "pre":
            norms.append(model.decoder_norm)
        eps = {n.eps for n in norms}
        if len(eps) != 1:
            raise ValueError(f"the fused step takes one LayerNorm epsilon, the model has {sorted(eps)}")
        self.step = cpu_kernels.kernels().DecoderStep(
            pre_norm=c.norm == "pre", activation=c.activation, n_heads=c.n_heads, eps=eps.pop(),
            embed_scale=model.embed_scale, embedding=model.tgt_embed.weight.detach(),
            positions=model.positions, norms=[p.detach() for n in norms for p in (n.weight, n.bias)],
            linears=[(m.q, m.scale, m.qsum, m.bias) for m in linears])

    def __call__(self, tokens: Tensor, cache: DecoderCache, need_weights: bool = False):
        """tokens (N,) -> logits (N, V) and, if asked, encoder-decoder attention (L, N, H, S)."""
        cross_kv = [t for kv in cache.cross_kv for t in kv]
        logits, weights = self.step.forward(tokens, cache.length, cache.self_kv, cache.slot, cache.table, cross_kv,
                                            cache.src_bias.view(cache.src_bias.size(0), -1), cache.group, need_weights)
        cache.length += 1
        return logits, weights


def can_fuse(model: Transformer) -> bool:
    """True for a float32 CPU model whose decoder Linear layers are all Int8Linear, with the kernels
    built and a head size the attention kernel takes (1, 2, 4, 8 or 16 vector registers)."""
    p, module = model.tgt_embed.weight, cpu_kernels.kernels()
    if module is None or p.device.type != "cpu" or p.dtype != torch.float32:
        return False
    d_head, width = model.config.d_model // model.config.n_heads, module.vector_size
    return (d_head % width == 0 and d_head // width in (1, 2, 4, 8, 16) and isinstance(model.output_proj, Int8Linear)
            and not any(isinstance(m, nn.Linear) for m in model.decoder_layers.modules()))


def fuse_decoder_step(model: Transformer) -> Transformer:
    """Let model.decode_step run as one C++ call (see the module docstring); the model is unchanged otherwise."""
    if not can_fuse(model):
        raise ValueError("the fused decoder step needs an int8 model (quantize_linear_int8) on the CPU, kernels built")
    model.fused_step = FusedDecoderStep(model)
    return model
