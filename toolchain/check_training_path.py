#!/usr/bin/env python3
"""Run a training job's path on the CPU and fail, naming the cause, where a job would fail.

    python toolchain/check_training_path.py --framework pytorch [--require NCCL --require MPI] [--import MOD]
    python toolchain/check_training_path.py --framework tensorflow --require-libdevice

Each image's build ends with it, and CI runs it against the local .venv. `horovodrun --check-build` alone
proves only that Horovod's extensions load: an interpreter that kills every optimizer step (Python
3.11.0rc1, which lacks sys.get_int_max_str_digits that torch._dynamo calls at import) passed it. So this
check, in order:
  1. the interpreter is a released CPython 3.11 with what the frameworks call;
  2. imports every module a payload imports;
  3. takes one optimizer step of a small model in two Horovod processes (horovodrun --gloo on localhost)
     and checks that the step applied the gradient averaged over both ranks (TensorFlow: once eagerly,
     once compiled with XLA, once through Keras' fit with Horovod's DistributedOptimizer); for PyTorch also
     the payload's own step (--payload-root: payloads/ beside this script in the image): its optimizer (fused
     SGD where torch has it), channels_last, autocast (bf16 on the CPU), one checkpoint written and restored
     into a fresh optimizer on both ranks and a step after it, every fused call held to CUDA's layout rule;
  4. finds the CUDA data directory XLA needs on a GPU (libdevice, ptxas) where --require-libdevice asks, and
     the CUDA forward-compatibility driver where --cuda-compat names its folder;
  5. `horovodrun --check-build` shows the framework, Gloo and every --require'd controller and op.
All steps run and all failures are listed; the exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import tempfile

MODULES = {
    # torch._dynamo before torchvision, which imports it too: the first failure names the cause
    "pytorch": ["torch", "torch._dynamo", "torch.optim", "torchvision", "horovod.torch", "mlflow"],
    "tensorflow": ["tensorflow", "keras", "horovod.tensorflow", "horovod.tensorflow.keras", "mlflow"],
}
CHECK_BUILD_NAME = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}
# Attributes of sys the frameworks call that a pre-release 3.11 lacks: get/set_int_max_str_digits arrived
# in 3.11.0rc2 (CVE-2020-10735); torch/_dynamo/polyfills/sys.py wraps them at import under
# sys.version_info >= (3, 11), and torch/optim/optimizer.py imports torch._dynamo in every step().
SYS_NEEDS = ["get_int_max_str_digits", "set_int_max_str_digits"]
LIBDEVICE = "nvvm/libdevice/libdevice.10.bc"
XLA_DIR_FLAG = "--xla_gpu_cuda_data_dir="
LR = 0.1


def check_interpreter(version_info=sys.version_info, sys_module=sys) -> list[str]:
    problems = []
    if tuple(version_info[:2]) != (3, 11):
        problems.append(
            f"Python {'.'.join(map(str, version_info[:3]))}: the pins (TensorFlow 2.15 stops at 3.11) need CPython 3.11"
        )
    if version_info.releaselevel != "final":
        problems.append(
            f"Python {'.'.join(map(str, version_info[:3]))}{version_info.releaselevel} is a pre-release "
            "(Ubuntu 22.04's apt python3.11 is 3.11.0~rc1): install a released CPython 3.11 "
            "(images/*/Dockerfile take a pinned python-build-standalone build)"
        )
    missing = [name for name in SYS_NEEDS if not hasattr(sys_module, name)]
    if missing:
        problems.append(
            f"this interpreter lacks sys.{', sys.'.join(missing)} (added in CPython 3.11.0rc2): "
            "torch._dynamo calls it at import and every optimizer step imports torch._dynamo, so "
            "every training job would die with AttributeError; install a released CPython 3.11"
        )
    return problems


def check_imports(modules: list[str]) -> list[str]:
    problems = []
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - any failure to import is what this reports
            problems.append(f"import {name}: {type(e).__name__}: {e}")
    return problems


def xla_cuda_data_dir(environ=os.environ) -> str | None:
    for item in environ.get("XLA_FLAGS", "").split():
        if item.startswith(XLA_DIR_FLAG):
            return item[len(XLA_DIR_FLAG) :]
    return None


def check_libdevice(environ=os.environ) -> list[str]:
    """XLA compiles GPU kernels with libdevice and ptxas from --xla_gpu_cuda_data_dir (XLA's
    cuda_libdevice_path.cc looks for <dir>/nvvm/libdevice/libdevice.10.bc and <dir>/bin/ptxas)."""
    where = xla_cuda_data_dir(environ)
    if where is None:
        return [
            f"XLA_FLAGS does not set {XLA_DIR_FLAG}<dir>: TensorFlow's --xla jobs on a GPU would look for "
            "libdevice in /usr/local/cuda, which the image does not have; set XLA_FLAGS in the Dockerfile to "
            "the nvidia-cuda-nvcc wheel's folder (site-packages/nvidia/cuda_nvcc)"
        ]
    problems = []
    if not (pathlib.Path(where) / LIBDEVICE).is_file():
        problems.append(
            f"{where}/{LIBDEVICE} is missing: XLA on a GPU fails with 'libdevice not found'; install "
            "the nvidia-cuda-nvcc wheel (tensorflow[and-cuda]) or point XLA_FLAGS at a CUDA toolkit"
        )
    ptxas = pathlib.Path(where) / "bin" / "ptxas"
    try:
        out = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            problems.append(f"{ptxas} --version exited {out.returncode}: {out.stderr.strip()[-300:]}")
    except OSError as e:
        problems.append(f"{ptxas} does not run ({e}): XLA on a GPU needs ptxas to compile its kernels")
    return problems


# Driver branch each CUDA major needs natively (NVIDIA, "CUDA Compatibility"): the forward-compatibility
# driver must be of at least this branch to serve the image's CUDA on older hosts.
CUDA_DRIVER_BRANCH = {13: 580, 12: 525}


def check_cuda_compat(compat_dir: str, cuda: str | None) -> list[str]:
    """The forward-compatibility driver (images/cuda_forward_compat.py) is there, serves the framework's CUDA,
    and the start-up hook that loads it is installed."""
    try:
        names = os.listdir(compat_dir)
    except OSError as e:
        return [f"{compat_dir}: {e}: copy cuda-compat from the CUDA build stage"]
    versions = [m.group(1) for n in names if (m := re.fullmatch(r"libcuda\.so\.(\d+)\.\d+(?:\.\d+)?", n))]
    problems = []
    need = CUDA_DRIVER_BRANCH.get(int(str(cuda).split(".")[0])) if cuda and str(cuda)[0].isdigit() else None
    if not versions:
        problems.append(f"{compat_dir} has no libcuda.so.<driver version>: no forward-compatibility driver")
    elif need is None:
        problems.append(f"the framework reports CUDA {cuda}: no driver branch known for it")
    elif max(int(v) for v in versions) < need:
        problems.append(
            f"{compat_dir} holds driver branch {max(int(v) for v in versions)}, older than CUDA {cuda} needs ({need})"
        )
    if importlib.util.find_spec("cuda_forward_compat") is None:
        problems.append(
            "cuda_forward_compat is not importable: the start-up hook (a .pth in site-packages) that "
            "loads the forward-compatibility driver is missing"
        )
    return problems


def marked(check_build: str) -> set[str]:
    return set(re.findall(r"\[X\] ([A-Za-z]+)", check_build))


def check_build(framework: str, require: list[str], horovodrun: str, timeout: float = 900) -> list[str]:
    try:
        out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"horovodrun --check-build: {e}"]
    if out.returncode != 0:
        return [f"horovodrun --check-build exited {out.returncode}: {(out.stdout + out.stderr).strip()[-1500:]}"]
    have = marked(out.stdout)
    want = [CHECK_BUILD_NAME[framework], "Gloo", *require]
    lacking = [name for name in want if name not in have]
    return (
        [f"Horovod was built without {', '.join(lacking)} (horovodrun --check-build):\n{out.stdout}"] if lacking else []
    )


def first_errors(text: str, most: int = 5) -> str:
    """The ranks' own exceptions, which the tail hides behind the other ranks' shutdown messages."""
    seen: list[str] = []
    for line in text.splitlines():
        if re.search(r"\b\w*(Error|Exception)\b: ", line) and not re.search(
            r"HorovodInternalError|Horovod detected", line
        ):
            if line not in seen:
                seen.append(line)
    return "".join(f"cause: {line}\n" for line in seen[:most])


# The folder check_step made for the payload step's checkpoint, shared by both ranks.
CHECKPOINT_DIR_ENV = "CHECK_TRAINING_PATH_DIR"


def check_step(framework: str, horovodrun: str, timeout: float, payload_root: pathlib.Path = None) -> list[str]:
    env = dict(os.environ)
    root = payload_root or PAYLOAD_ROOT
    if framework == "pytorch" and not (root / "payloads" / "pytorch").is_dir():
        return [f"{root} holds no payloads/pytorch: pass --payload-root, the folder that holds payloads/"]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "60")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, as at build time, also where a build machine has a GPU
    cmd = [
        horovodrun,
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        framework,
    ]
    # The ranks' checkpoint folder belongs to this process: removed once horovodrun has ended, however the step
    # ended (a rank that fails cannot safely remove what the other rank may still be reading). After a timeout a rank
    # may outlive horovodrun, fail the removal (ignored) or make the folder again: only that case can leave one.
    with tempfile.TemporaryDirectory(prefix="check-", ignore_cleanup_errors=True) as folder:
        env[CHECKPOINT_DIR_ENV] = folder
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return [f"the two-process {framework} step did not finish in {timeout:.0f} s"]
    text = out.stdout + out.stderr
    done = re.findall(r"step ok: (\S+)", text)
    if out.returncode != 0 or len(done) < 2 * len(WORKER_STEPS[framework]):
        return [
            f"the two-process {framework} optimizer step failed (exit {out.returncode}):\n"
            f"{first_errors(text)}{text.strip()[-3000:]}"
        ]
    print(f"[check] steps on both ranks: {', '.join(sorted(set(done)))}", flush=True)
    return []


# ---- worker side: runs under horovodrun, one process per rank ----


def _close(a, b, what: str) -> None:
    import numpy as np

    if not np.allclose(a, b, rtol=1e-4, atol=1e-6):
        raise AssertionError(f"{what}: got {np.ravel(a)[:4]}, expected {np.ravel(b)[:4]}")


def worker_pytorch() -> list[str]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(0)  # the same initial weights on both ranks; broadcast anyway, as the payloads do
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2)
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(100 + hvd.rank())  # different data on each rank
    x, y = torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 2, (4,), generator=gen)

    before = [p.detach().clone() for p in model.parameters()]
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    local = [p.grad.detach().clone() for p in model.parameters()]
    expected = [
        b - LR * hvd.allreduce(g, op=hvd.Average, name=f"expected.{i}") for i, (b, g) in enumerate(zip(before, local))
    ]
    if hvd.size() > 1 and all(
        torch.allclose(g, hvd.allreduce(g, op=hvd.Average, name=f"avg.{i}")) for i, g in enumerate(local)
    ):
        raise AssertionError("both ranks computed the same gradient: the check would not see averaging")

    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters(), op=hvd.Average
    )
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()  # torch.optim imports torch._dynamo here: what a 3.11 pre-release broke
    for p, e in zip(model.parameters(), expected):
        _close(p.detach().numpy(), e.numpy(), "PyTorch SGD step with Horovod's averaged gradient")
    return ["pytorch-sgd"]


def _hold_fused_sgd_to_cuda_rule(torch, runtime) -> list[int]:
    """torch._fused_sgd_ refusing what CUDA's kernel refuses (runtime.fused_layout_problem); the CPU kernel
    does not check. Returns the list whose first item counts the checked calls."""
    calls = [0]
    real = torch._fused_sgd_

    def checked(params, grads, bufs, *args, **kwargs):
        problem = runtime.fused_layout_problem(params, grads, bufs)
        if problem:
            raise AssertionError(f"CUDA's fused SGD would refuse this step: {problem}")
        calls[0] += 1
        return real(params, grads, bufs, *args, **kwargs)

    torch._fused_sgd_ = checked
    return calls


def worker_pytorch_payload() -> list[str]:
    """The payload's pieces, as a GPU job runs them (payloads.pytorch: backends, runtime, precision)."""
    import torch

    from payloads.common import config
    from payloads.pytorch import backends, checkpoints, models, precision, runtime

    backend = backends.Horovod()
    backend.init()
    calls = _hold_fused_sgd_to_cuda_rule(torch, runtime)
    cfg = config.TrainConfig(
        output_dir=pathlib.Path(os.environ[CHECKPOINT_DIR_ENV]), batch_size=4, channels_last=True, amp=True
    )
    cpu = torch.device("cpu")
    prec = precision.choose(cpu, True, "bf16", False)
    gen = torch.Generator().manual_seed(100 + backend.rank())
    x = torch.randn(4, 3, 8, 8, generator=gen).to(memory_format=torch.channels_last)
    y = torch.randint(0, 2, (4,), generator=gen)

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.Conv2d(4, 4, 1),  # a 1x1 kernel: strides that differ only in size-1 dimensions
            torch.nn.Flatten(),
            torch.nn.Linear(4 * 6 * 6, 2),
        ).to(memory_format=torch.channels_last)
        return backend.wrap(model, runtime.optimizer(cfg, model, LR, cpu), cfg, cpu)

    def step(model, opt):
        opt.zero_grad()
        with prec.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        runtime.optimizer_step(opt, None, backend)

    model, opt = build()
    with prec.autocast():
        if model[0](x).dtype != torch.bfloat16:
            raise AssertionError("autocast did not run the convolution in bf16 on the CPU")
    backend.broadcast_parameters(model.state_dict())
    step(model, opt)
    checkpoints.save(cfg, backend, 1, model, opt, None)
    fresh, fresh_opt = build()
    if checkpoints.restore(cfg, backend, fresh, fresh_opt, None) != (1, 0):  # (epochs done, step in the next)
        raise AssertionError("the checkpoint was not restored")
    step(fresh, fresh_opt)
    digests = backend.allgather_object(models.parameters_digest(fresh), "digests")  # also: both ranks are done
    if len(set(digests)) != 1:
        raise AssertionError(f"ranks differ after a step on the restored optimizer: {digests}")
    fused = all(g.get("fused") for g in fresh_opt.param_groups)  # Horovod's wrapper keeps the groups' options
    groups = len(fresh_opt.param_groups)  # one fused call per group and step (decayed, not decayed)
    if fused and calls[0] != 2 * groups:
        raise AssertionError(
            f"fused SGD ran {calls[0]} times, expected {2 * groups} (a step, then one after the restore, per group)"
        )
    return ["pytorch-payload" + ("-fused" if fused else "")]


