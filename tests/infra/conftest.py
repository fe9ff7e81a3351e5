import copy

import pytest
from infra_helpers import DATA_DEV_FILE, DEV_FILE

from trainingplatform import dataconfig, mocked


@pytest.fixture(scope="session")
def dev_raw():
    return mocked.read_stack_file(DEV_FILE)


@pytest.fixture(scope="session")
def dev_data_raw():
    return mocked.read_stack_file(DATA_DEV_FILE, dataconfig.PROJECT)


@pytest.fixture(scope="session")
def dev_data(dev_data_raw):
    """The dev data stack (infra/data-stack/Pulumi.dev.yaml) under mocks: (mocks, outputs)."""
    raw, location = dev_data_raw
    return mocked.run_data(copy.deepcopy(raw), "dev", location)


@pytest.fixture(scope="session")
def dev(dev_raw, dev_data):
    """The dev platform stack under mocks, over the dev data stack's outputs: (mocks, outputs)."""
    raw, location = dev_raw
    return mocked.run(copy.deepcopy(raw), "dev", location, data_outputs=dev_data[1])
