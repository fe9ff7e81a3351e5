import copy

import pytest
from infra_helpers import DATA_DEV_FILE, DATA_PROD_FILE, DEV_FILE, PROD_FILE

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


@pytest.fixture(scope="session")
def prod():
    """The fully private profile (Pulumi.prod.yaml) under mocks, over its data stack."""
    raw, location = mocked.read_stack_file(PROD_FILE)
    data_raw, data_location = mocked.read_stack_file(DATA_PROD_FILE, dataconfig.PROJECT)
    return mocked.run(raw, "prod", location, data_outputs=mocked.run_data(data_raw, "prod", data_location)[1])


@pytest.fixture(scope="session")
def prod_raw():
    """Pulumi.prod.yaml as read, for tests that change its settings (copy it first)."""
    return mocked.read_stack_file(PROD_FILE)


@pytest.fixture(scope="session")
def prod_data_out():
    """The prod data stack's outputs under mocks, for tests that render variants of the prod platform."""
    raw, location = mocked.read_stack_file(DATA_PROD_FILE, dataconfig.PROJECT)
    return mocked.run_data(raw, "prod", location)[1]
