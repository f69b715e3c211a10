"""Weight formats for inference on the CPU: the Linear layers of a loaded model, converted once.

- `prepack_linear_bf16`: bfloat16 weights reordered once into oneDNN's blocked layout (what
  its AMX / AVX-512 BF16 matrix kernels read). A plain bf16 `F.linear` reorders the weight
  at every call; for a decoder step that is most of the cost (1 thread, bf16, 4 x 256 @
  256 x 8000: 356 -> 197 us; 4 x 1024 @ 1024 x 256: 44 -> 21 us). Results are bit-identical.
  A ReLU or swish after the feed-forward's first layer runs inside the matrix product (128 x
  256 @ 256 x 1024 plus ReLU: 99 -> 70 us); ReLU stays bit-identical, swish is computed before
  rounding to bf16 instead of after.
- `quantize_linear_int8`: int8 weights, activations quantized on the fly (fbgemm).

Both change only Linear layers: embeddings, LayerNorms and attention stay as they are, so
attention capture is unchanged. Neither can be trained or saved; load the checkpoint again.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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


def quantize_linear_int8(model: nn.Module) -> nn.Module:
    """Int8 weights for every Linear layer, activations quantized on the fly (CPU kernels)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's notice that this API moves to torchao
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
