"""vLLM attention backend for "tpu": paged attention over vLLM's KV cache.

The KV cache of a layer is one device tensor [2, num_blocks, block_size,
num_kv_heads, head_size] (keys, then values), in vLLM's blocks: the scheduler's
block tables index it directly.  Each step writes the new tokens' keys and
values into their slots and attends over the blocks each sequence owns, on the
device; nothing is copied to the host.

A step's tokens are ragged (prefills of any length and single-token decodes in
one flat batch).  The metadata builder turns vLLM's per-request metadata into
fixed-shape index tensors, padded to buckets (`bucket`), so the step's ops see
a few shapes only and each compiles once:

  q_index [S, Q]    token index of query i of sequence s (0 where padded)
  q_pos   [S, Q]    that query's position in its sequence: it attends to keys
                    0..q_pos (causal); padded queries attend to key 0 only
  blocks  [S, B]    the sequence's block ids (vLLM's null block 0 where padded)
  out_index [T]     where token t's row is in the [S*Q] result
  slots   [T]       the KV-cache slot each token's key/value goes to (the
                    null block's slot 0 for padding tokens)

with S sequences, Q queries per sequence and B blocks per sequence, each
rounded up by `bucket`, and T the padded token count (`padded_tokens`, which
the model runner pads its inputs to).
"""
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)


def bucket(n: int, minimum: int = 1) -> int:
    """The padded size for n: the next power of two (at least `minimum`)."""
    n = max(int(n), minimum, 1)
    return 1 << (n - 1).bit_length()


def padded_tokens(n: int) -> int:
    """The token count a step of n tokens runs with (the runner pads its
    inputs to it, the metadata builder its per-token indices).  A single
    decode is not padded: at one row XLA:CPU's products cost as PyTorch's,
    at eight four times as much."""
    return bucket(n)


def paged_attention(query, kv_cache, q_index, q_pos, blocks, out_index, scale,
                    sliding_window=None, logits_soft_cap=None):
    """Attention of `query` [T, H, D] over the paged `kv_cache` (see the
    module docstring for the index tensors); returns [T, H, D].

    Computed in float32 (as vLLM's kernels accumulate), whatever the cache's
    dtype; the result has the query's dtype."""
    _, _, block_size, kv_heads, head = kv_cache.shape
    S, Q = q_index.shape
    H = query.shape[1]
    G = H // kv_heads
    L = blocks.shape[1] * block_size
    # One gather from the whole cache for keys and values (indexing the
    # keys' half first would have the program copy that half).
    n = kv_cache.shape[1]
    kv = kv_cache.flatten(0, 1)[torch.stack([blocks, blocks + n])]
    k = kv[0].reshape(S, L, kv_heads, head).float()
    v = kv[1].reshape(S, L, kv_heads, head).float()
    q = query[q_index].reshape(S, Q, kv_heads, G, head).float()
    scores = torch.einsum("sqhgd,slhd->shgql", q, k) * scale
    if logits_soft_cap:
        scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
    keys = torch.arange(L, device=query.device)
    visible = keys.view(1, 1, L) <= q_pos.view(S, Q, 1)
    if sliding_window is not None:
        visible = visible & (keys.view(1, 1, L) > q_pos.view(S, Q, 1) - sliding_window)
    scores = scores.masked_fill(~visible.view(S, 1, 1, Q, L), float("-inf"))
    out = torch.einsum("shgql,slhd->sqhgd", scores.softmax(-1), v)
    return out.reshape(S * Q, H, head)[out_index].to(query.dtype)


@dataclass
class TpuAttentionMetadata:
    num_actual_tokens: int
    q_index: torch.Tensor
    q_pos: torch.Tensor
    blocks: torch.Tensor
    out_index: torch.Tensor
    slots: torch.Tensor


def build_indices(query_start_loc, seq_lens, block_table, slot_mapping, num_tokens, block_size):
    """The index tensors of the module docstring, as int64 numpy arrays,
    from vLLM's per-request metadata (host arrays)."""
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    block_table = np.asarray(block_table, dtype=np.int64)
    n = len(seq_lens)
    q_lens = qsl[1:n + 1] - qsl[:n]
    S, Q, T = bucket(n), bucket(q_lens.max(initial=1)), padded_tokens(num_tokens)
    B = bucket(-(-seq_lens.max(initial=1) // block_size))
    q_index = np.zeros((S, Q), np.int64)
    q_pos = np.zeros((S, Q), np.int64)
    out_index = np.zeros(T, np.int64)
    for s in range(n):
        ql = int(q_lens[s])
        q_index[s, :ql] = np.arange(qsl[s], qsl[s] + ql)
        q_pos[s, :ql] = np.arange(seq_lens[s] - ql, seq_lens[s])
        out_index[qsl[s]:qsl[s] + ql] = s * Q + np.arange(ql)
    blocks = np.zeros((S, B), np.int64)
    width = min(B, block_table.shape[1])
    blocks[:n, :width] = block_table[:n, :width]
    slots = np.zeros(T, np.int64)
    sm = np.asarray(slot_mapping[:num_tokens], dtype=np.int64)
    slots[:num_tokens] = np.where(sm < 0, 0, sm)
    return q_index, q_pos, blocks, out_index, slots


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.model_device = torch.device("tpu", torch.tpu.current_device())

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> TpuAttentionMetadata:
        m = common_attn_metadata
        if not (m.causal is True):
            raise NotImplementedError("torch-pjrt's vLLM attention runs causal decoder attention only")
        idx = build_indices(m.query_start_loc_cpu.numpy(), m.seq_lens.cpu().numpy(),
                            m.block_table_tensor.cpu().numpy(), m.slot_mapping.cpu().numpy(),
                            m.num_actual_tokens, self.block_size)
        dev = [torch.from_numpy(a).to(self.model_device) for a in idx]
        return TpuAttentionMetadata(m.num_actual_tokens, *dev)


class TpuAttentionImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                 kv_cache_dtype, logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None):
        if alibi_slopes is not None or sinks is not None:
            raise NotImplementedError("torch-pjrt's vLLM attention does not run ALiBi or attention sinks yet")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"torch-pjrt's vLLM attention runs decoder attention only, not {attn_type}")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(f"torch-pjrt's vLLM attention keeps the KV cache in the model's dtype; "
                                      f"kv_cache_dtype={kv_cache_dtype!r} is not supported yet")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap or None
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported by torch-pjrt's attention")
        if attn_metadata is None:  # vLLM's profiling run: no cache yet
            return output
        m = attn_metadata
        if self.kv_sharing_target_layer_name is None:
            # One write into the whole cache (keys at slot s, values at
            # slot s + the cache's slot count): the device updates a whole
            # storage in place, while a write into a slice of it (the keys'
            # half alone) copies the storage today.
            flat = kv_cache.view(-1, self.num_kv_heads, self.head_size)
            n = flat.shape[0] // 2
            flat.index_copy_(0, torch.cat([m.slots, m.slots + n]), torch.cat([key, value]))
        out = paged_attention(query, kv_cache, m.q_index, m.q_pos, m.blocks, m.out_index, self.scale,
                              self.sliding_window, self.logits_soft_cap)
        output.copy_(out)
        return output


class TpuAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return TpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return TpuAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True
