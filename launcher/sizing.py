"""Per-process batch and data-loader workers of a job, from the cluster's VM size (one home: the catalog).

Job files write `--batch-size <<batch_size>>` and `--workers <<workers>>`; the launcher fills them for the
chosen cluster (or for this machine, on the local target). A user's own --batch-size, --global-batch-size or
--workers after `--` replaces the job file's flag instead of following it (the payloads refuse
--batch-size together with --global-batch-size). The payloads derive their default learning rate from the
batch they are given, so the batch is all the launcher passes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from azureaccess.errors import JobError

BATCH = "<<batch_size>>"
WORKERS = "<<workers>>"
SAMPLES = "<<synthetic_samples>>"
# placeholder -> (the payload flag it must follow, the user flags after `--` that replace that flag)
FLAGS = {
    BATCH: ("--batch-size", ("--batch-size", "--global-batch-size")),
    WORKERS: ("--workers", ("--workers",)),
    SAMPLES: ("--synthetic-samples", ("--synthetic-samples",)),
}

# Synthetic throughput jobs time at least this many steady-state steps on every rank, whatever the node count:
# a fixed sample count gives 8 GPUs about 53 steps at batch 256 and 16 GPUs 22, a few seconds in which one
# checkpoint or the first NCCL call moves the figure by percents.
STEADY_STEPS = 300
DEFAULT_STARTUP_STEPS = 10  # payloads/common/config.py, TrainConfig.startup_steps

# Per-GPU batch of ResNet-50 in NVIDIA's reference runs (NVIDIA/DeepLearningExamples,
# PyTorch/Classification/ConvNets/configs.yml, resnet50): with AMP and NHWC (channels_last, as the payloads
# run on GPUs) 256 on the 16 GB V100 (DGX1V) and T4 as on the 80 GB A100 (DGXA100); in FP32 112 on the
# 16 GB V100 (128 on the T4). Per GiB of GPU memory: 256 / 16 = 16 images with AMP, 112 / 16 = 7 in FP32,
# the tighter of the two 16 GB figures. Above 256 per GPU NVIDIA grows the global batch with more GPUs, not
# a larger per-GPU one; the LR follows the global batch (the payloads: 0.1 x global / 256, Goyal et al.).
REFERENCE_BATCH = 256
IMAGES_PER_GIB = {"amp": 16, "fp32": 7}

# CPU sizes and the local target: the payloads' own default per-process batch
# (payloads/common/config.py, TrainConfig.batch_size); these runs are smoke runs of the GPU jobs.
CPU_BATCH = 32

# NVIDIA's reference uses 8 loader workers per GPU on DGX-1 (10 vCPUs per GPU) and 16 on DGX A100 (32 per
# GPU) (configs.yml, platform.*.workers): no more than 16 here, and one vCPU per process stays free for the
# training thread (the Horovod background thread shares it).
MAX_WORKERS = 16


# The PyTorch payload's loader keeps prefetch_factor=4 batches per worker in flight (payloads/pytorch/inputs.py,
# FolderLoader), each a uint8 tensor in /dev/shm (normalised to float only on the device): per node, processes x workers x 4 batches must fit the job's
# shm_size. The share kept back covers pinned-memory staging and the payload's own use.
PREFETCH = 4
SHM_SHARE = 0.8
DEFAULT_IMAGE_SIZE = 224  # payloads/common/config.py, TrainConfig.image_size
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30}  # Docker's --shm-size units


@dataclass(frozen=True)
class Sizing:
    batch_size: int
    workers: int
    basis: str  # one line: where the numbers come from (the job's `sizing` tag)
    synthetic_samples: int = 0  # per epoch, whole job (timed_samples)


def gpu_batch(gpu_memory_gib: float, precision: str = "amp") -> int:
    """Largest multiple of 8 that fits NVIDIA's images per GiB, capped at NVIDIA's 256."""
    per_gib = IMAGES_PER_GIB[precision]
    return max(8, min(REFERENCE_BATCH, int(gpu_memory_gib * per_gib) // 8 * 8))


def workers_for(vcpus_per_process: int) -> int:
    return max(0, min(MAX_WORKERS, vcpus_per_process - 1))


def _precision(extra_args: list[str]) -> str:
    return "fp32" if "--no-amp" in extra_args else "amp"


def for_cluster(target, arguments: list[str] = ()) -> Sizing:
    """`target`: the submission's (launcher/target.py); `arguments`: the payload's (--no-amp: FP32 batch)."""
    size, processes_per_node = target.size, target.processes_per_node
    if size is None:
        raise JobError(
            f"cluster VM size {target.vm_size} is not in the VM-size catalog "
            "(infra/trainingplatform/vm_sizes.py): add it there, or pass --batch-size and --workers "
            "after `--`"
        )
    vcpus = size.vcpus // processes_per_node
    if size.gpus:
        precision = _precision(list(arguments))
        batch = gpu_batch(size.gpu_memory_gib, precision)
        basis = (
            f"{size.name}: {size.gpu_memory_gib} GiB {size.gpu_model}, {precision.upper()} -> batch {batch}; "
            f"{size.vcpus} vCPUs / {processes_per_node} processes -> {workers_for(vcpus)} workers"
        )
    else:
        batch = CPU_BATCH
        basis = (
            f"{size.name}: CPU size -> batch {batch}; {size.vcpus} vCPUs / {processes_per_node} processes "
            f"-> {workers_for(vcpus)} workers"
        )
    return Sizing(batch, workers_for(vcpus), basis)


def for_local(processes: int, cpus: int | None = None) -> Sizing:
    """This machine on the local target: the CPU batch; workers from its cores per process."""
    cpus = cpus or os.cpu_count() or 1
    workers = workers_for(cpus // max(1, processes))
    return Sizing(CPU_BATCH, workers, f"this machine: {cpus} CPUs / {processes} processes -> {workers} workers")


def shm_bytes(shm_size: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([bkmg]?)\s*", str(shm_size).lower())
    if not m:
        raise JobError(f"resources.shm_size {shm_size!r}: expected a size such as 32g or 512m")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _last(args: list[str], flag: str) -> str | None:
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found if found is not None and found.isdigit() else None


def _per_process_batch(fit: Sizing, processes: int, args: list[str]) -> int:
    batch = _last(args, "--batch-size")
    glob = _last(args, "--global-batch-size")
    return int(batch) if batch else (int(glob) // max(1, processes) if glob else fit.batch_size)


def with_timed_samples(fit: Sizing, processes: int, args: list[str]) -> Sizing:
    """`fit` with the synthetic sample count that gives every rank STEADY_STEPS steps after its start-up steps
    (`args`: the payload's, overrides last): processes x batch x backward passes x (start-up + STEADY_STEPS)."""
    per_process = _per_process_batch(fit, processes, args)
    passes = int(_last(args, "--backward-passes-per-step") or 1)
    startup = int(_last(args, "--startup-steps") or DEFAULT_STARTUP_STEPS)
    samples = processes * per_process * passes * (startup + STEADY_STEPS)
    basis = f"{fit.basis}; {samples} synthetic samples: {STEADY_STEPS} timed steps per rank after {startup}"
    return replace(fit, synthetic_samples=samples, basis=basis)


def within_shm(fit: Sizing, shm_size: str, processes_per_node: int, processes: int, args: list[str]) -> Sizing:
    """`fit` with no more workers than the job's /dev/shm holds (`args`: the payload's, overrides last); a
    user's --workers beyond it is refused, with the fix, before anything is submitted."""
    per_process = _per_process_batch(fit, processes, args)
    image = int(_last(args, "--image-size") or DEFAULT_IMAGE_SIZE)
    per_worker = processes_per_node * PREFETCH * per_process * 3 * image * image  # uint8: a byte a value
    limit = int(shm_bytes(shm_size) * SHM_SHARE // per_worker)
    given = _last(args, "--workers")
    if given is not None and int(given) > limit:
        raise JobError(
            f"--workers {given}: {processes_per_node} processes x {given} workers x {PREFETCH} prefetched "
            f"batches of {per_process} images of {image} px need {int(given) * per_worker / 2**30:.0f} "
            f"GiB of /dev/shm, the job has shm_size {shm_size}: use --workers {limit} or fewer, a smaller "
            "--batch-size, or raise resources.shm_size in the job file"
        )
    if fit.workers > limit:
        return replace(fit, workers=limit, basis=f"{fit.basis}, {limit} within shm_size {shm_size}")
    return fit


def _flag_given(extra_args: list[str], flags: tuple[str, ...]) -> bool:
    return any(a == f or a.startswith(f + "=") for a in extra_args for f in flags)


def check_template(command: str, source) -> None:
    """A placeholder only right after its flag (`--batch-size <<batch_size>>`), so that an override can
    replace the pair; anything else is a job-file error."""
    for token, (flag, _) in FLAGS.items():
        uses = command.count(token)
        proper = len(re.findall(rf"{re.escape(flag)}[ =]{re.escape(token)}", command))
        if uses != proper:
            raise JobError(
                f"{source}: {token} must follow {flag} (write `{flag} {token}` in the command), "
                f"found it {uses - proper} time(s) elsewhere"
            )


def apply(command: str, sizing: Sizing, extra_args: list[str]) -> str:
    """The command with the placeholders filled, or with their flag removed where the user passes it."""
    for token, (flag, overrides) in FLAGS.items():
        pair = re.compile(rf"\s*{re.escape(flag)}[ =]{re.escape(token)}")
        if _flag_given(extra_args, overrides):
            command = pair.sub("", command)
        else:
            value = {BATCH: sizing.batch_size, WORKERS: sizing.workers, SAMPLES: sizing.synthetic_samples}[token]
            command = pair.sub(lambda m, token=token, value=value: m.group(0).replace(token, str(value)), command)
    return command


def uses_placeholders(command: str) -> bool:
    return any(token in command for token in FLAGS)
