"""Preflight against a fake Azure (tests/fake_arm.py): the REST answers are the documented examples' shapes
(learn.microsoft.com/rest/api/azureml usages/list and virtual-machine-sizes/list, api-version 2024-04-01;
resources providers/get, subscriptions/get; authorization permissions/list-for-resource-group), and errors
come back as Azure's error bodies, raised by azure-core as HttpResponseError and its subclasses."""

from __future__ import annotations

import dataclasses
import io
import pathlib
import re
import tempfile

import fake_arm
import pytest
import yaml
from azure.core.exceptions import ClientAuthenticationError

from azureaccess.errors import JobError
from azurecheck import preflight, providers, roles, stackfile, subscription
from trainingplatform import config, naming

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUB = "5e1f0000-1111-2222-3333-444455556666"
ARM = r"management\.azure\.com"
ML = rf"{ARM}/subscriptions/{SUB}/providers/Microsoft\.MachineLearningServices/locations/westeurope"


def usage(kind: str, label: str, limit: int, used: int = 0, scope: str = f"/subscriptions/{SUB}") -> dict:
    rid = f"{scope}/usages" + ("" if kind in ("dedicatedCores", "lowPriorityCores") else "/" + label.replace(" ", "_"))
    return {
        "id": rid,
        "type": f"Microsoft.MachineLearningServices/{kind}/usages",
        "currentValue": used,
        "limit": limit,
        "name": {"value": label, "localizedValue": label},
        "unit": "Count",
    }


def usages(nd_dedicated=0, low_priority=100, dsv5=100, regional=300, nd_used=0) -> dict:
    ws = f"/subscriptions/{SUB}/resourceGroups/other/providers/Microsoft.MachineLearningServices/workspaces/other"
    return {
        "value": [
            usage("dedicatedCores", "Total Cluster Dedicated Regional vCPUs", regional),
            usage("vmFamily", "Standard DSv5 Family Cluster Dedicated vCPUs", dsv5),
            usage("vmFamily", "Standard NDASv4_A100 Family Cluster Dedicated vCPUs", nd_dedicated, nd_used),
            usage("lowPriorityCores", "Total Cluster LowPriority Regional vCPUs", low_priority),
            # per-family low-priority rows carry no limit of their own (-1), workspace rows repeat the subscription's
            usage("vmFamily", "Standard NDASv4_A100 Family Cluster LowPriority vCPUs", -1),
            {
                **usage("vmFamily", "Standard NDASv4_A100 Family Cluster Dedicated vCPUs", 9999, scope=ws),
                "type": "Microsoft.MachineLearningServices/workspaces/usages",
            },
        ]
    }


def size(name, family, vcpus, gpus=0, low_priority=True):
    return {
        "name": name,
        "family": family,
        "vCPUs": vcpus,
        "gpus": gpus,
        "osVhdSizeMB": 1047552,
        "maxResourceVolumeMB": 153600,
        "memoryGB": 16.0,
        "lowPriorityCapable": low_priority,
        "premiumIO": True,
        "supportedComputeTypes": ["AmlCompute", "ComputeInstance"],
    }


SIZES = {
    "value": [
        size("Standard_D4s_v5", "standardDSv5Family", 4),
        size("Standard_ND96asr_v4", "standardNDASv4_A100Family", 96, 8),
    ]
}
OWNER_ROLE = "8e3af657-a8ff-443c-a75c-2fe8c4bcb635"  # the built-in Owner role's id
OWNER = {"value": [{"actions": ["*"], "notActions": [], "dataActions": [], "notDataActions": []}]}
CONTRIBUTOR = {
    "value": [
        {
            "actions": ["*"],
            "notActions": [
                "Microsoft.Authorization/*/Delete",
                "Microsoft.Authorization/*/Write",
                "Microsoft.Authorization/elevateAccess/Action",
            ],
        }
    ]
}


