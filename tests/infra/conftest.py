import copy

import pytest
from infra_helpers import DEV_FILE, PROD_FILE

from trainingplatform import mocked


@pytest.fixture(scope="session")
def dev_raw():
    return mocked.read_stack_file(DEV_FILE)


@pytest.fixture(scope="session")
def dev(dev_raw):
    raw, location = dev_raw
    return mocked.run(copy.deepcopy(raw), "dev", location)


@pytest.fixture(scope="session")
def prod():
    """The fully private profile (Pulumi.prod.yaml) under mocks."""
    raw, location = mocked.read_stack_file(PROD_FILE)
    return mocked.run(raw, "prod", location)
