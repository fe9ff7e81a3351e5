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
# fails in broadcast_parameters and in every gradient hook (upstream issues 3491 and 3622). Its C++ side moves
# numel() elements from data_ptr() (adapter_v2.cc), so the bytes of a channels_last tensor are not in the
# logical order, and ranks need not agree on layouts: broadcast_optimizer_state builds the other ranks' momentum
# from p.data.new(size) (default layout) while rank 0's comes from a channels_last checkpoint. So a tensor in
# any other layout goes through Horovod as a contiguous copy, and an in-place operation copies the result back
# into the caller's tensor in synchronize(): values are reduced in logical order whatever each rank's layout.
# One copy each way, only for tensors not already in the default layout.
_STAGING = f"""def _default_layout(tensor):  {MARK}
    return tensor if tensor.is_contiguous() else tensor.contiguous()


# handle -> the caller's tensor(s) that an in-place operation on staged copies writes back to in synchronize()
_copy_back = {{}}  {MARK}


def _allreduce_function_factory(tensor):
"""

_IN_PLACE = f"""    staged = _default_layout(tensor)  {MARK}: written back in synchronize()
    handle = _{{op}}_async(staged, staged, {{args}})
    if staged is not tensor:
        _copy_back[handle] = tensor
    return handle
"""

_GROUPED_IN_PLACE = f"""    staged = [_default_layout(t) for t in tensors]  {MARK}: written back in synchronize()
    handle = _grouped_allreduce_async(staged, staged, name, op, prescale_factor, postscale_factor, process_set)
    if any(s is not t for s, t in zip(staged, tensors)):
        _copy_back[handle] = tuple(tensors)
    return handle
"""

_SYNCHRONIZE = f"""        mpi_lib.horovod_torch_wait_and_clear(handle)
        output = _handle_map.pop(handle)[-1]
        if handle in _copy_back:  {MARK}: staged in-place results back into the caller's tensors
            target = _copy_back.pop(handle)
            if isinstance(target, tuple):
                output = tuple(t.copy_(o) for t, o in zip(target, output))
            else:
                output = target.copy_(output)
        return output
    except RuntimeError as e:
        _handle_map.pop(handle, None)
        _copy_back.pop(handle, None)
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
            "def _allreduce_function_factory(tensor):\n",
            _STAGING,
            "any memory format: stage non-default layouts as contiguous copies",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    output = tensor.new(tensor.shape)\n    return _allreduce_async(",
            f"    tensor = _default_layout(tensor)  {MARK}\n    output = tensor.new(tensor.shape)\n    return _allreduce_async(",
            "allreduce_async: any memory format",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)\n",
            _IN_PLACE.format(op="allreduce", args="name, op, prescale_factor, postscale_factor, process_set"),
            "allreduce_async_: any memory format, in place",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    outputs = [t.new(t.shape) for t in tensors]\n    return _grouped_allreduce_async(",
            f"    tensors = [_default_layout(t) for t in tensors]  {MARK}\n"
            "    outputs = [t.new(t.shape) for t in tensors]\n    return _grouped_allreduce_async(",
            "grouped_allreduce_async: any memory format",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor, process_set)\n",
            _GROUPED_IN_PLACE,
            "grouped_allreduce_async_: any memory format, in place",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    output = tensor.new(tensor.shape)\n    return _broadcast_async(",
            f"    tensor = _default_layout(tensor)  {MARK}\n    output = tensor.new(tensor.shape)\n    return _broadcast_async(",
            "broadcast_async: any memory format",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "    return _broadcast_async(tensor, tensor, root_rank, name, process_set)\n",
            _IN_PLACE.format(op="broadcast", args="root_rank, name, process_set"),
            "broadcast_async_: any memory format, in place",
        ),
        (
            "horovod/torch/mpi_ops.py",
            "        mpi_lib.horovod_torch_wait_and_clear(handle)\n        output = _handle_map.pop(handle)[-1]\n"
            "        return output\n    except RuntimeError as e:\n        _handle_map.pop(handle, None)\n",
            _SYNCHRONIZE,
            "synchronize: staged in-place results written back",
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
