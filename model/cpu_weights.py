"""Weight formats for inference on the CPU: the Linear layers of a loaded model, converted once.

- `prepack_linear_bf16`: bfloat16 weights reordered once into oneDNN's blocked layout (what
  its AMX / AVX-512 BF16 matrix kernels read). A plain bf16 `F.linear` reorders the weight
  at every call; for a decoder step that is most of the cost (1 thread, bf16, 4 x 256 @
  256 x 8000: 356 -> 197 us; 4 x 1024 @ 1024 x 256: 44 -> 21 us). Results are bit-identical.
  A ReLU or swish after the feed-forward's first layer runs inside the matrix product (128 x
  256 @ 256 x 1024 plus ReLU: 99 -> 70 us); ReLU stays bit-identical, swish is computed before
  rounding to bf16 instead of after.
- `quantize_linear_int8`: int8 weights, activations quantized on the fly row by row, so that a
  row's product does not depend on what it is batched with (fbgemm; `Int8Linear`).

Both change only Linear layers: embeddings, LayerNorms and attention stay as they are, so
attention capture is unchanged. Neither can be trained or saved; load the checkpoint again.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import cpu_kernels
from model.transformer import PositionwiseFeedForward

# the batch size oneDNN picks the blocked layout for; measured at 1 to 512 rows, any hint from
# 4 up gives the same speed, 1 is up to 30% slower on wide rows
_PACK_FOR_ROWS = 128
# activations oneDNN applies to a product's output before storing it, by their oneDNN names
_FUSED_ACTIVATIONS = {F.relu: "relu", F.silu: "swish"}


class PrepackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's blocked layout (bfloat16, CPU)."""

    def __init__(self, linear: nn.Linear, activation: str = "none"):
        super().__init__()
        self.in_features, self.out_features, self.activation = linear.in_features, linear.out_features, activation
        # an opaque oneDNN tensor: kept as a plain attribute, not a parameter or buffer
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _PACK_FOR_ROWS)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: Tensor) -> Tensor:  # (..., in_features) -> (..., out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, self.activation, [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activation={self.activation}")


def _identity(x: Tensor) -> Tensor:
    return x


def can_prepack_bf16(model: nn.Module) -> bool:
    """True for a bfloat16 model on a CPU whose oneDNN has native bf16 kernels."""
    p = next(model.parameters())
    return (p.device.type == "cpu" and p.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@torch.no_grad()
def prepack_linear_bf16(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of a bfloat16 CPU model by a PrepackedLinear, in place; a
    feed-forward's ReLU or swish moves into its first PrepackedLinear."""
    if not can_prepack_bf16(model):
        raise ValueError("prepacking needs a bfloat16 model on a CPU with oneDNN bf16 support")
    for ffn in [m for m in model.modules() if isinstance(m, PositionwiseFeedForward)]:
        if ffn.act in _FUSED_ACTIVATIONS and isinstance(ffn.w1, nn.Linear):
            ffn.w1, ffn.act = PrepackedLinear(ffn.w1, _FUSED_ACTIVATIONS[ffn.act]), _identity
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PrepackedLinear(child))
    return model


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (one scale per output feature) and x quantized to 8 bits row
    by row as it comes (fbgemm's dynamic int8 product; CPU).

    fbgemm quantizes its input with one scale for the whole tensor, so a row's result would
    depend on the other rows: a sentence would translate differently with other sentences in
    its batch. So each row is first mapped onto [0, 1] by its own minimum and span,
        x = lo + span * u,   x W^T = span * (u W^T) + lo * (1 W^T),
    which pins every batch's range to exactly [0, 1]: fbgemm derives the same scale for every
    batch, each row uses the whole 8-bit range (about half the error of one scale per batch),
    and a row's product is bit-identical whatever it is batched with. 1 W^T is the row sums of
    the int8 weights, computed once."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(1) / 127).clamp_min(1e-12).double()
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():
            # torch 2.13 marks quantized tensors deprecated (pytorch#184982); fbgemm's products
            # still take them, and torch is pinned
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            quantized = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            # fbgemm's packed weight: an opaque object, kept as a plain attribute
            self.packed = torch.ops.quantized.linear_prepack(quantized, None)
        self.weight_sum = quantized.dequantize().sum(1)                            # (N,)
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()

    def forward(self, x: Tensor) -> Tensor:  # (..., in_features) -> (..., out_features)
        rows = x.reshape(-1, self.in_features).contiguous()                      # (M, K)
        unit, lo, span = _unit_rows(rows)                                        # (M, K), (M, 1), (M, 1)
        # reduce_range: 7-bit activations, as fbgemm wants on x86 (no int16 overflow)
        product = torch.ops.quantized.linear_dynamic(unit, self.packed, True)   # (M, N) = u W^T
        y = _unscale_rows(product, lo, span, self.weight_sum, self.bias)         # x W^T + b
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _unit_rows(rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(M, K) -> u = (rows - lo) / span in [0, 1], lo (M, 1), span (M, 1): the C++ kernel, or its twin."""
    module = cpu_kernels.kernels()
    if module is not None:
        return module.unit_rows(rows)
    lo, hi = torch.aminmax(rows, dim=1, keepdim=True)
    span = (hi - lo).clamp_min_(1e-30)
    return (rows - lo).div_(span), lo, span  # a division: each row's max maps to exactly 1, its min to 0


def _unscale_rows(product: Tensor, lo: Tensor, span: Tensor, weight_sum: Tensor, bias: Tensor | None) -> Tensor:
    """product * span + lo * weight_sum (+ bias), (M, N): the C++ kernel (in place), or its twin."""
    module = cpu_kernels.kernels()
    if module is not None:
        return module.unscale_rows(product, lo, span, weight_sum, bias)
    offset = lo * weight_sum if bias is None else torch.addmm(bias, lo, weight_sum[None])
    return offset.addcmul_(product, span)


@torch.no_grad()
def quantize_linear_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of a float32 CPU model by an Int8Linear, in place."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear(child))
    return model
