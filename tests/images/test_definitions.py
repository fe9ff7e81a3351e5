"""The image definitions agree with the pins, the jobs and Azure ML's schema (no Docker needed)."""

import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGES = ["pytorch", "tensorflow"]


def _pin(path, package):
    m = re.search(rf"^{package}(\[[^\]]*\])?==(\S+)", (ROOT / path).read_text(), re.M)
    return m.group(2)


HOROVOD = re.search(r"^HOROVOD_VERSION=(\S+)", (ROOT / "toolchain/build_horovod.sh").read_text(), re.M).group(1)
TAGS = {
    "pytorch": f"torch{_pin('payloads/requirements.txt', 'torch')}-horovod{HOROVOD}",
    "tensorflow": f"tf{_pin('images/tensorflow/requirements.txt', 'tensorflow')}-horovod{HOROVOD}",
}


@pytest.mark.parametrize("image", IMAGES)
def test_environment_definition_validates_and_points_at_the_dockerfile(image):
    from azure.ai.ml import load_environment

    path = ROOT / "images" / image / "environment.yaml"
    env = load_environment(path)
    assert env.version == TAGS[image], "the environment version is the image tag made from the pins"
    context = (path.parent / yaml.safe_load(path.read_text())["build"]["path"]).resolve()
    assert context == ROOT
    assert (context / env.build.dockerfile_path).is_file()


@pytest.mark.parametrize("image", IMAGES)
def test_dockerfile_copies_only_what_exists_and_fights_no_platform(image):
    text = (ROOT / "images" / image / "Dockerfile").read_text()
    assert not re.search(r"^\s*(CMD|ENTRYPOINT)\b", text, re.M), "Azure ML runs the job's own command"
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for item in src.split():
            assert (ROOT / item).exists(), f"COPY {item}: not in the build context (the repository root)"
            assert not item.startswith("payloads/") or item.endswith("requirements.txt"), (
                "payload code travels with the job, not in the image"
            )
    assert "toolchain/build_horovod.sh" in text and "HOROVOD_GPU_OPERATIONS=NCCL" in text
    assert TAGS[image] in text, "the build commands in the Dockerfile name the tag made from the pins"


def test_jobs_use_their_framework_image_tag_made_from_the_pins():
    for job in (ROOT / "jobs").glob("*.yaml"):
        spec = yaml.safe_load(job.read_text())
        framework = "tensorflow" if re.search(r"payloads\.(tensorflow|keras)\.", spec["command"]) else "pytorch"
        assert spec["environment"]["image"] == f"<<registry>>/training/{framework}:{TAGS[framework]}", job.name


def test_local_tensorflow_is_the_images_tensorflow():
    """Tests run the CPU build of the very TensorFlow release the GPU image installs."""
    assert _pin("payloads/requirements-tensorflow.txt", "tensorflow-cpu") == _pin(
        "images/tensorflow/requirements.txt", "tensorflow"
    )


SHARED_BUILD = ROOT / "images/build_stage.sh"


def _commands(text: str) -> list[str]:
    """Shell or Dockerfile lines: continuation lines joined, comments and blank lines dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current)
        current = ""
    return lines


def _instructions(image: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile; a RUN of the shared build stage's script (COPY'd, then run) reads as
    the script's commands joined with &&, which is what it runs."""
    lines = _commands((ROOT / "images" / image / "Dockerfile").read_text())
    out = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "") for line in lines]
    copied = {args.split()[-1]: args.split()[0] for op, args in out if op == "COPY" and len(args.split()) == 2}
    shared = " && ".join(_commands(SHARED_BUILD.read_text())[1:])  # without `set -euo pipefail`
    return [
        ("RUN", shared) if op == "RUN" and copied.get(args.strip()) == "images/build_stage.sh" else (op, args)
        for op, args in out
    ]


def _shared_pins() -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_0-9]+)=(\S+)$", SHARED_BUILD.read_text(), re.M))


def _env(image: str) -> list[tuple[str, str]]:
    """Every KEY=VALUE the Dockerfile's ENV instructions set, in order."""
    import shlex

    pairs = []
    for op, args in _instructions(image):
        if op == "ENV":
            for item in shlex.split(args, posix=False):
                key, _, value = item.partition("=")
                pairs.append((key, value))
    return pairs


