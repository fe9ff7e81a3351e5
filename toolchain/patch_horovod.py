#!/usr/bin/env python3
"""Patch an unpacked Horovod 0.28.1 sdist so it builds against today's PyTorch.

Horovod's only release predates PyTorch 2.x's C++ requirements. Every edit below must match the
sdist exactly once; if it does not, the sdist is not the one we verified and we stop rather than
build something half-patched.

    python patch_horovod.py SRC_DIR --cxx-standard 20 [--cpu-only]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

MARK = "# patched by toolchain/patch_horovod.py"


# Horovod refuses every tensor that is not contiguous in the default (NCHW) layout, so a channels_last model
# fails in broadcast_parameters and in every gradient hook (upstream issues 3491 and 3622). Allreduce and
# broadcast are element-wise, and the C++ side moves numel() elements from data_ptr() (adapter_v2.cc), so a
# dense tensor in any layout is reduced correctly as it lies when every rank holds the same layout (the same
# model code does), and when a new output gets the input's strides (empty_like) instead of tensor.new(shape).
_DENSE = f"""    if not _is_dense(tensor):
        raise ValueError('Tensor is required to be dense (contiguous in some memory format).')
    return function


def _is_dense(tensor):  {MARK}: any dense layout, channels_last included
    if tensor.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(tensor.shape, tensor.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True
"""


def _edits(cxx: int, cpu_only: bool) -> list[tuple]:
    """(file, old, new, why[, count]) for each edit: `old` must occur exactly `count` times (default 1)."""
    edits = [
        (
            "CMakeLists.txt",
            "set(CMAKE_CXX_STANDARD 14)\n",
            f"set(CMAKE_CXX_STANDARD {cxx})  {MARK}\n",
            # Must match the torch one: mixing standards breaks the link with a duplicate
            # gloo::rendezvous::Store::kDefaultTimeout.
            "top-level C++ standard",
        ),
        (
            "horovod/torch/CMakeLists.txt",
            "    set(CMAKE_CXX_STANDARD 14)\n",
            f"    set(CMAKE_CXX_STANDARD {cxx})  {MARK}\n",
            "PyTorch >= 2.13 headers need C++17, >= 2.14 C++20",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    if not tensor.is_contiguous():\n        raise ValueError('Tensor is required to be contiguous.')\n"
            "    return function\n",
            _DENSE,
            "dense tensors in any memory format (channels_last) pass the check",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    output = tensor.new(tensor.shape)\n",
            f"    output = torch.empty_like(tensor)  {MARK}: keeps the input's memory format\n",
            "allreduce_async and broadcast_async outputs keep the input's layout",
            2,
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    outputs = [t.new(t.shape) for t in tensors]\n",
            f"    outputs = [torch.empty_like(t) for t in tensors]  {MARK}: keeps each input's memory format\n",
            "grouped_allreduce_async outputs keep the inputs' layouts",
        ),
    ]
    if cpu_only:
        edits.append(
            (
                "cmake/Modules/FindPytorch.cmake",
                'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)\n',
                'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)\n'
                f"set(Pytorch_CUDA FALSE)  {MARK}: CPU build against a CUDA torch wheel\n",
                # A CUDA torch plus a CUDA toolkit on the machine makes Horovod ask for cudart,
                # which its bundled module cannot find; a CPU build needs neither.
                "CPU-only build",
            )
        )
    return edits


def patch(src: pathlib.Path, cxx: int, cpu_only: bool) -> list[str]:
    done = []
    for rel, old, new, why, *count in _edits(cxx, cpu_only):
        want = count[0] if count else 1
        path = src / rel
        if not path.is_file():
            raise SystemExit(f"patch_horovod: {path} is missing: is {src} an unpacked Horovod 0.28.1 sdist?")
        text = path.read_text()
        if MARK in text and new in text:
            done.append(f"{rel}: already patched ({why})")
            continue
        count = text.count(old)
        if count != want:
            raise SystemExit(
                f"patch_horovod: expected {want} of {old.strip()!r} in {path}, found {count}; "
                "this sdist is not the Horovod 0.28.1 the patch was written for"
            )
        path.write_text(text.replace(old, new))
        done.append(f"{rel}: {why}")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=pathlib.Path, help="unpacked sdist directory")
    ap.add_argument("--cxx-standard", type=int, choices=(17, 20), required=True)
    ap.add_argument("--cpu-only", action="store_true", help="ignore CUDA in the torch wheel")
    args = ap.parse_args(argv)
    for line in patch(args.src, args.cxx_standard, args.cpu_only):
        print(f"patched {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