def working_azure(monkeypatch) -> fake_arm.FakeAzure:
    """A subscription where preflight passes for the dev stack (test_preflight_hub.py builds on it too)."""
    fake = fake_arm.install(monkeypatch)
    fake.on(
        "GET",
        rf"{ARM}/subscriptions/{SUB}",
        (
            200,
            {"id": f"/subscriptions/{SUB}", "subscriptionId": SUB, "displayName": "Research", "state": "Enabled"},
            {},
        ),
    )
    fake.on(
        "GET",
        rf"{ARM}/subscriptions/{SUB}/providers/([\w.]+)",
        lambda r, m: (200, {"namespace": m[1], "registrationState": "Registered"}, {}),
    )
    fake.on(
        "GET",
        rf"{ARM}/subscriptions/{SUB}/resourceGroups/hvd-dev-rg/providers/Microsoft\.Authorization/permissions",
        fake_arm.arm_error(404, "ResourceGroupNotFound", "Resource group 'hvd-dev-rg' could not be found."),
    )
    fake.on("GET", rf"{ARM}/subscriptions/{SUB}/providers/Microsoft\.Authorization/permissions", (200, OWNER, {}))
    # Role Assignments - List For Scope ($filter=assignedTo): the deployer's, an Owner without a condition
    owner = fake_arm.role_assignment(f"/subscriptions/{SUB}", OWNER_ROLE, fake_arm.USER["oid"])
    fake.on(
        "GET",
        rf"{ARM}/subscriptions/{SUB}(/resourceGroups/[^/]+)?/providers/Microsoft\.Authorization/roleAssignments",
        (200, {"value": [owner]}, {}),
    )
    fake.on("GET", rf"{ML}/usages", (200, usages(), {}))
    fake.on("GET", rf"{ML}/vmSizes", (200, SIZES, {}))
    fake.on("GET", rf"{ML}/quotas", (200, {"value": []}, {}))
    return fake


def _pinned_root() -> pathlib.Path:
    """A folder holding Pulumi.dev.yaml as committed plus `azure-native:subscriptionId: SUB` (which each user
    sets with `pulumi config set`: the committed file pins none)."""
    global _PINNED
    if _PINNED is None:
        _PINNED = pathlib.Path(tempfile.mkdtemp(prefix="pinned-stack-"))
        data = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
        data["config"]["azure-native:subscriptionId"] = SUB
        (_PINNED / "Pulumi.dev.yaml").write_text(yaml.safe_dump(data))
    return _PINNED


_PINNED = None


def dev_stack(**cluster_changes) -> stackfile.StackFile:
    """Pulumi.dev.yaml as committed, pinned to SUB; cluster_changes: name -> dict of Cluster fields."""
    stack = stackfile.read("dev", _pinned_root())
    clusters = tuple(dataclasses.replace(c, **cluster_changes.get(c.name, {})) for c in stack.settings.clusters)
    return stackfile.StackFile(dataclasses.replace(stack.settings, clusters=clusters), SUB)


def run(stack, credential=None, current=(SUB, "$ARM_SUBSCRIPTION_ID")) -> tuple[int, str]:
    out = io.StringIO()
    code = preflight.run(stack, credential or fake_arm.Credential(), current=current, out=out)
    return code, out.getvalue()


def lines(text: str, check: str) -> str:
    """The blocks (finding line plus its fix line) of one check."""
    return "\n".join(re.findall(rf"^\[[ \w]+\] {re.escape(check)}:.*(?:\n       fix:.*)?", text, re.M))


def test_healthy_subscription_passes_and_names_every_clusters_numbers(azure):
    code, out = run(dev_stack())
    print(out)
    assert code == 0, out
    cpu = lines(out, "quota cpu-smoke")
    assert "VM family standardDSv5Family, 4 vCPUs per node, 8 for maxNodes 2" in cpu and "[  ok]" in cpu
    # the low-priority cluster is judged by the one regional pool, not by its family's dedicated quota (0)
    assert "'Total Cluster LowPriority Regional vCPUs' 100" in lines(out, "quota gpu-ib")
    for ns in (
        "Microsoft.MachineLearningServices",
        "Microsoft.Storage",
        "Microsoft.ContainerRegistry",
        "Microsoft.KeyVault",
        "Microsoft.Network",
        "Microsoft.Insights",
        "Microsoft.OperationalInsights",
    ):
        assert f"[  ok] provider {ns}: registered" in out


def test_family_with_zero_quota_fails_naming_family_and_link(azure):
    code, out = run(dev_stack(**{"gpu-ib": {"low_priority": False}}))
    print(out)  # on failure pytest shows it; docs/preflight-and-doctor.md quotes it
    block = lines(out, "quota gpu-ib")
    assert code == 1 and block.startswith("[FAIL]"), out
    assert "standardNDASv4_A100Family" in block and "One node (96 vCPUs) exceeds" in block
    assert "ClusterMinNodesExceedCoreQuota" in block and "even with minNodes 0" in block
    assert "https://ml.azure.com/quota" in block and "Standard NDASv4_A100 Family Cluster Dedicated vCPUs" in block