@pytest.mark.parametrize("image", IMAGES)
def test_images_set_no_interconnect_setting(image):
    """Interconnect settings depend on the VM size: the launcher sets them per cluster (issue 12, item 1).
    An image that forces OMPI_MCA_pml=ucx kills every job on a CPU or NC cluster in MPI_Init."""
    keys = [k for k, _ in _env(image)]
    assert keys, "the parser found the image's ENV"
    baked = [k for k in keys if re.match(r"(OMPI_MCA_|UCX_|NCCL_|HOROVOD_)", k)]
    assert not baked, f"{image} image sets {baked}: set them in launcher/interconnect.py, per VM size"


@pytest.mark.parametrize("image", IMAGES)
def test_library_path_extends_the_base_images(image):
    """nvidia/cuda images put the host driver's libraries on LD_LIBRARY_PATH (/usr/local/nvidia/lib64);
    replacing it hides libcuda from every process of the job."""
    for key, value in _env(image):
        if key == "LD_LIBRARY_PATH":
            assert re.search(r"\$\{?LD_LIBRARY_PATH\b", value), (
                f"{image}: LD_LIBRARY_PATH={value} replaces the base image's"
            )


@pytest.mark.parametrize("image", IMAGES)
def test_images_carry_the_topology_file_of_every_catalog_size(image):
    """Every NCCL topology file the catalog names is fetched from Azure/azhpc-images at a pinned commit into the
    folder the launcher points NCCL_TOPO_FILE at, and reaches the runtime stage."""
    from launcher import interconnect
    from trainingplatform import vm_sizes

    text = " ".join(args for _, args in _instructions(image))
    names = {s.nccl_topology for s in vm_sizes.CATALOG.values() if s.nccl_topology}
    assert names, "the catalog names topology files"
    for name in names:
        dest = f"{interconnect.TOPOLOGY_DIR}/{name}"
        fetch = re.search(rf"curl -fsSL -o {re.escape(dest)}\s+\S+/([0-9a-f]{{40}})/topology/{re.escape(name)}\b", text)
        assert fetch, f"{image} image does not fetch {name} at a pinned commit into {dest}"
    assert ("COPY", f"--from=build {interconnect.TOPOLOGY_DIR} {interconnect.TOPOLOGY_DIR}") in _instructions(image)


