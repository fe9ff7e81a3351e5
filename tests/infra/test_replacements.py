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


# ---- issue 28: cluster names across a workspace replacement (item 4), SSH access (item 11), image builds (8) ----


def _compute_names(mocks):
    return {r.name: r.inputs["computeName"] for r in mocks.of_type("machinelearningservices:Compute")}


def test_a_workspace_replacement_gives_every_cluster_a_new_name(dev, dev_raw, dev_data, monkeypatch):
    # "Name needs to be unique across all existing computes within an Azure region" (learn.microsoft.com/azure/
    # machine-learning/how-to-create-attach-compute-cluster, "Compute name"). A replaced workspace is a new one,
    # created before the old one is deleted (module docstring), and its clusters with it: while the old clusters
    # still exist in the same region, the new ones must not take their names.
    before_ws = one(dev[0], "machinelearningservices:Workspace", "ml-workspace").inputs["workspaceName"]
    before = _compute_names(dev[0])
    new_vault = _run(dev_raw, dev_data, random_result="p3m9w")  # a new Key Vault: a new workspace
    original = naming.storage_account
    monkeypatch.setattr(
        naming, "storage_account", lambda prefix, stack, role, suffix: original(prefix, stack, "v2" + role, suffix)
    )
    new_storage = _run(dev_raw, dev_data)  # a new workspace storage account: a new workspace
    for replaced in (new_vault, new_storage):
        ws = one(replaced, "machinelearningservices:Workspace", "ml-workspace").inputs["workspaceName"]
        assert ws != before_ws, "the premise: this change replaces the workspace under a new name"
        after = _compute_names(replaced)
        assert after.keys() == before.keys()
        for logical, name in after.items():
            assert name != before[logical], (logical, name, "same name as the old workspace's cluster")
            assert name.startswith(logical.removeprefix("compute-") + "-")  # the config name stays readable


def test_an_ssh_access_change_gives_the_cluster_a_new_name(dev, dev_raw, dev_data):
    # "SSH access is disabled by default. SSH access can't be changed after creation."
    # (learn.microsoft.com/azure/machine-learning/how-to-create-attach-compute-cluster, "Enable SSH access").
    # Like the VM size, sshEnabled is hashed into the name: a new cluster beside the old one, not a PUT that
    # Azure ML would answer with success while leaving SSH as it was.
    old = _cluster(dev[0])
    assert old["properties"]["properties"].get("userAccountCredentials") is None

    def ssh_on(raw):
        raw["clusters"][1]["sshEnabled"] = True
        raw["sshPublicKey"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample user@laptop"

    changed = _run(dev_raw, dev_data, ssh_on)
    new = _cluster(changed)
    assert new["properties"]["properties"]["userAccountCredentials"]["adminUserName"] == "azureuser"
    assert new["computeName"] != old["computeName"] and new["computeName"].startswith("gpu-ib-")
    # Only the cluster whose SSH access changed moves.
    assert _cluster(changed, "compute-cpu-smoke")["computeName"] == _cluster(dev[0], "compute-cpu-smoke")["computeName"]


def test_image_builds_name_a_declared_cluster(dev, prod, dev_raw, dev_data):
    # The workspace's imageBuildCompute is "The compute name for image build" (REST Workspaces,
    # WorkspaceProperties.imageBuildCompute; learn.microsoft.com/azure/machine-learning/how-to-secure-workspace-vnet,
    # "Enable Azure Container Registry": `az ml workspace update ... --image-build-compute mycomputecluster`): an
    # Azure ML compute name. The config name `cpu-smoke` names no compute (the cluster is `cpu-smoke-<hash>`),
    # so every environment build failed.
    for mocks in (dev[0], prod[0]):
        ws = one(mocks, "machinelearningservices:Workspace", "ml-workspace").inputs
        declared = _compute_names(mocks)
        assert ws["imageBuildCompute"] in declared.values(), (ws["imageBuildCompute"], declared)
        assert ws["imageBuildCompute"] == declared["compute-cpu-smoke"]  # imageBuildCluster: cpu-smoke
    # It follows the cluster when the cluster is replaced under a new name.
    moved = _run(dev_raw, dev_data, lambda r: r["clusters"][0].update(vmSize="Standard_D8s_v5"))
    assert (
        one(moved, "machinelearningservices:Workspace", "ml-workspace").inputs["imageBuildCompute"]
        == _cluster(moved, "compute-cpu-smoke")["computeName"]
        != _cluster(dev[0], "compute-cpu-smoke")["computeName"]
    )