def test_one_node_fits_but_max_nodes_do_not_warns(azure):
    azure.on("GET", rf"{ML}/usages", (200, usages(nd_dedicated=100), {}))
    code, out = run(dev_stack(**{"gpu-ib": {"low_priority": False}}))
    block = lines(out, "quota gpu-ib")
    assert code == 0 and block.startswith("[WARN]"), out
    assert "maxNodes 2 needs 192 vCPUs" in block and "at most 1 nodes run at once" in block
    assert "https://ml.azure.com/quota" in block


def test_regional_dedicated_total_caps_a_family(azure):
    azure.on("GET", rf"{ML}/usages", (200, usages(nd_dedicated=400, regional=48), {}))
    code, out = run(dev_stack(**{"gpu-ib": {"low_priority": False}}))
    assert code == 1 and "exceeds 'Total Cluster Dedicated Regional vCPUs' (48)" in lines(out, "quota gpu-ib")


def test_low_priority_uses_the_regional_pool(azure):
    # family dedicated quota 0 does not matter to a LowPriority cluster; the regional pool of 50 does
    azure.on("GET", rf"{ML}/usages", (200, usages(nd_dedicated=0, low_priority=50), {}))
    code, out = run(dev_stack())
    block = lines(out, "quota gpu-ib")
    assert code == 1 and block.startswith("[FAIL]")
    assert "low-priority (one regional pool for every family)" in block
    assert "exceeds 'Total Cluster LowPriority Regional vCPUs' (50)" in block
    azure.on("GET", rf"{ML}/usages", (200, usages(nd_dedicated=0, low_priority=1000), {}))
    code, out = run(dev_stack())
    assert code == 0 and lines(out, "quota gpu-ib").startswith("[  ok]")


def test_clusters_sharing_a_pool_warn_when_together_above_it(azure):
    azure.on("GET", rf"{ML}/usages", (200, usages(dsv5=12), {}))
    stack = dev_stack()
    extra = dataclasses.replace(stack.settings.clusters[0], name="cpu-two")
    stack = stackfile.StackFile(dataclasses.replace(stack.settings, clusters=stack.settings.clusters + (extra,)), SUB)
    code, out = run(stack)
    assert "clusters cpu-smoke, cpu-two together need 16 vCPUs at maxNodes, above 12" in out


def test_size_not_offered_in_region_fails(azure):
    azure.on("GET", rf"{ML}/vmSizes", (200, {"value": SIZES["value"][:1]}, {}))
    code, out = run(dev_stack())
    assert code == 1 and "Standard_ND96asr_v4 is not offered for Azure ML compute clusters in westeurope" in out


def test_unregistered_provider_named_with_the_register_command(azure):
    azure.on(
        "GET",
        rf"{ARM}/subscriptions/{SUB}/providers/Microsoft\.MachineLearningServices",
        (200, {"namespace": "Microsoft.MachineLearningServices", "registrationState": "NotRegistered"}, {}),
    )
    code, out = run(dev_stack())
    block = lines(out, "provider Microsoft.MachineLearningServices")
    assert code == 1 and block.startswith("[FAIL]") and "MissingSubscriptionRegistration" in block
    assert f"az provider register --namespace Microsoft.MachineLearningServices --subscription {SUB}" in block


def test_wrong_subscription_refused_before_anything_else(azure):
    other = "99999999-8888-7777-6666-555555555555"
    code, out = run(dev_stack(), current=(other, "`az account show`"))
    print(out)
    assert code == 1
    assert f"you are signed in to subscription {other} (`az account show`), the stack deploys to {SUB}" in out
    assert f"az account set --subscription {SUB}" in out
    assert "quota" not in out and not any("/providers/" in r.url for r in azure.requests)


def test_stack_without_a_pinned_subscription_fails():
    stack = dataclasses.replace(dev_stack(), subscription=None)
    code, out = run(stack)
    assert code == 1 and "pulumi config set azure-native:subscriptionId" in out


def test_session_subscription_from_environment_then_cli():
    assert subscription.in_use({"ARM_SUBSCRIPTION_ID": SUB}, lambda: "other") == (SUB, "$ARM_SUBSCRIPTION_ID")
    assert subscription.in_use({}, lambda: "cli-sub") == ("cli-sub", "`az account show`")
    assert subscription.in_use({}, lambda: None) == (None, "")


