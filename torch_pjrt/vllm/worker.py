"""vLLM worker and model runner for "tpu".

The runner is vLLM's CPU model runner: the batch's bookkeeping (input ids,
positions, block tables, sampling state) stays in host memory, where vLLM
prepares it with NumPy, and the sampler runs there on the step's logits.  The
model's weights, its KV cache and every layer of the forward pass are on
"tpu": each step moves the token ids and positions (padded to a bucket, so
the model's ops see a few shapes and compile once each) and the attention
indices to the device, and brings back the hidden states of the tokens vLLM
samples from (as logits).
"""
import contextlib
import functools

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.utils.mem_utils import format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.kv_cache_interface import AttentionSpec
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.utils import bind_kv_cache
from vllm.v1.worker.worker_base import CompilationTimes

from .attention import TpuAttentionBackend, padded_tokens

logger = init_logger("vllm.torch_pjrt")  # vLLM configures its own namespace only


def _compute_slot_mapping(table, num_reqs, query_start_loc, positions):
    """BlockTable.compute_slot_mapping on host arrays: token t of request r
    at position p goes to slot block_table[r, p // block_size] * block_size +
    p % block_size; the rest of the buffer is PAD_SLOT_ID."""
    qsl = query_start_loc[:num_reqs + 1].numpy()
    pos = positions.numpy()
    req = np.repeat(np.arange(num_reqs), np.diff(qsl))
    bs = table.block_size
    out = table.slot_mapping.np
    n = len(pos)
    out[:n] = table.block_table.np[req, pos // bs] * bs + pos % bs
    out[n:] = PAD_SLOT_ID


class TpuModelRunner(CPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        super().__init__(vllm_config, torch.device("cpu"))
        self.model_device = device
        self._host_slot_mapping()

    def may_reinitialize_input_batch(self, *args, **kwargs):
        super().may_reinitialize_input_batch(*args, **kwargs)
        self._host_slot_mapping()

    def _host_slot_mapping(self):
        # vLLM computes each token's KV-cache slot with a Triton kernel; the
        # block tables live on the host here, so NumPy computes them there.
        for table in self.input_batch.block_table.block_tables:
            table.compute_slot_mapping = functools.partial(_compute_slot_mapping, table)

    def load_model(self, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights)
        model = self.model
        dev = next(model.parameters()).device
        if dev.type != "tpu":
            raise RuntimeError(f"torch-pjrt: vLLM loaded the model onto {dev}, not tpu")
        logits = model.compute_logits

        def compute_logits(hidden_states, *args, **kwargs):
            # Rows padded to a bucket, so the head compiles once per bucket.
            n = hidden_states.shape[0]
            padded = hidden_states.new_zeros((padded_tokens(n),) + hidden_states.shape[1:])
            padded[:n] = hidden_states
            out = logits(padded.to(self.model_device), *args, **kwargs)
            return None if out is None else out[:n].cpu()

        model.compute_logits = compute_logits

    def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None,
                       **model_kwargs):
        if inputs_embeds is not None or intermediate_tensors is not None:
            raise NotImplementedError("torch-pjrt's vLLM runner takes token ids (no embeddings input, "
                                      "no pipeline parallelism) today")
        n = input_ids.shape[0]
        T = padded_tokens(n)
        ids = input_ids.new_zeros(T)
        ids[:n] = input_ids
        pos = positions.new_zeros(T)
        pos[:n] = positions
        hidden = self.model(input_ids=ids.to(self.model_device), positions=pos.to(self.model_device),
                            intermediate_tensors=None, inputs_embeds=None, **model_kwargs)
        return hidden[:n].cpu()

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes, kv_cache_allocation_context=None):
        # One contiguous tensor per layer on the device, in the shape the
        # attention backend reads (vLLM's own allocator carves all layers out
        # of one int8 buffer).
        kv_caches = {}
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if not isinstance(spec, AttentionSpec):
                raise NotImplementedError(f"torch-pjrt's vLLM runner holds attention KV caches only, not "
                                          f"{type(spec).__name__} (state-space and hybrid models are not supported)")
            shape = TpuAttentionBackend.get_kv_cache_shape(kv_cache_config.num_blocks, spec.block_size,
                                                           spec.num_kv_heads, spec.head_size)
            for name in group.layer_names:
                if name not in self.shared_kv_cache_layers:
                    kv_caches[name] = torch.zeros(shape, dtype=spec.dtype, device=self.model_device)
        for name, target in self.shared_kv_cache_layers.items():
            kv_caches[name] = kv_caches[target]
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context, self.kv_caches,
                      kv_cache_groups=kv_cache_config.kv_cache_groups)
        return kv_caches

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        for kv in {id(t): t for t in self.kv_caches}.values():
            kv[:, block_ids] = 0


class TpuWorker(Worker):
    def init_device(self):
        import torch_pjrt

        if torch_pjrt.load_error is not None:
            raise RuntimeError(f"torch-pjrt: the tpu device is not available: {torch_pjrt.load_error}")
        self.device = torch.device("cpu")  # where vLLM keeps the batch; the model is on model_device
        self.model_device = torch.device("tpu", self.local_rank)
        torch.tpu.set_device(self.model_device)
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, "gloo")
        set_random_seed(self.model_config.seed)
        self._init_workspace_and_model_runner()

    # vLLM's CUDA memory pools (sleep mode) and allocator settings: none here.
    def _maybe_get_memory_pool_context(self, tag):
        return contextlib.nullcontext()

    def _scoped_allocator_max_split(self, max_split_size_mb):
        return contextlib.nullcontext()

    def _make_model_runner(self):
        return TpuModelRunner(self.vllm_config, self.model_device)

    def determine_available_memory(self) -> int:
        """The KV cache's bytes: --kv-cache-memory-bytes if given, else the
        device's memory times --gpu-memory-utilization less what the engine
        holds (weights) and a reserve for the step's activations."""
        explicit = self.cache_config.kv_cache_memory_bytes
        free, total = torch.tpu.mem_get_info(self.model_device)
        if explicit is not None:
            if explicit > free:
                raise ValueError(f"The KV cache asked for ({format_gib(explicit)} GiB, --kv-cache-memory-bytes) "
                                 f"does not fit the free memory of {self.model_device} ({format_gib(free)} GiB)")
            return explicit
        used = torch.tpu.memory_allocated(self.model_device)
        requested = int(total * self.cache_config.gpu_memory_utilization)
        reserve = int(0.05 * requested)
        available = requested - used - reserve
        if available <= 0 or available > free:
            raise ValueError(
                f"{self.model_device} has {format_gib(free)} GiB free of {format_gib(total)} GiB; "
                f"--gpu-memory-utilization {self.cache_config.gpu_memory_utilization} asks for "
                f"{format_gib(requested)} GiB, of which the model holds {format_gib(used)} GiB. "
                "Lower --gpu-memory-utilization or set --kv-cache-memory-bytes.")
        logger.info("torch-pjrt: %s GiB for the KV cache on %s", format_gib(available), self.model_device)
        return available

    def compile_or_warm_up_model(self) -> CompilationTimes:
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def sleep(self, level: int = 1) -> None:
        logger.warning("sleep mode is not supported on tpu; ignored")

    def wake_up(self, tags=None) -> None:
        logger.warning("sleep mode is not supported on tpu; ignored")
