"""Weight formats for inference on the CPU: the Linear layers of a loaded model, converted once.

- `prepack_linear_bf16`: bfloat16 weights reordered once into oneDNN's blocked layout (what
  its AMX / AVX-512 BF16 matrix kernels read). A plain bf16 `F.linear` reorders the weight
  at every call; for a decoder step that is most of the cost (1 thread, bf16, 4 x 256 @
  256 x 8000: 356 -> 197 us; 4 x 1024 @ 1024 x 256: 44 -> 21 us). Results are bit-identical.
  A ReLU or swish after the feed-forward's first layer runs inside the matrix product (128 x
  256 @ 256 x 1024 plus ReLU: 99 -> 70 us); ReLU stays bit-identical, swish is computed before
  rounding to bf16 instead of after.
- `quantize_linear_int8`: int8 weights, activations quantized on the fly row by row, so that a
  row's product does not depend on what it is batched with (`Int8Linear`, on our own integer
  kernels, model/kernels/int8.cpp).

Both change only Linear layers: embeddings, LayerNorms and attention stay as they are, so
attention capture is unchanged. Neither can be trained or saved; load the checkpoint again.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import kernels
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


class PrepackedFeedForward(nn.Module):
    """PositionwiseFeedForward with both products prepacked and its ReLU or swish inside the first."""

    def __init__(self, ffn: PositionwiseFeedForward):
        super().__init__()
        self.w1 = PrepackedLinear(ffn.w1, _FUSED_ACTIVATIONS[ffn.act])
        self.w2 = PrepackedLinear(ffn.w2)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.w1(x))


def can_prepack_bf16(model: nn.Module) -> bool:
    """True for a bfloat16 model on a CPU whose oneDNN has native bf16 kernels."""
    p = next(model.parameters())
    return (p.device.type == "cpu" and p.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@torch.no_grad()
def prepack_linear_bf16(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of a bfloat16 CPU model by a PrepackedLinear, in place; a
    feed-forward whose activation oneDNN applies becomes a PrepackedFeedForward."""
    if not can_prepack_bf16(model):
        raise ValueError("prepacking needs a bfloat16 model on a CPU with oneDNN bf16 support")
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, PositionwiseFeedForward) and child.act in _FUSED_ACTIVATIONS:
                setattr(module, name, PrepackedFeedForward(child))
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PrepackedLinear(child))
    return model