def test_no_role_assignment_permission_named(azure):
    azure.on(
        "GET", rf"{ARM}/subscriptions/{SUB}/providers/Microsoft\.Authorization/permissions", (200, CONTRIBUTOR, {})
    )
    code, out = run(dev_stack())
    block = lines(out, "permissions")
    assert code == 1
    assert (
        f"[FAIL] permissions: you may not Microsoft.Authorization/roleAssignments/write on /subscriptions/{SUB}"
        in block
    )
    assert "User Access Administrator" in block
    assert "[  ok] permissions: Microsoft.Resources/subscriptions/resourceGroups/write allowed" in block


def test_permissions_read_at_the_resource_group_once_it_exists(azure):
    group = naming.dashed("hvd", "dev", "rg")  # the program's name for the dev stack's group
    rg = rf"{ARM}/subscriptions/{SUB}/resourceGroups/{group}/providers/Microsoft\.Authorization/permissions"
    azure.on("GET", rg, (200, CONTRIBUTOR, {}))
    code, out = run(dev_stack())
    assert f"roleAssignments/write on /subscriptions/{SUB}/resourceGroups/{group}" in out


def test_service_principal_without_users_fails_with_both_fixes(azure):
    code, out = run(dev_stack(), fake_arm.Credential(fake_arm.SERVICE_PRINCIPAL))
    block = lines(out, "users")
    assert code == 1 and "UnmatchedPrincipalType" in block
    assert "type: ServicePrincipal" in block and fake_arm.SERVICE_PRINCIPAL["oid"] in block
    listed = (config.Principal(object_id="55555555-5555-5555-5555-555555555555", type="Group"),)
    stack = dev_stack()
    stack = stackfile.StackFile(dataclasses.replace(stack.settings, users=listed), SUB)
    code, out = run(stack, fake_arm.Credential(fake_arm.SERVICE_PRINCIPAL))
    assert code == 0 and lines(out, "users").startswith("[  ok]")


def test_principal_kind_from_token_claims():
    assert roles.principal({"oid": "a", "idtyp": "app"}) == ("a", "ServicePrincipal")
    assert roles.principal({"oid": "b", "idtyp": "user"}) == ("b", "User")
    assert roles.principal({"oid": "c", "scp": "user_impersonation"}) == ("c", "User")  # no idtyp claim
    assert roles.principal({"oid": "d", "roles": []}) == ("d", "ServicePrincipal")
    assert roles.principal({}) == (None, None)


def test_forbidden_quota_read_becomes_a_readable_line(azure):
    azure.on(
        "GET",
        rf"{ML}/usages",
        fake_arm.arm_error(
            403,
            "AuthorizationFailed",
            f"The client 'someone@example.com' with object id '33333333' does not have "
            "authorization to perform action 'Microsoft.MachineLearningServices/locations/usages/read' over scope "
            f"'/subscriptions/{SUB}' or the scope is invalid.",
        ),
    )
    code, out = run(dev_stack())
    block = lines(out, "quota")
    assert code == 1 and "Traceback" not in out
    assert "reading Azure ML quotas and VM sizes in westeurope: Azure refused it (403 AuthorizationFailed)" in block
    assert "Microsoft.MachineLearningServices/locations/usages/read" in block


