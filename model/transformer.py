"""The Transformer encoder-decoder of "Attention Is All You Need" (Vaswani et al., 2017).

Section numbers refer to the paper. Shapes: B batch rows, S source length, T target length,
H heads, D d_model, Dh = D / H, V vocabulary size.

Incremental decoding (fairseq's idea): `decode_step` takes the newest token of every row
plus a `DecoderCache` and returns that token's logits only. The cache is the whole
interface between the model and a search: the search may `reorder` its rows (beam
back-pointers) and `keep_sources` (drop finished sentences); it never reaches into layers.
`encode`, `start_cache` and `decode_step` are the incremental-decoder interface beam search
takes (model/search.py); the fused int8 engine (model/cpu/fused.py) implements it too.

Everything here is PyTorch. The attention function is the model's only choice of arithmetic,
made at construction: `attention` below (the reference), or a faster one with the same
contract (model/kernels: the C++ kernel for a decoder step on the CPU).
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.config import ModelConfig

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...).

    The sines fill the first half of the vector and the cosines the second (the layout of
    Marian and tensor2tensor); it is the paper's encoding with its dimensions permuted.
    """
    half = d_model // 2
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) * 2 / d_model)
    angles = position * freq  # (P, D/2)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, :half] = torch.sin(angles)
    pe[:, half : 2 * half] = torch.cos(angles)
    return pe.float()


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool, dropout: float,
              rows: Tensor | None = None):
    """Scaled dot-product attention (section 3.2.1): softmax(Q K^T / sqrt(Dh)) V.

    q: (B, H, Tq, Dh); k, v: (B, H, Tk, Dh); mask: broadcastable to (B, H, Tq, Tk), bool (True
    where attending is allowed) or an additive float bias (0 or -inf). With rows (B, Tk), k and
    v hold cache slots instead, (slots, H, Tk, Dh): key j of entry b is k[rows[b, j], :, j].
    Returns (B, H, Tq, Dh) and, if asked, the weights (B, H, Tq, Tk), in float32 whatever the
    model's dtype (they are read, not just used). Without weights PyTorch's fused SDPA runs.
    """
    if rows is not None:  # gather each entry's keys and values: 2 x (B, H, Tk, Dh)
        positions = torch.arange(k.size(2), device=k.device)
        k, v = k[rows, :, positions].transpose(1, 2), v[rows, :, positions].transpose(1, 2)
    if not need_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout), None
    scores = (q @ k.transpose(-2, -1)) * (q.size(-1) ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = scores.softmax(dim=-1, dtype=torch.float32)
    return F.dropout(weights, dropout).to(v.dtype) @ v, weights


def inference_attention_backends(device: torch.device):
    """A context that picks PyTorch's fused attention kernels for decoding on `device`. On CUDA:
    flash, memory-efficient or math, never cuDNN's, which builds a graph on the host for each new
    shape (16.7 ms of CPU per call on an H200 with torch 2.11, bench/gpu.py --profile), and a
    decoder step is a new shape every step. Elsewhere nothing changes."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class MultiHeadAttention(nn.Module):
    """Section 3.2.2. Self-attention projects Q, K and V with one fused matrix; encoder-decoder
    attention projects Q from the decoder and K, V (fused) from the encoder output."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, self_attention: bool, attention_fn=attention):
        super().__init__()
        self.n_heads, self.d_head, self.dropout = n_heads, d_model // n_heads, dropout
        self.attention_fn = attention_fn
        if self_attention:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        else:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def merge_heads(self, x: Tensor) -> Tensor:
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # (B, T, D)

    def self_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)  # 3 x (B, T, D)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.kv_proj(memory).chunk(2, dim=-1)  # 2 x (B, S, D)
        return self.split_heads(k), self.split_heads(v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool = False,
               rows: Tensor | None = None):
        p = self.dropout if self.training else 0.0
        out, weights = self.attention_fn(q, k, v, mask, need_weights, p, rows)
        return self.out_proj(self.merge_heads(out)), weights

    def attend_per_source(self, h: Tensor, k: Tensor, v: Tensor, bias: Tensor, group: int, need_weights: bool,
                          attention_fn=None, rows: Tensor | None = None):
        """Encoder-decoder attention of decoder rows that come `group` to a source (the beams of
        one sentence): the group's rows are `group` queries of one batch entry, against that
        source's one copy of keys and values, so beams never copy them. h: (N, 1, D); k, v:
        (N / group, H, S, Dh), or with rows (N / group, S) entries of a pool (P, H, S, Dh) that
        each source reads; bias: (N / group, 1, 1, S). Returns (N, 1, D) and, if asked, the
        weights (N, H, S)."""
        N, H, Dh = h.size(0), self.n_heads, self.d_head
        q = self.q_proj(h).view(N // group, group, H, Dh).transpose(1, 2)  # (N/g, H, g, Dh)
        fn = attention_fn or self.attention_fn
        out, w = fn(q, k, v, bias, need_weights, 0.0) if rows is None else fn(q, k, v, bias, need_weights, 0.0, rows)
        out = out.transpose(1, 2).reshape(N, 1, H * Dh)
        if w is not None:
            w = w.transpose(1, 2).reshape(N, H, -1)  # (N, H, S)
        return self.out_proj(out), w


class PositionwiseFeedForward(nn.Module):
    """Section 3.3: FFN(x) = act(x W1 + b1) W2 + b2."""

    def __init__(self, d_model: int, d_ff: int, activation: str, dropout: float):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.act, self.dropout = ACTIVATIONS[activation], dropout

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.w1(x))
        if self.training:  # (dropout calls are skipped, not no-ops: ~30 a decoder step, 1-2 us each)
            h = F.dropout(h, self.dropout)
        return self.w2(h)


