"""vLLM on "tpu": an out-of-tree vLLM platform (the `vllm.platform_plugins`
entry point of torch-pjrt).

vLLM's engine, scheduler, KV-cache manager, sampler and OpenAI server run
unchanged; this package supplies what a platform supplies: the platform class
(platform.py), a worker and model runner that run the model on "tpu"
(worker.py), and an attention backend that reads vLLM's paged KV cache on the
device (attention.py).  Nothing here is imported unless vLLM is installed and
asks for its platform plugins.
"""


def register():
    """vLLM's platform-plugin hook: the platform's qualified name when the
    "tpu" device is usable, else None (vLLM then detects its own platforms)."""
    import logging

    import torch_pjrt

    if torch_pjrt.load_error is not None:
        logging.getLogger("vllm").info("torch-pjrt: the tpu platform is not active: %s", torch_pjrt.load_error)
        return None
    return "torch_pjrt.vllm.platform.TpuPlatform"
