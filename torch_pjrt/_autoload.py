"""PyTorch's device-backend autoload calls load() at the end of `import torch`
(the `torch.backends` entry point in pyproject.toml).

Importing this module imports the package, which does the work.  It is a
module of its own so that `import torch_pjrt` before `import torch` works
too: torch then autoloads while torch_pjrt is still half imported, and finds
this module's load() without needing the package's names.
"""


def load():
    import torch_pjrt  # noqa: F401 (already imported, or half imported: it goes on after torch)
