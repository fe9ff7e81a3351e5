#!/usr/bin/env python3
"""Patch an unpacked Horovod 0.28.1 sdist so it builds against today's PyTorch.

Horovod's only release predates PyTorch 2.x's C++ requirements. Every edit below must match the
sdist exactly once; if it does not, the sdist is not the one we verified and we stop rather than
build something half-patched.

    python patch_horovod.py SRC_DIR --cxx-standard 20 [--cpu-only] [--no-speed] [--list]

Each edit declares its kind (build, correctness, speed), the upstream issue or what was seen without it, and the
test that proves it (DECLARED); --list prints them, --no-speed leaves the speed edits out (docs/toolchain.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

MARK = "# patched by toolchain/patch_horovod.py"

# What each edit is for. build: Horovod 0.28.1 does not compile without it (today's PyTorch, compilers, a CPU build
# against a CUDA wheel). correctness: it compiles, and trains wrongly or fails without it. speed: it works without it,
# slower; `--no-speed` (HOROVOD_PATCH_SPEED=0 for build_horovod.sh) leaves these out, as a group.
BUILD, CORRECTNESS, SPEED = "build", "correctness", "speed"


@dataclasses.dataclass(frozen=True)
class Edit:
    path: str  # in the sdist
    old: str  # must occur `count` times
    new: str
    why: str  # what it does, one line
    kind: str  # BUILD, CORRECTNESS or SPEED
    because: str  # the upstream issue, or what was seen without it
    proof: str  # the test (or the build) that shows it
    count: int = 1


# Each edit's kind, reason and proof, by its `why`: one declaration per edit (tests/test_horovod_patch.py).
DECLARED: dict[str, tuple[str, str, str]] = {
    "top-level C++ standard": (
        BUILD,
        "Horovod sets C++14; torch >= 2.13's headers need C++17, >= 2.14 C++20",
        "the build (toolchain/bootstrap.sh, the images)",
    ),
    "PyTorch >= 2.13 headers need C++17, >= 2.14 C++20": (
        BUILD,
        "horovod/torch/CMakeLists.txt sets C++14 again for the torch extension",
        "the build (toolchain/bootstrap.sh, the images)",
    ),
    "GCC 13: group_table.h includes the <string> it uses": (
        BUILD,
        "GCC 13 on an H100 machine's image: 'string' in namespace 'std' does not name a type",
        "the GPU machine's build (docs/pytorch-gpu.md)",
    ),
    "GCC 13: common.h includes the <stdexcept> it uses": (
        BUILD,
        "GCC 13: 'logic_error' is not a member of 'std'",
        "the GPU machine's build (docs/pytorch-gpu.md)",
    ),
    "CPU-only build": (
        BUILD,
        "a CUDA torch wheel and a CUDA toolkit make the CPU build ask for cudart, which Horovod's module cannot find",
        "the CPU build (toolchain/bootstrap.sh)",
    ),
    "the build's answers read from its library (horovodrun imports no framework to learn them)": (
        SPEED,
        "horovodrun --check-build and mpi_built() import torch and TensorFlow (seconds per launch)",
        "tests/test_horovod_probe.py",
    ),
    "horovod_built_with(): the build's controllers and operations as a string in the library": (
        SPEED,
        "the string the library answers from, for the edit above",
        "tests/test_horovod_probe.py",
    ),
    "tf.functions of Horovod's TensorFlow API traced without AutoGraph": (
        SPEED,
        "AutoGraph rewrote about 180 functions per process from source (10 s of the Keras resume test here)",
        "tests/test_tensorflow.py (the Keras and TensorFlow averaging and resume tests)",
    ),
}
for _name in ("MPI", "Gloo", "NCCL", "DDL", "CCL"):
    DECLARED[f"{_name.lower()}_built: {_name} from the library, no framework imported"] = (
        SPEED,
        "each *_built() imported a framework and asked its extension",
        "tests/test_horovod_probe.py",
    )
for _why in (
    "any memory format: stage non-default layouts as contiguous copies",
    "allreduce_async: any memory format",
    "allreduce_async_: any memory format, in place",
    "grouped_allreduce_async: any memory format",
    "grouped_allreduce_async_: any memory format, in place",
    "broadcast_async: any memory format",
    "broadcast_async_: any memory format, in place",
    "synchronize: staged in-place results written back",
):
    DECLARED[_why] = (
        CORRECTNESS,
        "horovod/horovod#3491 and #3622: channels_last tensors refused, or moved in the wrong byte order",
        "tests/test_distributed.py (channels_last against contiguous references), tests/test_device_defaults.py",
    )


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


# Horovod's launcher asks which controllers and operations the build has (horovod/common/util.py: mpi_built,
# gloo_built, nccl_built, ddl_built, ccl_built) by forking a process per question that imports a framework's
# extension, TensorFlow's first: several seconds of TensorFlow for every horovodrun, a PyTorch job's included, and
# six TensorFlow imports for `horovodrun --check-build`. The compiled library knows the answers (operations.cc,
# horovod_*_built()); the patch adds them to it as one string, decided by the same preprocessor conditions, and
# util.py reads that string from the extension's file: no framework imported, no process forked. A library
# without the string (another build) is asked as before, PyTorch's extension before TensorFlow's.
# `--check-build` still imports each framework once, for its "Available Frameworks" lines (does it load).
_BUILT_WITH_CC = f"""bool horovod_ccl_built() {{
#if HAVE_CCL
  return true;
#else
  return false;
#endif
}}