def pack_int8(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A float (N, K) weight -> int8 q in the kernels' layout (N/16, K/4, 16, 4), N and K padded
    with zeros; scale (N,), W ~ scale * q row by row (symmetric, max |W[n]| -> 127); and qsum
    (N,) = scale * (row sums of q), what each row's minimum contributes (model/kernels/int8.cpp)."""
    N, K = weight.shape
    weight = weight.detach().float()
    scale = (weight.abs().amax(1) / 127).clamp_min(1e-12)                      # (N,)
    q = torch.zeros(-(-N // 16) * 16, -(-K // 4) * 4, dtype=torch.int8)       # (Np, Kp)
    q[:N, :K] = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    qsum = scale * q[:N].sum(1, dtype=torch.int32).float()
    packed = q.view(q.size(0) // 16, 16, q.size(1) // 4, 4).transpose(1, 2).contiguous()
    return packed, scale, qsum


def unpack_int8(packed: Tensor, N: int, K: int) -> Tensor:
    """pack_int8's q back as (N, K) int8."""
    return packed.transpose(1, 2).reshape(packed.size(0) * 16, packed.size(1) * 4)[:N, :K]


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (one scale per output feature) and x quantized to 8 bits row
    by row as it comes, by its own minimum and step (model/kernels/int8.cpp: AVX-512 VNNI or AVX2
    integer products; a PyTorch twin where the kernels are not built).

    Each row's quantization and integer sums are its own, so a row's product is the same
    whatever it is batched with: a sentence translates the same alone or with strangers'
    sentences in the service's batches. Scaling each row onto its own range also keeps more
    of its precision than one scale for a whole batch."""

    def __init__(self, linear: nn.Linear, kernel_module=None):
        """kernel_module: the compiled kernels (kernels.load()), or None for the PyTorch twin."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernels = kernel_module
        self.q, self.scale, self.qsum = pack_int8(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self._q = None  # (N, K) q as floats, made for the PyTorch twin when it first runs
        self._rows = None  # (N, Kp) q unpacked, made when a shortlist first takes rows of it

    def forward(self, x: Tensor) -> Tensor:  # (..., in_features) -> (..., out_features)
        return self.product(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)

    def shortlisted(self, index: Tensor) -> Int8Linear:
        """This layer with the output features `index` (V',) alone, q repacked in the kernels'
        layout: a smaller Linear of the same weights (model/shortlist.py)."""
        if self._rows is None:
            self._rows = unpack_int8(self.q, self.out_features, self.q.size(1) * 4)  # (N, Kp)
        # the kernels' layout moves groups of 4 int8 weights: as int32, the transpose copies 4x fewer elements
        rows = self._rows.view(torch.int32)  # (N, Kp / 4)
        padded = torch.zeros(-(-len(index) // 16) * 16, rows.size(1), dtype=torch.int32)  # (V' padded, Kp / 4)
        padded[: len(index)] = rows.index_select(0, index)
        blocks, groups = padded.size(0) // 16, padded.size(1)
        view = copy.copy(self)
        view.q = padded.view(blocks, 16, groups).transpose(1, 2).contiguous().view(torch.int8).view(blocks, groups, 16, 4)
        view.scale, view.qsum = self.scale.index_select(0, index), self.qsum.index_select(0, index)
        view.bias = None if self.bias is None else self.bias.index_select(0, index)
        view.out_features, view._q, view._rows = len(index), None, None
        return view

    def product(self, rows: Tensor, relu: bool = False, path: str = "") -> Tensor:
        """(M, K) float32 -> (M, N); `path` picks one of kernels.load().int8_paths() (tests)."""
        if self.kernels is not None:
            return self.kernels.int8_linear(rows.contiguous(), self.q, self.scale, self.qsum, self.bias, relu, path)
        return self.twin(rows, 255, relu)

    def twin(self, rows: Tensor, levels: int, relu: bool = False) -> Tensor:
        """The kernel's arithmetic in PyTorch ops: each row quantized to 0 .. levels, the integer
        sums exact (float32 where no sum can pass 2^24, else float64), so that a row's result
        does not depend on its batch, as the kernel's; then the same scaling up to float rounding."""
        exact = torch.float32 if self.in_features * levels * 127 < 2**24 else torch.float64
        if self._q is None or self._q.dtype != exact:
            self._q = unpack_int8(self.q, self.out_features, self.in_features).to(exact)
        lo, hi = torch.aminmax(rows, dim=1, keepdim=True)                        # (M, 1) each
        span = hi - lo
        inv = torch.where(span > 0, levels / span, torch.zeros_like(span))
        a = ((rows - lo) * inv + 0.5).clamp_max_(levels).floor_()                # (M, K) in 0 .. levels
        sums = (a.to(exact) @ self._q.T).float()                                 # (M, N), exact integers
        y = sums * (span / levels * self.scale) + lo * self.qsum
        if self.bias is not None:
            y += self.bias
        return y.relu_() if relu else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@torch.no_grad()
def release_freed_memory() -> None:
    """Hand the heap pages freed so far back to the operating system (glibc's malloc_trim).
    Quantizing frees the float32 weights, but glibc keeps freed pages for later allocations, so
    without this a worker of int8 models stays as large as it was with float32 ones."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def quantize_linear_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of a float32 CPU model by an Int8Linear, in place; they run on the
    C++ kernels where those are built (decided now, once), else on the PyTorch twin."""
    kernel_module = kernels.load()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear(child, kernel_module))
    release_freed_memory()
    return model
