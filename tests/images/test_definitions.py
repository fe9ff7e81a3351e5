"""The image definitions agree with the pins, the jobs and Azure ML's schema (no Docker needed)."""
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGES = ["pytorch", "tensorflow"]


def _pin(path, package):
    m = re.search(rf"^{package}(\[[^\]]*\])?==(\S+)", (ROOT / path).read_text(), re.M)
    return m.group(2)


HOROVOD = re.search(r"^HOROVOD_VERSION=(\S+)", (ROOT / "toolchain/build_horovod.sh").read_text(), re.M).group(1)
TAGS = {"pytorch": f"torch{_pin('payloads/requirements.txt', 'torch')}-horovod{HOROVOD}",
        "tensorflow": f"tf{_pin('images/tensorflow/requirements.txt', 'tensorflow')}-horovod{HOROVOD}"}


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
            assert not item.startswith("payloads/") or item.endswith("requirements.txt"), \
                "payload code travels with the job, not in the image"
    assert "toolchain/build_horovod.sh" in text and "HOROVOD_GPU_OPERATIONS=NCCL" in text
    assert TAGS[image] in text, "the build commands in the Dockerfile name the tag made from the pins"


def test_jobs_use_their_framework_image_tag_made_from_the_pins():
    for job in (ROOT / "payloads/jobs").glob("*.yaml"):
        spec = yaml.safe_load(job.read_text())
        framework = "tensorflow" if re.search(r"payloads\.(tensorflow|keras)\.", spec["command"]) else "pytorch"
        assert spec["environment"]["image"] == f"<<registry>>/training/{framework}:{TAGS[framework]}", job.name


def test_local_tensorflow_is_the_images_tensorflow():
    """Tests run the CPU build of the very TensorFlow release the GPU image installs."""
    assert _pin("payloads/requirements-tensorflow.txt", "tensorflow-cpu") == \
        _pin("images/tensorflow/requirements.txt", "tensorflow")


def _instructions(image: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in (ROOT / "images" / image / "Dockerfile").read_text().splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.lstrip().startswith("#"):   # a comment inside a continued instruction
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current)
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "") for line in lines]


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
            assert re.search(r"\$\{?LD_LIBRARY_PATH\b", value), f"{image}: LD_LIBRARY_PATH={value} replaces the base image's"


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
