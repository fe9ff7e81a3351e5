"""CUDA's fused SGD rule on the CPU, for every Python process started with this folder on PYTHONPATH (site imports
sitecustomize at start-up) and FUSED_SGD_STRIDE_CHECK set.

On CUDA, torch._fused_sgd_ refuses parameter, gradient and momentum lists whose tensors differ in dtype, device,
size or strides, dimensions of size 1 aside (FusedSgdKernel.cu, check_fast_path_restrictions in
ATen/native/ForeachUtils.h); the CPU kernel runs them. Here torch._fused_sgd_ is wrapped with the same rule
(payloads.pytorch.runtime.fused_layout_problem), so a CPU run dies where a GPU run would.

Each process that checked a call writes, at exit, a file named for its pid in $FUSED_SGD_STRIDE_LOG (when set)
with the number of fused SGD calls it checked, so a test can show that the fused kernel really ran under it."""

import atexit
import os
import sys

CALLS = [0]


def wrap(torch) -> None:
    real = torch._fused_sgd_

    def checked(params, grads, momentum_buffer_list, *args, **kwargs):
        from payloads.pytorch.runtime import fused_layout_problem  # late: torch.optim.sgd is still importing

        problem = fused_layout_problem(params, grads, momentum_buffer_list)
        if problem:
            raise RuntimeError(f"{problem} (tests/gpu_rules: the CUDA kernel's check)")
        CALLS[0] += 1
        return real(params, grads, momentum_buffer_list, *args, **kwargs)

    torch._fused_sgd_ = checked


def report() -> None:
    folder = os.environ.get("FUSED_SGD_STRIDE_LOG")
    if folder and CALLS[0]:
        with open(os.path.join(folder, str(os.getpid())), "w") as f:
            f.write(str(CALLS[0]))


if os.environ.get("FUSED_SGD_STRIDE_CHECK"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: import_hooks
    from import_hooks import after_import

    sys.path.pop(0)
    # torch is not imported here, so horovodrun's own process does not pay for it.
    after_import("torch.optim.sgd", lambda sgd: wrap(sys.modules["torch"]))
    atexit.register(report)
