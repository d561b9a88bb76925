"""xtrain: train small transformer language models with an engine you can read.

The compiled core (xtrain._C) holds tensors, the caching allocator, the autodiff tape and the
CPU/CUDA kernels; this package holds what a researcher edits: the model, the optimizer wiring,
the training loop, the data pipeline and the command line.
"""
from . import _libs

_libs.preload()

from . import _C  # noqa: E402, F401
from ._C import Generator, OutOfMemoryError, Tensor  # noqa: E402
from ._C import (  # noqa: E402
    default_generator,
    empty_cache,
    get_num_threads,
    is_grad_enabled,
    manual_seed,
    memory_history,
    memory_segments,
    memory_stats,
    record_memory_history,
    reset_peak_memory_stats,
    set_grad_enabled,
    set_memory_limit,
    set_num_threads,
)
from . import tensor as _tensor_module  # noqa: E402
from .tensor import (  # noqa: E402
    arange,
    bfloat16,
    checkpoint,
    empty,
    enable_grad,
    float32,
    float64,
    from_dlpack,
    full,
    get_rng_state,
    int32,
    int64,
    no_grad,
    ones,
    rand,
    randn,
    set_rng_state,
    tensor,
    zeros,
)
from . import cuda, ops  # noqa: E402
from . import models, nn, optim  # noqa: E402
from . import _tensor_methods  # noqa: E402

_tensor_methods.install(Tensor)
Tensor.__repr__ = _tensor_module.tensor_repr

__version__ = "0.1.0"

__all__ = [
    "Tensor", "Generator", "OutOfMemoryError", "tensor", "zeros", "ones", "full", "empty", "arange", "rand",
    "randn", "from_dlpack", "no_grad", "enable_grad", "checkpoint", "manual_seed", "default_generator",
    "get_rng_state", "set_rng_state", "memory_stats", "memory_history", "memory_segments",
    "record_memory_history", "reset_peak_memory_stats", "empty_cache",
    "set_memory_limit", "get_num_threads", "set_num_threads", "is_grad_enabled", "set_grad_enabled",
    "float32", "bfloat16", "float64", "int32", "int64", "cuda", "ops", "nn", "models", "optim",
]
