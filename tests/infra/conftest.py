import copy
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
for p in (ROOT / "infra", ROOT / "policy"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from trainingplatform import mocked  # noqa: E402

DEV_FILE = ROOT / "Pulumi.dev.yaml"


@pytest.fixture(scope="session")
def dev_raw():
    return mocked.read_stack_file(DEV_FILE)


@pytest.fixture(scope="session")
def dev(dev_raw):
    raw, location = dev_raw
    mocks, outputs = mocked.run(copy.deepcopy(raw), "dev", location)
    return mocks, outputs


def one(mocks, type_suffix, name):
    found = [r for r in mocks.resources if r.type.endswith(type_suffix) and r.name == name]
    assert len(found) == 1, f"{type_suffix} {name}: {[r.name for r in mocks.of_type(type_suffix)]}"
    return found[0]