// {MARK}: the answers of the horovod_*_built() above as one string in the library's
// read-only data, which horovod/common/util.py reads from the file without loading the library or a framework.
#define HOROVOD_BUILT_WITH_STR_(x) #x
#define HOROVOD_BUILT_WITH_STR(x) HOROVOD_BUILT_WITH_STR_(x)
const char* horovod_built_with() {{
  return "HOROVOD_BUILT_WITH["
#if HAVE_MPI
         "mpi=1;"
#else
         "mpi=0;"
#endif
#if HAVE_GLOO
         "gloo=1;"
#else
         "gloo=0;"
#endif
#if HAVE_NCCL
         "nccl=" HOROVOD_BUILT_WITH_STR(NCCL_VERSION_CODE) ";"
#else
         "nccl=0;"
#endif
#if HAVE_DDL
         "ddl=1;"
#else
         "ddl=0;"
#endif
#if HAVE_CCL
         "ccl=1"
#else
         "ccl=0"
#endif
         "]";
}}
"""

_BUILT_WITH_PY = f"""_BUILT_WITH = b'HOROVOD_BUILT_WITH['  {MARK}: what the build has, read from its library
# each extension's library, PyTorch's first: also the order the fallback probe imports them in (torch is cheaper)
_LIBRARIES = (('torch', 'mpi_lib_v2'), ('tensorflow', 'mpi_lib'), ('mxnet', 'mpi_lib'))