class SublayerConnection(nn.Module):
    """Residual connection and LayerNorm around a sublayer (section 3.1, 5.4), post- or pre-norm."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm, self.dropout, self.pre_norm = nn.LayerNorm(d_model), dropout, pre_norm

    def forward(self, x: Tensor, sublayer) -> tuple[Tensor, object]:
        """sublayer returns (output, extra); extra (attention weights, say) is passed through."""
        out, extra = sublayer(self.norm(x) if self.pre_norm else x)
        x = x + (F.dropout(out, self.dropout) if self.training else out)
        return (x if self.pre_norm else self.norm(x)), extra


class EncoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        pre = c.norm == "pre"
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, self_attention=True)
        self.ffn = PositionwiseFeedForward(c.d_model, c.d_ff, c.activation, c.activation_dropout)
        self.sublayers = nn.ModuleList(SublayerConnection(c.d_model, c.dropout, pre) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        # x: (B, S, D); src_mask: (B, 1, 1, S)
        def self_attention(h):
            q, k, v = self.self_attn.self_qkv(h)
            return self.self_attn.attend(q, k, v, src_mask)

        x, _ = self.sublayers[0](x, self_attention)
        x, _ = self.sublayers[1](x, lambda h: (self.ffn(h), None))
        return x


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, attention_fn=attention):
        super().__init__()
        pre = c.norm == "pre"
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, True, attention_fn)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, False, attention_fn)
        self.ffn = PositionwiseFeedForward(c.d_model, c.d_ff, c.activation, c.activation_dropout)
        self.sublayers = nn.ModuleList(SublayerConnection(c.d_model, c.dropout, pre) for _ in range(3))

    def forward(self, x, self_attention, cross_attention):
        """x: (B, T, D). The two attention callables hold the keys/values (full or cached)."""
        x, _ = self.sublayers[0](x, self_attention)
        x, cross_weights = self.sublayers[1](x, cross_attention)
        x, _ = self.sublayers[2](x, lambda h: (self.ffn(h), None))
        return x, cross_weights


class DecoderCache:
    """Keys and values a decoder step needs, for N decoder rows over N / group sources.

    Rows are source-major: rows [i * group, (i + 1) * group) all read source i (the beams of
    one sentence). Encoder-decoder keys/values are computed once per source and kept once per
    source; the `group` rows of a source attend to them as `group` queries of one batch entry,
    so beams never copy them.

    Self-attention keys/values of all layers live in one buffer of `slots` (the rows at the
    start) x `capacity` positions, written once: each step a row stores its position t in its
    own slot, `slot[row]`. Which slot holds each earlier position of a row's history is
    `table[row, position]`, so a reorder (beam back-pointers) gathers rows of that small
    integer table instead of moving keys and values; attention reads through it.
    """

    def __init__(self, self_kv: Tensor, cross_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor, group: int):
        self.self_kv = self_kv  # (slots, capacity, L, 2, H, Dh): layer l's keys [:, :, l, 0], values [:, :, l, 1]
        N, capacity = self_kv.shape[:2]
        self.slot = torch.arange(N, device=self_kv.device)  # (N,) where each row writes its next position
        self.table = torch.empty(N, capacity, dtype=torch.long, device=self_kv.device)  # (N, capacity) slot per position
        self.cross_kv = cross_kv  # per layer: 2 x (N / group, H, S, Dh), or a pool: 2 x (P, H, S', Dh)
        # None, or (N / group,) the cross_kv entry each source reads: a running batch keeps its
        # sources' keys/values in a pool where they were written (`join`), instead of copying all
        # of them whenever a sentence joins or leaves
        self.entry: Tensor | None = None
        # the source padding mask (N / group, 1, 1, S) as an additive bias (0 or -inf): the fused
        # kernel would otherwise convert a bool mask at every step and layer
        self.src_bias = torch.zeros(src_mask.shape, dtype=cross_kv[0][0].dtype, device=src_mask.device)
        self.src_bias.masked_fill_(~src_mask, float("-inf"))
        self.group = group
        self.length = 0  # positions filled so far (with `position`: the most any row has)
        # None: every row writes position `length`; or (N,) the position each row writes next. A
        # running batch (model/running.py) has sentences that joined at later steps, each row at its
        # own position: it writes there, and reads its positions up to there only.
        self.position: Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.self_kv.size(1)

    def layer(self, i: int) -> Tensor:
        """Decoder layer i's self-attention keys [:, :, 0] and values [:, :, 1]: (slots, capacity, 2, H, Dh)."""
        return self.self_kv[:, :, i]

    def at_own_positions(self) -> None:
        """Rows at their own positions from now on (a running batch's cache): each at `length`."""
        if self.position is None:
            self.position = torch.full((self.slot.numel(),), self.length, dtype=torch.long, device=self.slot.device)

    def step_positions(self) -> int:
        """T, the positions this step reads (its writes included); raises when one is past the buffer."""
        T = self.length + 1 if self.position is None else int(self.position.max()) + 1
        if self.capacity < T:
            raise ValueError(f"decoder cache is full ({self.capacity} positions)")
        return T

    def advance(self, T: int) -> None:
        """After a step that read T positions: each row's next position is one further."""
        self.length = T
        if self.position is not None:
            self.position += 1

    def self_bias(self, T: int, dtype: torch.dtype) -> Tensor | None:
        """Self-attention's additive bias over the first T positions (N, 1, 1, T): -inf past each
        row's own position; None when every row is at the same one."""
        if self.position is None:
            return None
        positions = torch.arange(T, device=self.position.device)
        bias = torch.zeros(self.position.size(0), 1, 1, T, dtype=dtype, device=self.position.device)
        return bias.masked_fill_((positions > self.position[:, None])[:, None, None, :], float("-inf"))

    def cross_attention_kv(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Decoder layer i's encoder-decoder keys and values over the S source positions read,
        and attention's rows: (N / group, S) the pool entry of each source's every key, or None
        (2 x (N / group, H, S, Dh) then)."""
        S = self.src_bias.size(-1)
        k, v = self.cross_kv[i]
        rows = None if self.entry is None else self.entry[:, None].expand(-1, S)
        return k[:, :, :S], v[:, :, :S], rows

    # ---- a running batch's cache (model/running.py): sentences join and leave ----

    def join(self, other: DecoderCache, slots: Tensor) -> None:
        """`other`'s sources (their encoder-decoder keys/values; nothing of their own written yet)
        become this cache's last ones, their rows at position 0 and writing into `slots` (free
        slots of this cache's self-attention buffer, other.group rows a source)."""
        assert other.group == self.group and slots.numel() == other.slot.numel(), "a group of free slots per source"
        assert other.entry is None, "joining sources come with their own keys/values"
        S = max(self.src_bias.size(-1), other.src_bias.size(-1))

        def bias(x: Tensor) -> Tensor:  # (B, 1, 1, S') -> (B, 1, 1, S), -inf on the padding
            return F.pad(x, (0, S - x.size(-1)), value=float("-inf")) if x.size(-1) < S else x

        entries = self._pool_entries(other.src_bias.size(0), other.cross_kv[0][0].size(2))
        for (k, v), (their_k, their_v) in zip(self.cross_kv, other.cross_kv):  # into the pool, where they stay
            k[entries, :, : their_k.size(2)] = their_k
            v[entries, :, : their_v.size(2)] = their_v
        self.entry = torch.cat([self.entry, entries])
        self.src_bias = torch.cat([bias(self.src_bias), bias(other.src_bias)])
        self.at_own_positions()
        self.position = torch.cat([self.position, torch.zeros_like(slots)])
        self.slot = torch.cat([self.slot, slots])
        # positions a row has not written are masked; any valid slot keeps them readable
        self.table = torch.cat([self.table, slots[:, None].expand(-1, self.capacity)])

    def _pool_entries(self, n: int, S: int) -> Tensor:
        """n free entries of the cross_kv pool, for sources of up to S positions: the pool is made
        from the sources' own keys/values the first time, and grows (rarely: by half, or to a longer
        source) when it has no room. An entry's positions past its source are never read (-inf
        bias); zeros at first, so that what a query reads there is finite."""
        if self.entry is None:
            self.entry = torch.arange(self.src_bias.size(0), device=self.src_bias.device)
        P, S_pool = self.cross_kv[0][0].size(0), self.cross_kv[0][0].size(2)
        used = set(self.entry.tolist())
        free = [e for e in range(P) if e not in used]
        if len(free) < n or S_pool < S:
            grown = max(P, len(used) + n, P + P // 2) if len(free) < n else P
            self.cross_kv = [tuple(_grown(x, grown, max(S, S_pool)) for x in kv) for kv in self.cross_kv]
            free += range(P, grown)
        return torch.tensor(free[:n], dtype=torch.long, device=self.entry.device)

    def cut_sources(self, S: int) -> None:
        """Only the first S source positions are read (the longest source left is S long)."""
        if self.src_bias.size(-1) > S:
            if self.entry is None:  # a pool keeps its room for the sources to come
                self.cross_kv = [(k[:, :, :S], v[:, :, :S]) for k, v in self.cross_kv]
            self.src_bias = self.src_bias[..., :S]

    def resize(self, slots: int, capacity: int) -> None:
        """A self-attention buffer of `slots` x `capacity`, at least as large as now, with what is
        written kept."""
        old = self.self_kv
        if (slots, capacity) == tuple(old.shape[:2]):
            return
        assert slots >= old.size(0) and capacity >= self.length, "a buffer only grows"
        # zeros, not garbage: the PyTorch step reads the masked positions past a row's own too,
        # and a NaN there would survive the -inf bias
        self.self_kv = old.new_zeros(slots, capacity, *old.shape[2:])
        self.self_kv[: old.size(0), : self.length] = old[:, : self.length]
        table = self.table.new_zeros(self.table.size(0), capacity)
        table[:, : self.length] = self.table[:, : self.length]
        self.table = table

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Row r becomes old row rows[r] (beam back-pointers; a row stays within its source).

        With `sources` (indices of the sources to keep), all other sources are dropped and the
        batch shrinks; `rows` then lists only rows of kept sources, source-major.
        """
        self.table = self.table.index_select(0, rows)  # positions after `length` are not read
        if sources is not None:
            # every slot's unfilled positions are free, so the kept rows write into their
            # sources' own slots, whichever beam they now continue
            self.slot = self.slot.view(-1, self.group).index_select(0, sources).view(-1)
            if self.entry is None:
                self.cross_kv = [(k.index_select(0, sources), v.index_select(0, sources)) for k, v in self.cross_kv]
            else:  # the pool keeps them; the entries of sources gone are free
                self.entry = self.entry.index_select(0, sources)
            self.src_bias = self.src_bias.index_select(0, sources)
        if self.position is not None:  # a source's rows are at one position: any row's holds for all
            self.position = self.position.index_select(0, rows)


def _grown(x: Tensor, entries: int, S: int) -> Tensor:
    """x (P, H, S', Dh) in a zeroed (entries, H, S, Dh) tensor."""
    out = x.new_zeros(entries, x.size(1), S, x.size(3))
    out[: x.size(0), :, : x.size(2)] = x
    return out


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, attention_fn=attention):
        """attention_fn: `attention` or a function with its contract, for the decoder's attention
        (the encoder's runs whole sequences, where PyTorch's SDPA is the fast choice)."""
        super().__init__()
        c = self.config = config
        self.attention_fn = attention_fn
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_embed = self.src_embed if c.share_embeddings else nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=c.pad_id)
        # section 3.5's sinusoids, or (position_table) a table the checkpoint stores: an imported model's own
        self.register_buffer("positions", sinusoidal_positions(c.max_positions, c.d_model),
                             persistent=c.position_table)
        self.encoder_layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(c, attention_fn) for _ in range(c.decoder_layers))
        # pre-norm stacks end with a LayerNorm; post-norm layers already end with one
        self.encoder_norm = nn.LayerNorm(c.d_model) if c.norm == "pre" else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model) if c.norm == "pre" else nn.Identity()
        self.output_proj = nn.Linear(c.d_model, c.tgt_vocab_size, bias=c.output_bias)
        if c.tie_output:
            self.output_proj.weight = self.tgt_embed.weight
        self.embed_scale = math.sqrt(c.d_model) if c.scale_embedding else 1.0
        # with a vocabulary shortlist (see shortlisted): the target ids of the logits' columns, and
        # the output projection of those rows alone
        self.columns: Tensor | None = None
        self.output_rows = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias") or name == "output_proj.bias":
                nn.init.zeros_(p)
        for emb in dict.fromkeys([self.src_embed, self.tgt_embed]):  # once each, in a fixed order (a set's varies)
            nn.init.normal_(emb.weight, std=self.config.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.config.pad_id].zero_()

    def embed(self, table: nn.Embedding, ids: Tensor, start: int = 0) -> Tensor:
        # ids: (B, T) -> (B, T, D); section 3.4 scaling plus section 3.5 positions
        x = table(ids) * self.embed_scale + self.positions[start : start + ids.size(1)]
        return F.dropout(x, self.config.dropout) if self.training else x

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src: (B, S) token ids, PAD-padded. Returns memory (B, S, D) and src_mask (B, 1, 1, S)."""
        if src.size(1) > self.config.max_positions:
            raise ValueError(f"source has {src.size(1)} tokens; the model accepts at most {self.config.max_positions}")
        src_mask = (src != self.config.pad_id)[:, None, None, :]
        x = self.embed(self.src_embed, src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False):
        """Teacher-forced decoder over whole target prefixes. tgt_in: (B, T), starting with
        decoder_start_id. Returns logits (B, T, V) and, if asked, encoder-decoder attention
        (layers, B, H, T, S)."""
        T = tgt_in.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).tril()  # (T, T)
        x = self.embed(self.tgt_embed, tgt_in)
        all_weights = []
        for layer in self.decoder_layers:
            def self_attention(h, attn=layer.self_attn):
                q, k, v = attn.self_qkv(h)
                return attn.attend(q, k, v, causal)

            def cross_attention(h, attn=layer.cross_attn):
                k, v = attn.memory_kv(memory)
                return attn.attend(attn.split_heads(attn.q_proj(h)), k, v, src_mask, need_weights)

            x, weights = layer(x, self_attention, cross_attention)
            all_weights.append(weights)
        logits = self.output_proj(self.decoder_norm(x))
        return logits, (torch.stack(all_weights) if need_weights else None)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Training entry: (B, S), (B, T) -> logits (B, T, V)."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)[0]

    # ---- incremental decoding -------------------------------------------------------------

    def start_cache(self, memory: Tensor, src_mask: Tensor, group: int, capacity: int) -> DecoderCache:
        """Cache for `group` decoder rows per source, for up to `capacity` target positions."""
        if capacity > self.config.max_positions:
            raise ValueError(f"{capacity} target positions asked; the model accepts at most {self.config.max_positions}")
        N, H, Dh = memory.size(0) * group, self.config.n_heads, self.config.d_model // self.config.n_heads
        self_kv = memory.new_empty(N, capacity, len(self.decoder_layers), 2, H, Dh)
        cross_kv = [layer.cross_attn.memory_kv(memory) for layer in self.decoder_layers]
        return DecoderCache(self_kv, cross_kv, src_mask, group)

    def decode_step(self, tokens: Tensor, cache: DecoderCache, need_weights: bool = False):
        """tokens: (N,) the newest token of each row. Returns logits (N, V) for the next token
        and, if asked, encoder-decoder attention (layers, N, H, S) of this step."""
        t, g, T = cache.length, cache.group, cache.step_positions()  # T: the positions read, this one's included
        if cache.position is None:
            at = t  # the position every row writes
            x = self.embed(self.tgt_embed, tokens[:, None], start=t)  # (N, 1, D)
            cache.table[:, t] = cache.slot
        else:  # rows at their own positions (a running batch's)
            at = cache.position  # (N,)
            x = (self.tgt_embed(tokens) * self.embed_scale + self.positions[at])[:, None]
            cache.table[torch.arange(tokens.size(0), device=at.device), at] = cache.slot
        self_bias = cache.self_bias(T, x.dtype)  # (N, 1, 1, T) or None
        history = cache.table[:, :T]  # (N, T) the slot of each position
        all_weights = []
        for i, layer in enumerate(self.decoder_layers):
            def self_attention(h, attn=layer.self_attn, kv=cache.layer(i)):
                N, H, Dh = h.size(0), attn.n_heads, attn.d_head
                qkv = attn.qkv_proj(h).view(N, 3, H, Dh)  # this position's query, key, value
                kv[cache.slot, at] = qkv[:, 1:]  # one copy stores key and value: (N, 2, H, Dh)
                q = qkv[:, 0, :, None]  # (N, H, 1, Dh)
                k, v = kv[:, :T].transpose(1, 3).unbind(2)  # 2 x (slots, H, T, Dh)
                return attn.attend(q, k, v, self_bias, rows=history)

            def cross_attention(h, attn=layer.cross_attn, kv=cache.cross_attention_kv(i)):
                mem_k, mem_v, rows = kv  # 2 x (N / g, H, S, Dh) or pool entries and (N / g, S) rows
                return attn.attend_per_source(h, mem_k, mem_v, cache.src_bias, g, need_weights, rows=rows)

            x, weights = layer(x, self_attention, cross_attention)
            all_weights.append(weights)
        cache.advance(T)
        logits = (self.output_rows or self.output_proj)(self.decoder_norm(x[:, 0]))  # (N, V) or (N, V')
        return logits, (torch.stack(all_weights) if need_weights else None)

    def shortlisted(self, columns: Tensor) -> Transformer:
        """This model with decode_step computing the logits of the target ids `columns` (V',)
        only, sorted (model/shortlist.py); the weights are shared. An int8 output projection, or
        one with a weight (nn.Linear, or the embedding it is tied to: a prepacked bf16 one) computes
        those rows alone; another one computes them all, then keeps the columns."""
        view = copy.copy(self)  # the modules are shared: only the two attributes below are its own
        view.columns = columns
        proj = self.output_proj
        weight = proj.weight if isinstance(proj, nn.Linear) else self.tgt_embed.weight if self.config.tie_output else None
        if hasattr(proj, "shortlisted"):  # int8 (model/cpu/weights.py): its own rows
            view.output_rows = proj.shortlisted(columns)
        elif weight is None:
            view.output_rows = lambda h: proj(h).index_select(-1, columns)
        else:
            bias = getattr(proj, "bias", None)
            rows, row_bias = weight.index_select(0, columns), None if bias is None else bias.index_select(0, columns)
            view.output_rows = lambda h: F.linear(h, rows, row_bias)
        return view

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
