"""The vLLM platform for the "tpu" device (see __init__.py)."""
import os

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

logger = init_logger("vllm.torch_pjrt")  # vLLM configures its own namespace only

# What this platform decides for vLLM's configuration, and why:
# - The model runs eagerly on "tpu", each op one cached XLA program, with
#   token counts padded to a few buckets (worker.py) so a run compiles a
#   bounded set of programs.  vLLM's own torch.compile integration and CUDA
#   graphs are off: the first wants Inductor or a backend that takes
#   symbolic shapes, the second is CUDA's.
# - The scheduler is synchronous (async scheduling overlaps CUDA streams).
# - Engine and worker processes are spawned, not forked.
# - KV-cache blocks of 16 tokens unless the user sets --block-size.
DEFAULT_BLOCK_SIZE = 16


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "gloo"
    device_control_env_var: str = "TORCH_PJRT_VISIBLE_DEVICES"
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.tpu.mem_get_info(device_id)[1]

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("torch-pjrt's vLLM platform does not run MLA or sparse attention yet; "
                                      "models with standard (multi-head or grouped-query) attention work")
        return "torch_pjrt.vllm.attention.TpuAttentionBackend"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        import torch_pjrt

        parallel = vllm_config.parallel_config
        if parallel.world_size > 1:
            raise ValueError("torch-pjrt's vLLM platform runs one device per engine today "
                             f"(tensor/pipeline parallel size {parallel.world_size} requested); "
                             "use data parallel replicas instead")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = "torch_pjrt.vllm.worker.TpuWorker"
        cache = vllm_config.cache_config
        if not cache.user_specified_block_size:
            cache.block_size = DEFAULT_BLOCK_SIZE
        comp = vllm_config.compilation_config
        comp.mode = CompilationMode.NONE
        comp.cudagraph_mode = CUDAGraphMode.NONE
        comp.cudagraph_capture_sizes = []
        if vllm_config.model_config is not None:
            vllm_config.model_config.enforce_eager = True
        vllm_config.scheduler_config.async_scheduling = False
        # The device's runtime cannot cross a fork (this process opened it to
        # detect the platform): vLLM's engine and workers are spawned.
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        info = torch_pjrt._C.info()
        logger.info("torch-pjrt: vLLM runs on \"tpu\": %s, XLA %s", cls.get_device_name(0), info["xla_version"])

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        if quant is not None:
            raise ValueError(f"torch-pjrt's vLLM platform does not run {quant!r}-quantized checkpoints yet")
