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