def _stages(image: str) -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions split at each FROM (ARGs before the first FROM dropped)."""
    stages: list[list[tuple[str, str]]] = []
    for op, args in _instructions(image):
        if op == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((op, args))
    return stages


def _runs(stage) -> str:
    return "\n".join(args for op, args in stage if op == "RUN")


def _global_args(image: str) -> dict[str, str]:
    out = {}
    for op, args in _instructions(image):
        if op == "FROM":
            break
        if op == "ARG" and "=" in args:
            key, _, value = args.partition("=")
            out[key] = value
    return out


@pytest.mark.parametrize("image", IMAGES)
def test_python_is_a_pinned_release_not_ubuntus_release_candidate(image):
    """Issue 19, item 1: jammy's apt python3.11 is 3.11.0~rc1, which lacks sys.get_int_max_str_digits (3.11.0rc2);
    torch/_dynamo/polyfills/sys.py calls it at import and torch/optim/optimizer.py imports torch._dynamo in every
    step(). The images take a python-build-standalone build pinned by release tag and sha256 instead."""
    args = _shared_pins()
    assert re.fullmatch(
        r"https://github\.com/astral-sh/python-build-standalone/releases/download/(\d{8})/"
        r"cpython-3\.11\.\d+%2B\1-x86_64-unknown-linux-gnu-install_only(_stripped)?\.tar\.gz",
        args.get("PYTHON_URL", ""),
    ), "a python-build-standalone CPython 3.11 release, pinned by tag"
    assert re.fullmatch(r"[0-9a-f]{64}", args.get("PYTHON_SHA256", ""))
    build, runtime = _stages(image)
    for stage in (build, runtime):
        installs = " ".join(re.findall(r"apt-get install ([^&]*)", _runs(stage)))
        assert "apt-get install" in _runs(stage) and not re.search(r"\b(lib)?python3", installs), (
            f"{image}: an apt Python in a stage: {installs}"
        )
    assert 'sha256sum -c' in _runs(build) and '"${PYTHON_SHA256}  /tmp/python.tar.gz"' in _runs(build)
    assert "releaselevel == 'final'" in _runs(build)
    assert "/opt/python/bin/python3.11 -m venv /opt/venv" in _runs(build)
    assert ("COPY", "--from=build /opt/python /opt/python") in runtime, "the venv's interpreter reaches the runtime"


@pytest.mark.parametrize("image", IMAGES)
def test_the_build_ends_by_running_the_training_path_check(image):
    """Issue 19, item 2: the runtime stage runs toolchain/check_training_path.py, which takes an optimizer step in
    two Horovod processes (tests/images/test_check_training_path.py runs it here) and requires NCCL and MPI."""
    check = _check_module()
    runtime = _stages(image)[-1]
    assert ("COPY", "toolchain/check_training_path.py /opt/checks/check_training_path.py") in runtime
    runs = [args for op, args in runtime if op == "RUN" and "check_training_path.py" in args]
    assert len(runs) == 1, f"{image}: the runtime stage does not run the training path check"
    argv = runs[0].split("&&")[0].split()
    assert argv[:2] == ["python", "/opt/checks/check_training_path.py"], "the venv's python (first on PATH)"
    parsed = _check_parser(check).parse_args(argv[2:])
    if image == "pytorch":  # the payload's own step needs payloads/ where --payload-root points
        assert ("COPY", "payloads /opt/checks/payloads") in runtime
        assert parsed.payload_root == pathlib.Path("/opt/checks")
    assert parsed.framework == image and parsed.worker is None
    assert check.WORKER_STEPS[image], "the check takes optimizer steps for this framework"
    assert {"MPI", "NCCL"} <= set(parsed.require)
    assert "azureml.mlflow" in parsed.extra, "the Azure ML MLflow plugin the image installs imports"
    after = runtime[[a for _, a in runtime].index(runs[0]) + 1 :]
    assert all(op in ("WORKDIR", "LABEL") for op, _ in after), f"{image}: the check is not the build's last step"


def _check_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_training_path", ROOT / "toolchain/check_training_path.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_parser(check):
    import argparse

    captured = {}
    real = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        captured["parser"] = self
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab
    try:
        check.main([])
    except SystemExit:
        pass
    finally:
        argparse.ArgumentParser.parse_args = real
    return captured["parser"]


@pytest.mark.parametrize("image", IMAGES)
def test_runtime_stage_is_plain_ubuntu_with_gpu_access_for_the_nvidia_runtime(image):
    """Issue 19, item 8: the wheels bring CUDA; a CUDA runtime base would be a second copy. The NVIDIA container
    runtime mounts GPUs only into containers whose image sets NVIDIA_VISIBLE_DEVICES (NVIDIA's CUDA images
    set it; a plain Ubuntu image must), and mounts libcuda for `compute`, NVML (which NCCL reads) and
    nvidia-smi for `utility` (NVIDIA Container Toolkit, "Specialized Configurations", driver capabilities)."""
    froms = [args for op, args in _instructions(image) if op == "FROM"]
    assert froms[0].startswith("nvidia/cuda:${CUDA_VERSION}-devel-") and froms[0].endswith(" AS build")
    assert froms[-1] == "ubuntu:${UBUNTU_VERSION}" and _global_args(image)["UBUNTU_VERSION"] == "22.04"
    env = dict(_env(image))
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    assert {"compute", "utility"} <= set(env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(","))
    assert "NVIDIA_REQUIRE_CUDA" not in env, "the runtime would refuse older drivers before the payloads name them"
    paths = _paths(env["LD_LIBRARY_PATH"])
    assert "/usr/local/nvidia/lib64" in paths, "where older GPU set-ups mount the host driver (NVIDIA's CUDA images)"
    # InfiniBand/UCX user space and Open MPI stay (issue 12): what NCCL's IB transport and mpirun load
    apt = _runs(_stages(image)[-1])
    for package in (
        "libopenmpi3",
        "openmpi-bin",
        "libucx0",
        "rdma-core",
        "libibverbs1",
        "ibverbs-providers",
        "librdmacm1",
        "openssh-client",
    ):
        assert re.search(rf"\b{re.escape(package)}\b", apt), f"{image}: runtime lacks {package}"


SITE = "/opt/venv/lib/python3.11/site-packages"


def _paths(value: str) -> list[str]:
    """LD_LIBRARY_PATH's folders, without the ${LD_LIBRARY_PATH:+:...} tail that extends the base's."""
    return re.sub(r"\$\{LD_LIBRARY_PATH:\+:\$\{LD_LIBRARY_PATH\}\}$", "", value).split(":")


def test_pytorch_runtime_library_path_reaches_the_wheels_nccl_and_cuda_runtime():
    """Horovod is linked against libnccl.so.2 and libcudart.so.13; in a non-CUDA image only the wheels have them.
    The folders are the wheels' layout, checked against this machine's .venv (the same pins)."""
    import torch

    site = pathlib.Path(torch.__file__).parents[1]
    paths = _paths(dict(_env("pytorch"))["LD_LIBRARY_PATH"])
    for lib, soname in (("nvidia/nccl/lib", "libnccl.so.2"), ("nvidia/cu13/lib", "libcudart.so.13")):
        assert f"{SITE}/{lib}" in paths
        assert (site / lib / soname).exists(), f"the pinned wheels put {soname} elsewhere than {lib}"


def test_tensorflow_runtime_library_path_and_xla_data_dir():
    """tensorflow[and-cuda]==2.15.1 brings nvidia-nccl-cu12 (nvidia/nccl/lib/libnccl.so.2), nvidia-cuda-runtime-cu12
    (nvidia/cuda_runtime/lib/libcudart.so.12) and nvidia-cuda-nvcc-cu12 (nvidia/cuda_nvcc/nvvm/libdevice/
    libdevice.10.bc, bin/ptxas), as their wheels list them; XLA takes libdevice and ptxas from
    --xla_gpu_cuda_data_dir (issue 19, item 9), and the build check requires them there."""
    assert re.search(r"^tensorflow\[and-cuda\]==", (ROOT / "images/tensorflow/requirements.txt").read_text(), re.M)
    env = dict(_env("tensorflow"))
    paths = _paths(env["LD_LIBRARY_PATH"])
    assert f"{SITE}/nvidia/nccl/lib" in paths and f"{SITE}/nvidia/cuda_runtime/lib" in paths
    assert env["XLA_FLAGS"] == f"--xla_gpu_cuda_data_dir={SITE}/nvidia/cuda_nvcc"
    run = next(a for op, a in _stages("tensorflow")[-1] if op == "RUN" and "check_training_path.py" in a)
    assert "--require-libdevice" in run.split()


def test_pytorch_image_carries_the_forward_compatibility_driver_and_its_hook():
    """Issue 19, item 4: CUDA 13 needs driver branch 580; older hosts get cuda-compat-13-0 from the CUDA build
    stage, loaded at interpreter start-up by images/cuda_forward_compat.py (tests/images/test_cuda_forward_compat.py)."""
    build, runtime = _stages("pytorch")
    assert "cp -a /usr/local/cuda/compat/. /opt/cuda-compat/" in _runs(build)
    assert ("COPY", "--from=build /opt/cuda-compat /usr/local/cuda/compat") in runtime
    assert ("COPY", f"images/cuda_forward_compat.py {SITE}/cuda_forward_compat.py") in runtime
    assert f'"import cuda_forward_compat; cuda_forward_compat.activate()" > {SITE}/cuda_forward_compat.pth' in " ".join(
        _runs(runtime).split()
    )
    run = next(a for op, a in runtime if op == "RUN" and "check_training_path.py" in a)
    assert "--cuda-compat /usr/local/cuda/compat" in " ".join(run.split())


@pytest.mark.parametrize("image", IMAGES)
def test_build_and_runtime_share_one_ubuntu_release(image):
    """Horovod is compiled against the build stage's Open MPI; the runtime's libopenmpi3 must be the same release."""
    froms = [args for op, args in _instructions(image) if op == "FROM"]
    assert all("${UBUNTU_VERSION}" in f for f in froms)


def _build_stage(image: str) -> str:
    return "\n".join(f"{op} {args}" for op, args in _stages(image)[0])


@pytest.mark.parametrize("image", IMAGES)
def test_the_build_stage_compiles_with_gxx_12_for_cmake_mpi_and_nvcc_alike(image):
    """Issue 43, item 4: Horovod's torch part is C++20 for torch >= 2.14, which Ubuntu 22.04's default g++ 11 is not
    known to compile; g++ 12 is installed and named to each tool that picks a compiler (CMake: CC/CXX; Open MPI's
    wrappers: OMPI_CC/OMPI_CXX; nvcc: CUDAHOSTCXX), before the build script runs."""
    stage = _build_stage(image)
    installs = " ".join(re.findall(r"apt-get install ([^&]+)", stage))
    assert re.search(r"\bgcc-12\b", installs) and re.search(r"\bg\+\+-12\b", installs), installs
    assert not re.search(r"(?<![\w-])g\+\+(?![\w-])", installs), "a bare g++ is Ubuntu 22.04's g++ 11"
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(re.findall(r"^ENV (.+)$", stage, re.M))))
    expected = {"CC": "gcc-12", "CXX": "g++-12", "OMPI_CC": "gcc-12", "OMPI_CXX": "g++-12", "CUDAHOSTCXX": "g++-12"}
    assert {k: env.get(k) for k in expected} == expected
    assert stage.index("ENV CC=") < stage.index("/src/toolchain/build_horovod.sh"), (
        "the compiler is set before the build"
    )


@pytest.mark.parametrize("image", IMAGES)
def test_the_shared_build_stage_is_run_by_each_image_and_its_pins_live_only_there(image):
    """One home for what both build stages do: each Dockerfile copies images/build_stage.sh and runs it first, on its
    own CUDA devel base, and repeats none of its pins (a pin updated in one place only would split the images)."""
    dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
    build = _stages(image)[0]
    assert ("COPY", "images/build_stage.sh /src/images/build_stage.sh") in build
    runs = [args for op, args in build if op == "RUN"]
    assert "apt-get install" in runs[0] and "/src/toolchain/build_horovod.sh" in runs[-1], runs
    pins = _shared_pins()
    assert {"PYTHON_URL", "PYTHON_SHA256", "AZHPC_IMAGES"} <= set(pins)
    shared = SHARED_BUILD.read_text()
    for pin in [pins["PYTHON_SHA256"], *re.findall(r"/([0-9a-f]{40})/topology/", shared)]:
        assert pin not in dockerfile, f"{image}: {pin} is repeated outside images/build_stage.sh"
    import subprocess

    assert subprocess.run(["bash", "-n", str(SHARED_BUILD)]).returncode == 0
    assert SHARED_BUILD.stat().st_mode & 0o111, "RUN /src/images/build_stage.sh needs it executable"


# Compute capability of each GPU model the catalog names (NVIDIA's CUDA GPUs list, developer.nvidia.com/cuda-gpus).
CAPABILITY = {"T4": 75, "A10": 86, "A100": 80, "H100": 90, "H100 NVL": 90, "H200": 90, "V100": 70}


@pytest.mark.parametrize("image", IMAGES)
def test_every_current_gpu_size_has_native_kernels_in_the_image(image):
    """The image's Horovod kernels are compiled for each capability in its list (PTX only for the highest: a GPU
    newer than the list JIT-compiles, test_build_jobs): every GPU size the catalog offers today is in the list."""
    from trainingplatform import vm_sizes

    stage = _build_stage(image)
    given = re.search(r"HOROVOD_BUILD_CUDA_CC_LIST=([\d,]+)", stage)
    script = (ROOT / "toolchain/build_horovod.sh").read_text()
    default = re.search(r"CUDA_CC_LIST=\$\{HOROVOD_BUILD_CUDA_CC_LIST:-([\d,]+)\}", script).group(1)
    listed = {int(cc) for cc in (given.group(1) if given else default).split(",")}
    models = {vm_sizes.CATALOG[name].gpu_model for name in vm_sizes.available()} - {None}
    assert models <= set(CAPABILITY), f"capability unknown for {models - set(CAPABILITY)}: add it above"
    assert {CAPABILITY[m] for m in models} <= listed, (image, sorted(listed), sorted(models))


def test_the_launchers_image_installs_the_submission_set_and_the_supervisor_runs_its_tag():
    """images/launcher: requirements-submit.txt (tests/launcher/test_submit_install.py holds it to what the launcher
    imports), tagged by its azure-ai-ml pin; the supervisor job (launcher/supervisor.yaml) runs that tag."""
    text = (ROOT / "images/launcher/Dockerfile").read_text()
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for item in src.split():
            assert (ROOT / item).exists(), f"COPY {item}: not in the build context (the repository root)"
    assert "-r /src/requirements-submit.txt" in text and "/src/launcher/requirements.txt" in text
    tag = f"launcher:azure-ai-ml{_pin('launcher/requirements.txt', 'azure-ai-ml')}"
    assert f"training/{tag}" in text
    supervisor = yaml.safe_load((ROOT / "launcher/supervisor.yaml").read_text())
    assert supervisor["environment"]["image"] == f"<<registry>>/training/{tag}"
    assert supervisor["identity"] == {"type": "user_identity"}


# ---- Open MPI's settings for every job: the image's system MCA parameters file (issue 54, item 6) ---------------

MCA_SETTINGS = ROOT / "images/openmpi-mca-params.conf"
MPI_SETTINGS = ROOT / "images/mpi_settings.sh"


def _mca_settings() -> dict[str, str]:
    pairs = re.findall(r"^\s*([a-z0-9_]+)\s*=\s*(\S+)\s*$", MCA_SETTINGS.read_text(), re.M)
    return dict(pairs)


@pytest.mark.parametrize("image", IMAGES)
def test_each_runtime_stage_writes_the_jobs_open_mpi_settings_into_its_system_file(image):
    """Every mpirun and orted reads Open MPI's system MCA parameters file however Azure ML starts them (its
    mpirun, each node's daemon through ssh): the runtime stage, where Open MPI is installed, appends the settings
    there with the script that reads them back."""
    runtime = _stages(image)[-1]
    ops = [op for op, _ in runtime]
    copies = [args for op, args in runtime if op == "COPY" and not args.startswith("--from")]
    copy = next(a for a in copies if "images/mpi_settings.sh" in a)
    assert copy == "images/mpi_settings.sh images/openmpi-mca-params.conf /tmp/mpi/", copy
    run = next(args for op, args in runtime if op == "RUN" and "mpi_settings.sh" in args)
    assert run.startswith("bash /tmp/mpi/mpi_settings.sh /tmp/mpi/openmpi-mca-params.conf"), run
    apt = next(i for i, (op, args) in enumerate(runtime) if op == "RUN" and "openmpi-bin" in args)
    assert apt < runtime.index(("RUN", run)) and ops.count("FROM") == 1, "after Open MPI is installed"


def test_the_images_open_mpi_settings_are_the_jobs_environment():
    """Two sources, one value: the image's file and every MPI job's environment (launcher/interconnect.py)."""
    from launcher import interconnect

    job = {k.removeprefix("OMPI_MCA_"): v for k, v in interconnect.MPI_STOP_ENV.items() if k.startswith("OMPI_MCA_")}
    assert job and _mca_settings() == job, (_mca_settings(), job)


needs_ompi_info = pytest.mark.skipif(shutil.which("ompi_info") is None, reason="no Open MPI here (Gloo-only set-up)")


def _ompi_info(env: dict) -> dict:
    from payloads.healthcheck import mpistop

    out = subprocess.run(list(mpistop.COMMAND), env=env, capture_output=True, text=True, check=True).stdout
    return mpistop.parse(out)


@needs_ompi_info
def test_the_script_appends_the_settings_and_open_mpi_reads_them_from_that_file(tmp_path):
    """Against a copy of this machine's system file (Debian's Open MPI 4.1, as Ubuntu's in the images): after the
    script, ompi_info reads the job's grace from that file; a job variable still wins (the second source), and a
    setting Open MPI does not know fails the script, naming it."""
    system = pathlib.Path(subprocess.check_output(["ompi_info", "--path", "sysconfdir", "--parsable"], text=True)
                          .strip().split(":", 2)[2]) / "openmpi-mca-params.conf"  # fmt: skip
    target = tmp_path / "openmpi-mca-params.conf"
    target.write_text(system.read_text() if system.is_file() else "")
    before = target.read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    proc = subprocess.run(["bash", str(MPI_SETTINGS), str(MCA_SETTINGS), str(target)], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert target.read_text().startswith(before), "appended: the distribution's own settings stay"
    env["OMPI_MCA_mca_base_param_files"] = str(target)
    got = _ompi_info(env)
    assert got["value"] == int(_mca_settings()["odls_base_sigkill_timeout"]), got
    assert got["source"].startswith(f"file ({target}:"), got
    assert _ompi_info({**env, "OMPI_MCA_odls_base_sigkill_timeout": "7"}) == {"value": 7, "source": "environment"}

    wrong = tmp_path / "wrong.conf"
    wrong.write_text("odls_base_sigkil_timeout = 30\n")
    proc = subprocess.run(["bash", str(MPI_SETTINGS), str(wrong), str(tmp_path / "other.conf")], env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode != 0 and "does not read odls_base_sigkil_timeout = 30" in proc.stderr, proc.stderr