def _read_built_with(path):
    \"\"\"{{'mpi': 1, 'gloo': 1, 'nccl': 0, ...}} from the string horovod_built_with() returns, found in the
    library's file (nothing loaded), or None for a file without it. An item that is not a number is left out.\"\"\"
    import mmap
    try:
        with open(path, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            start = m.find(_BUILT_WITH)
            if start < 0:
                return None
            start += len(_BUILT_WITH)
            end = m.find(b']', start, start + 256)
            text = m[start:end].decode('ascii') if end > 0 else ''
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    built = {{}}
    for item in text.split(';'):
        name, _, value = item.partition('=')
        if value.isdigit():
            built[name] = int(value)
    return built or None


@_cache
def _built_with(verbose=False):
    horovod_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for ext_base_name, lib in _LIBRARIES:
        path = os.path.join(horovod_dir, ext_base_name, lib + get_ext_suffix())
        built = _read_built_with(path) if os.path.exists(path) else None
        if built is not None:
            if verbose:
                print('Extension {{}} was built with {{}} (read from {{}}).'.format(ext_base_name, built, path))
            return built
    return {{}}


def _built(name, verbose):
    \"\"\"The build's answer for one controller or operation (nccl: NCCL's version code), or None when no
    library has the string: then the caller probes by importing an extension.\"\"\"
    built = _built_with(verbose)
    if name not in built:
        return None
    return built[name] if name == 'nccl' else bool(built[name])


@_cache
def mpi_built(verbose=False):
"""


def _built_edit(name: str, desc: str) -> tuple:
    """util.<name>_built: the library's string first; without it, the old probe with PyTorch's extension first."""
    return (
        "horovod/common/util.py",
        f"def {name}_built(verbose=False):\n    for ext_base_name in EXTENSIONS:\n"
        f"        built_fn = lambda ext: ext.{name}_built()\n",
        f"def {name}_built(verbose=False):\n    result = _built({name!r}, verbose)  {MARK}\n"
        "    if result is not None:\n        return result\n"
        "    for ext_base_name, _ in _LIBRARIES:\n"
        f"        built_fn = lambda ext: ext.{name}_built()\n",
        f"{name}_built: {desc} from the library, no framework imported",
    )


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
            "horovod/common/group_table.h",
            "#include <mutex>\n",
            f"#include <mutex>\n#include <string>  // {MARK}\n",
            # GCC 13's libstdc++ no longer brings <string> in through these headers: "'string' in namespace 'std'
            # does not name a type" (seen building on an H100 machine's image, g++ 13.3).
            "GCC 13: group_table.h includes the <string> it uses",
        ),
        (
            "horovod/common/common.h",
            "#include <memory>\n",
            f"#include <memory>\n#include <stdexcept>  // {MARK}\n",
            # The next GCC 13 stop on the same machine: "'logic_error' is not a member of 'std'".
            "GCC 13: common.h includes the <stdexcept> it uses",
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
        (
            "horovod/common/operations.cc",
            _BUILT_WITH_CC.split("\n\n")[0] + "\n",
            _BUILT_WITH_CC,
            "horovod_built_with(): the build's controllers and operations as a string in the library",
        ),
        (
            "horovod/common/util.py",
            "@_cache\ndef mpi_built(verbose=False):\n",
            _BUILT_WITH_PY,
            "the build's answers read from its library (horovodrun imports no framework to learn them)",
        ),
        (
            "horovod/tensorflow/util.py",
            "def _make_subgraph(f):\n    return tf.function(f)\n",
            f"def _make_subgraph(f):\n    return tf.function(f, autograph=False)  {MARK}\n",
            # The gradient allreduce (DistributedGradientTape, the Keras DistributedOptimizer) and broadcast_variables
            # are built eagerly as tf.functions; AutoGraph rewrote them and everything they call from source (about
            # 180 functions per process, 10 s of a 2-core machine's Keras resume test). Their Python conditions and
            # loops are on Python values (sparse_as_dense, groups, `grad is None`); the data-dependent ones are
            # tf.cond already (_allreduce_cond), so tracing them as written builds the same graph.
            "tf.functions of Horovod's TensorFlow API traced without AutoGraph",
        ),
        *(
            _built_edit(name, desc)
            for name, desc in (("mpi", "MPI"), ("gloo", "Gloo"), ("nccl", "NCCL"), ("ddl", "DDL"), ("ccl", "CCL"))
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


def edits(cxx: int, cpu_only: bool, speed: bool = True) -> list[Edit]:
    """The edits for this build, each with its declaration; without `speed`, the speed edits left out."""
    out = []
    for rel, old, new, why, *count in _edits(cxx, cpu_only):
        kind, because, proof = DECLARED[why]
        if kind == SPEED and not speed:
            continue
        out.append(Edit(rel, old, new, why, kind, because, proof, count[0] if count else 1))
    return out


def patch(src: pathlib.Path, cxx: int, cpu_only: bool, speed: bool = True) -> list[str]:
    done = []
    for e in edits(cxx, cpu_only, speed):
        rel, old, new, why, want = e.path, e.old, e.new, f"{e.kind}: {e.why}", e.count
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
    ap.add_argument("--no-speed", action="store_true", help="leave out the speed edits (build and correctness only)")
    ap.add_argument("--list", action="store_true", help="print every edit's kind, reason and proof, patch nothing")
    args = ap.parse_args(argv)
    if args.list:
        for e in edits(args.cxx_standard, args.cpu_only, speed=not args.no_speed):
            print(f"{e.kind:<11} {e.path}: {e.why}\n            because: {e.because}\n            proof: {e.proof}")
        return 0
    for line in patch(args.src, args.cxx_standard, args.cpu_only, speed=not args.no_speed):
        print(f"patched {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
