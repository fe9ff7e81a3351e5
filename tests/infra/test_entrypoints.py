"""The two Pulumi entry points (what `pulumi up` runs) read their stack config as the CLI hands it over
and declare what the mocked runs declare: the data stack's `infra/data-stack/__main__.py` and the
platform's `infra/__main__.py`, which finds the data stack of its name through the StackReference."""

import json
import runpy

import pulumi
from infra_helpers import DATA_DEV_FILE, DEV_FILE, ROOT
from pulumi.runtime.settings import SETTINGS
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from trainingplatform import config, dataconfig, mocked


def _cli_config(stack_file, project):
    """The config map the Pulumi CLI gives a program: namespaced keys, objects as JSON text."""
    raw, location = mocked.read_stack_file(stack_file, project)
    cfg = {f"{project}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    cfg["azure-native:location"] = location
    cfg["azure-native:subscriptionId"] = mocked.SUBSCRIPTION  # `pulumi config set azure-native:subscriptionId`
    return cfg


def _run_main(path, project, stack_config, mocks):
    pulumi.runtime.set_mocks(mocks, project=project, stack="dev", preview=False, organization=mocked.ORGANIZATION)
    pulumi.runtime.set_all_config(stack_config)
    SETTINGS.rpc_manager.clear()
    SETTINGS.outputs.clear()
    try:
        with mocked.recording_options(mocks):
            _sync_await(run_pulumi_func(lambda: runpy.run_path(str(path), run_name="__main__")))
    finally:
        pulumi.runtime.set_all_config({})
    return {(r.type, r.name): r.inputs for r in mocks.resources}


def test_data_stack_entry_point_declares_what_the_review_shows(dev_data):
    declared = _run_main(
        ROOT / "infra" / "data-stack" / "__main__.py",
        dataconfig.PROJECT,
        _cli_config(DATA_DEV_FILE, dataconfig.PROJECT),
        mocked.RecordingMocks(),
    )
    assert declared == {(r.type, r.name): r.inputs for r in dev_data[0].resources}


def test_platform_entry_point_reads_its_data_stack(dev, dev_data):
    mocks = mocked.RecordingMocks(stack_outputs={"organization/azure-horovod-training-data/dev": dev_data[1]})
    declared = _run_main(ROOT / "infra" / "__main__.py", config.PROJECT, _cli_config(DEV_FILE, config.PROJECT), mocks)
    assert declared == {(r.type, r.name): r.inputs for r in dev[0].resources}
