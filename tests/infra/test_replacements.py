"""What a change replaces, judged from what the program declares under mocks (names and replaceOnChanges).

Azure's behaviour these tests hold the program to:
- An Azure ML workspace's storage account and Key Vault are fixed at creation: a PUT naming others fails
  with "Storage Account update is not supported yet" (REST Workspaces - Update offers neither;
  learn.microsoft.com/rest/api/azureml/workspaces/update). A change that replaces either must replace the
  workspace, under a new name: a deleted workspace's name stays held while it is soft-deleted
  (learn.microsoft.com/azure/machine-learning/concept-soft-delete).
- A compute cluster's VM size, priority and subnet cannot be updated (REST Compute - Update carries scale
  settings only: learn.microsoft.com/rest/api/azureml/compute/update); its identity can
  (`az ml compute update --identity-type ... --user-assigned-identities ...`,
  learn.microsoft.com/cli/azure/ml/compute#az-ml-compute-update).
- Pulumi replaces a resource when an input listed in `replaceOnChanges` changes, or when its Azure name
  changes (the name is part of the resource id); with a new name, the new one is created before the old
  one is deleted (pulumi.com/docs/iac/concepts/resources/options/replaceonchanges, deletebeforereplace).
"""

import copy

from infra_helpers import one

from trainingplatform import compute, mocked, naming, workspace


def _run(dev_raw, dev_data, edit=lambda raw: None, random_result="x7k2q"):
    raw = copy.deepcopy(dev_raw[0])
    edit(raw)
    return mocked.run(
        raw, "dev", dev_raw[1], mocked.RecordingMocks(random_result=random_result), data_outputs=dev_data[1]
    )[0]


def _paths_exist(inputs, paths):
    for path in paths:
        value = inputs
        for key in path.split("."):
            assert isinstance(value, dict) and key in value, path
            value = value[key]


def test_the_workspace_is_replaced_when_its_storage_or_vault_would_change(dev):
    mocks, _ = dev
    ws = one(mocks, "machinelearningservices:Workspace", "ml-workspace")
    opts = mocks.options["ml-workspace"]
    assert set(opts.replace_on_changes) >= {"storageAccount", "keyVault"}
    _paths_exist(ws.inputs, workspace.REPLACE_ON_CHANGES)
    assert not opts.delete_before_replace, "a new name: the new workspace exists before the old one goes"


def test_a_new_storage_account_or_vault_gives_the_workspace_a_new_name(dev, dev_raw, dev_data, monkeypatch):
    before = one(dev[0], "machinelearningservices:Workspace", "ml-workspace").inputs
    # A replaced Key Vault (here: a new stack life's random suffix) and a renamed storage account (here: the
    # naming rule of the account changed) each move the workspace to a new name, never a PUT on the old one.
    new_vault = _run(dev_raw, dev_data, random_result="p3m9w")
    assert one(new_vault, "Vault", "ml-kv").inputs["vaultName"] != one(dev[0], "Vault", "ml-kv").inputs["vaultName"]
    assert (
        one(new_vault, "machinelearningservices:Workspace", "ml-workspace").inputs["workspaceName"]
        != before["workspaceName"]
    )

    # Nothing else (scale settings here) moves the workspace.
    same = _run(dev_raw, dev_data, lambda r: r["clusters"][1].update(maxNodes=1))
    assert (
        one(same, "machinelearningservices:Workspace", "ml-workspace").inputs["workspaceName"]
        == before["workspaceName"]
    )

    original = naming.storage_account
    monkeypatch.setattr(
        naming, "storage_account", lambda prefix, stack, role, suffix: original(prefix, stack, "v2" + role, suffix)
    )
    new_storage = _run(dev_raw, dev_data)
    after = one(new_storage, "machinelearningservices:Workspace", "ml-workspace").inputs
    assert after["storageAccount"] != before["storageAccount"]
    assert after["keyVault"] == before["keyVault"]
    assert after["workspaceName"] != before["workspaceName"]


def _cluster(mocks, name="compute-gpu-ib"):
    return one(mocks, "machinelearningservices:Compute", name).inputs


def test_a_vm_size_or_priority_change_replaces_the_cluster_under_a_new_name(dev, dev_raw, dev_data):
    old = _cluster(dev[0])
    opts = dev[0].options["compute-gpu-ib"]
    _paths_exist(old, compute.REPLACE_ON_CHANGES)
    assert {"properties.properties.vmSize", "properties.properties.vmPriority"} <= set(opts.replace_on_changes)
    # Delete-then-create under the same name raced Azure ML's asynchronous delete; a new name cannot.
    assert not opts.delete_before_replace
    for edit in (
        lambda r: r["clusters"][1].update(vmSize="Standard_ND96amsr_A100_v4"),
        lambda r: r["clusters"][1].update(priority="Dedicated"),
    ):
        new = _cluster(_run(dev_raw, dev_data, edit))
        assert new["computeName"] != old["computeName"]
        assert new["computeName"].startswith("gpu-ib-")


def test_scale_settings_and_the_identity_change_in_place(dev, dev_raw, dev_data):
    old = _cluster(dev[0])
    opts = dev[0].options["compute-gpu-ib"]
    assert not any(p == "identity" or p.startswith("identity.") for p in opts.replace_on_changes)
    scaled = _cluster(
        _run(dev_raw, dev_data, lambda r: r["clusters"][1].update(maxNodes=1, idleSecondsBeforeScaleDown=120))
    )
    assert scaled["computeName"] == old["computeName"]
    assert scaled["identity"] == old["identity"]


def test_the_stack_output_names_the_cluster_jobs_are_submitted_to(dev):
    mocks, outputs = dev
    for name, cluster in outputs["clusters"].items():
        assert cluster["name"] == name
        assert cluster["compute_name"] == _cluster(mocks, f"compute-{name}")["computeName"]