def test_not_signed_in_is_one_finding_with_the_fix(azure):
    code, out = run(
        dev_stack(),
        fake_arm.Credential(error=ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")),
    )
    assert code == 1 and "[FAIL] sign-in" in out and "az login" in out and "Traceback" not in out


def test_providers_cover_every_module_the_programs_declare():
    """The namespaces list is derived from the two programs: a new azure-native module must be added to it."""
    from trainingplatform import mocked

    modules = set()
    for stack in ("dev", "prod"):
        raw, location = mocked.read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
        mocks, _ = mocked.run(raw, stack, location)
        data_raw, data_location = mocked.read_stack_file(mocked.data_stack_file(stack), "azure-horovod-training-data")
        data_mocks, _ = mocked.run_data(data_raw, stack, data_location)
        modules |= {
            r.type.split(":")[1] for r in mocks.resources + data_mocks.resources if r.type.startswith("azure-native:")
        }
    assert modules <= set(providers.NAMESPACES), f"add to providers.NAMESPACES: {modules - set(providers.NAMESPACES)}"
    assert {"Microsoft.MachineLearningServices", "Microsoft.Network", "Microsoft.Storage"} <= set(providers.REQUIRED)


def test_stack_file_is_validated_by_the_programs_config(tmp_path):
    text = (
        (ROOT / "Pulumi.dev.yaml")
        .read_text()
        .replace("maxNodes: 2\n      priority: LowPriority", "maxNodes: 0\n      priority: LowPriority")
    )
    (tmp_path / "Pulumi.bad.yaml").write_text(text)
    with pytest.raises(JobError, match=r"clusters\[1\]\.maxNodes = 0: 1 or more"):
        stackfile.read("bad", tmp_path)
    (tmp_path / "Pulumi.pinned.yaml").write_text(
        (ROOT / "Pulumi.dev.yaml")
        .read_text()
        .replace("config:\n", f"config:\n  azure-native:subscriptionId: {SUB}\n", 1)
    )
    assert stackfile.read("pinned", tmp_path).subscription == SUB
    with pytest.raises(JobError, match="Pulumi.nope.yaml not found"):
        stackfile.read("nope", tmp_path)


# --- the submission hook (python -m launcher JOB --target azureml) -----------------------------------------


def test_submission_refuses_a_job_the_quota_can_never_hold(azure, dev_outputs):
    from azureaccess import stack
    from launcher import azureml

    outputs = stack.load_file(dev_outputs)
    outputs.values["subscription_id"] = SUB
    azure.on("GET", rf"{ML}/usages", (200, usages(low_priority=100), {}))
    with pytest.raises(
        JobError,
        match=r"The job needs 2 nodes = 192 vCPUs, above 'Total Cluster LowPriority "
        r"Regional vCPUs' \(100\).*--skip-quota-check",
    ):
        azureml.check_quota(outputs, "gpu-ib", 2, fake_arm.Credential())
    azureml.check_quota(outputs, "gpu-ib", 1, fake_arm.Credential())  # one node fits: no error


def test_submission_goes_ahead_when_quota_cannot_be_read(azure, dev_outputs, capsys):
    from azureaccess import stack
    from launcher import azureml

    outputs = stack.load_file(dev_outputs)
    outputs.values["subscription_id"] = SUB
    azure.on("GET", rf"{ML}/usages", fake_arm.arm_error(403, "AuthorizationFailed", "no usages/read"))
    azureml.check_quota(outputs, "gpu-ib", 2, fake_arm.Credential())
    assert "warning: quota not checked" in capsys.readouterr().err


def test_cli_routes_preflight(monkeypatch, capsys):
    from launcher import __main__ as cli

    seen = {}
    monkeypatch.setattr(preflight, "run", lambda stack, **kw: seen.setdefault("stack", stack) and 0)
    monkeypatch.setattr(stackfile, "ROOT", _pinned_root())
    assert cli.main(["preflight", "--stack", "dev"]) == 0
    assert seen["stack"].settings.stack == "dev"
    assert cli.main(["preflight", "--stack", "nope"]) == 2
    assert "Pulumi.nope.yaml not found" in capsys.readouterr().err


def test_submission_respects_the_workspaces_own_quota(azure, dev_outputs):
    from azureaccess import stack
    from launcher import azureml

    outputs = stack.load_file(dev_outputs)
    outputs.values["subscription_id"] = SUB
    ws_id = (
        f"/subscriptions/{SUB}/resourceGroups/{outputs['resource_group']}/providers/"
        f"Microsoft.MachineLearningServices/workspaces/{outputs['workspace_name']}"
    )
    label = "Standard DSv5 Family Cluster Dedicated vCPUs"
    azure.on(
        "GET",
        rf"{ML}/quotas",
        (
            200,
            {
                "value": [
                    {
                        "id": f"{ws_id}/quotas/Standard_DSv5_Family_Cluster_Dedicated_vCPUs",
                        "limit": 4,
                        "unit": "Count",
                        "type": "Microsoft.MachineLearningServices/workspaces/quotas",
                        "name": {"value": label, "localizedValue": label},
                    }
                ]
            },
            {},
        ),
    )
    with pytest.raises(
        JobError,
        match=r"The job needs 2 nodes = 8 vCPUs, above 'Standard DSv5 Family Cluster "
        rf"Dedicated vCPUs \(workspace {outputs['workspace_name']}\)' \(4\)",
    ):
        azureml.check_quota(outputs, "cpu-smoke", 2, fake_arm.Credential())