def worker_tensorflow() -> list[str]:
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_keras
    import numpy as np
    import tensorflow as tf

    hvd.init()
    done = []

    def model():
        tf.keras.utils.set_random_seed(0)
        m = tf.keras.Sequential(
            [
                tf.keras.layers.Conv2D(4, 3, activation="relu", input_shape=(8, 8, 3)),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(2),
            ]
        )
        hvd.broadcast_variables(m.variables, root_rank=0)
        return m

    rng = np.random.default_rng(100 + hvd.rank())
    x = rng.standard_normal((4, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 2, 4)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def expected_after_step(m):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x, training=True))
        local = tape.gradient(loss, m.trainable_variables)
        return [v.numpy() - LR * hvd.allreduce(g, op=hvd.Average).numpy() for v, g in zip(m.trainable_variables, local)]

    # the custom loop (payloads/tensorflow): DistributedGradientTape in a tf.function, as the payload runs it
    m = model()
    expected = expected_after_step(m)
    opt = tf.keras.optimizers.SGD(LR)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x, training=True))
        tape = hvd.DistributedGradientTape(tape, op=hvd.Average)
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))

    step()
    for v, e in zip(m.trainable_variables, expected):
        _close(v.numpy(), e, "TensorFlow step with Horovod's averaged gradient")
    done.append("tensorflow-tape")

    # --xla: XLA compiles the model's forward and backward (the payload's auto-clustering leaves Horovod's
    # collectives to TensorFlow: they have no XLA kernels), Horovod averages the gradients outside
    m = model()
    expected = expected_after_step(m)
    opt = tf.keras.optimizers.SGD(LR)

    @tf.function(jit_compile=True)
    def compiled_gradients():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x, training=True))
        return tape.gradient(loss, m.trainable_variables)

    grads = [hvd.allreduce(g, op=hvd.Average, name=f"xla.{i}") for i, g in enumerate(compiled_gradients())]
    opt.apply_gradients(zip(grads, m.trainable_variables))
    for v, e in zip(m.trainable_variables, expected):
        _close(v.numpy(), e, "TensorFlow step compiled with XLA, Horovod's averaged gradient")
    done.append("tensorflow-xla")

    # the Keras payload: model.fit with Horovod's DistributedOptimizer
    m = model()
    expected = expected_after_step(m)
    m.compile(optimizer=hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(LR)), loss=loss_fn)
    m.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    for v, e in zip(m.trainable_variables, expected):
        _close(v.numpy(), e, "Keras fit step with Horovod's DistributedOptimizer")
    done.append("keras-fit")
    return done


def worker_pytorch_all() -> list[str]:
    return worker_pytorch() + worker_pytorch_payload()


WORKER_STEPS = {
    "pytorch": ["pytorch-sgd", "pytorch-payload"],
    "tensorflow": ["tensorflow-tape", "tensorflow-xla", "keras-fit"],
}
WORKERS = {"pytorch": worker_pytorch_all, "tensorflow": worker_tensorflow}
# The folder that holds payloads/: the repository here, /opt/checks in the images (their Dockerfiles copy it).
PAYLOAD_ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--framework", choices=sorted(MODULES))
    ap.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="NAME",
        help="a controller or op `horovodrun --check-build` must mark (MPI, NCCL); Gloo always",
    )
    ap.add_argument(
        "--import",
        dest="extra",
        action="append",
        default=[],
        metavar="MODULE",
        help="another module the image's jobs import (azureml.mlflow)",
    )
    ap.add_argument(
        "--require-libdevice",
        action="store_true",
        help="XLA_FLAGS must name a CUDA data dir with libdevice and ptxas (TensorFlow GPU image)",
    )
    ap.add_argument(
        "--cuda-compat",
        metavar="DIR",
        help="the forward-compatibility driver's folder must serve torch's CUDA (PyTorch GPU image)",
    )
    ap.add_argument(
        "--payload-root",
        type=pathlib.Path,
        default=PAYLOAD_ROOT,
        help="the folder that holds payloads/ (PyTorch: the payload's own step is checked)",
    )
    ap.add_argument("--step-timeout", type=float, default=600)
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        for name in WORKERS[args.worker]():
            print(f"step ok: {name}", flush=True)
        return 0
    if not args.framework:
        ap.error("--framework is required")

    horovodrun = str(pathlib.Path(sys.executable).with_name("horovodrun"))
    print(f"[check] Python {sys.version.split()[0]} ({sys.version_info.releaselevel}) at {sys.executable}", flush=True)
    steps = [
        ("interpreter", lambda: check_interpreter()),
        ("imports", lambda: check_imports(MODULES[args.framework] + args.extra)),
    ]
    failed: list[str] = []
    for name, run in steps:
        problems = run()
        failed += [f"{name}: {p}" for p in problems]
        print(f"[check] {name}: {'FAILED' if problems else 'ok'}", flush=True)
    if any(f.startswith("imports:") for f in failed):
        failed.append("step: not tried, the imports failed")
    else:
        problems = check_step(args.framework, horovodrun, args.step_timeout, args.payload_root)
        failed += [f"step: {p}" for p in problems]
        print(f"[check] two-process optimizer step: {'FAILED' if problems else 'ok'}", flush=True)
    if args.require_libdevice:
        problems = check_libdevice()
        failed += [f"libdevice: {p}" for p in problems]
        print(f"[check] XLA CUDA data dir ({xla_cuda_data_dir()}): {'FAILED' if problems else 'ok'}", flush=True)
    if args.cuda_compat:
        cuda = None
        if not any(f.startswith("imports:") for f in failed):
            import torch

            cuda = torch.version.cuda
        problems = check_cuda_compat(args.cuda_compat, cuda)
        failed += [f"cuda forward compatibility: {p}" for p in problems]
        print(
            f"[check] CUDA forward compatibility ({args.cuda_compat}, CUDA {cuda}): {'FAILED' if problems else 'ok'}",
            flush=True,
        )
    problems = check_build(args.framework, args.require, horovodrun)
    failed += [f"horovod build: {p}" for p in problems]
    print(
        f"[check] horovodrun --check-build ({', '.join([CHECK_BUILD_NAME[args.framework], 'Gloo', *args.require])}): "
        f"{'FAILED' if problems else 'ok'}",
        flush=True,
    )

    if failed:
        print(f"[check] the {args.framework} training path FAILED:", file=sys.stderr)
        for f in failed:
            print(f"  - {f}", file=sys.stderr)
        return 1
    print(f"[check] the {args.framework} training path works on this machine's CPU", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
