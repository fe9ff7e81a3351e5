"""Doctor against a fake Azure (tests/fake_arm.py): ARM (workspace, datastores, usages, VM sizes), the workspace
storage's blob endpoint and the registry's data plane (with its Entra-to-registry token exchange), each
answering in the documented shapes or with the service's error body and code."""

from __future__ import annotations

import io
import re
import urllib.parse

import fake_arm
import pytest
from test_preflight import SIZES, lines, usages

from azureaccess import stack
from azurecheck import doctor, images

WS_GUID = "0a1b2c3d-0000-4000-8000-000000000001"
ACCOUNT, CONTAINER = "hvddevmlwsabc12345", f"azureml-blobstore-{WS_GUID}"
IMAGES = {
    ("training/pytorch", "torch2.14.1-horovod0.28.1"): ["pytorch-resnet50-synthetic.yaml"],
    ("training/tensorflow", "tf2.15.1-horovod0.28.1"): ["keras-resnet50-synthetic.yaml"],
}


def datastore(name: str) -> dict:
    if name in ("workspacefilestore", "workspaceworkingdirectory"):
        props = {"datastoreType": "AzureFile", "accountName": ACCOUNT, "fileShareName": f"code-{WS_GUID}"}
    elif name.startswith("workspace"):
        props = {"datastoreType": "AzureBlob", "accountName": ACCOUNT, "containerName": CONTAINER}
    else:  # the stack's own, on the data stack's accounts
        props = {
            "datastoreType": "AzureBlob",
            "accountName": "hvddevdataabc12345",
            "containerName": name.replace("_", "-"),
        }
    return {
        "id": f".../datastores/{name}",
        "name": name,
        "type": "Microsoft.MachineLearningServices/workspaces/datastores",
        "properties": {**props, "credentials": {"credentialsType": "None"}, "isDefault": name == "workspaceblobstore"},
    }


class World:
    """The deployed stack as Azure would answer for it; tests change one piece."""

    def __init__(self, fake, outputs: stack.StackOutputs, public_access="Disabled"):
        self.fake, self.outputs = fake, outputs
        self.addresses = ["10.40.16.5"]
        self.tags = set(IMAGES)
        sub, rg, ws = outputs["subscription_id"], outputs["resource_group"], outputs["workspace_name"]
        arm = r"management\.azure\.com"
        self.ws_path = rf"{arm}/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft\.MachineLearningServices/workspaces/{ws}"
        fake.on(
            "GET",
            self.ws_path,
            (
                200,
                {
                    "id": "/x",
                    "name": ws,
                    "location": "westeurope",
                    "properties": {
                        "workspaceId": WS_GUID,
                        "publicNetworkAccess": public_access,
                        "storageAccount": f"/.../{ACCOUNT}",
                    },
                },
                {},
            ),
        )
        fake.on("GET", self.ws_path + r"/datastores/([\w-]+)", lambda r, m: (200, datastore(m[1]), {}))
        ml = rf"{arm}/subscriptions/{sub}/providers/Microsoft\.MachineLearningServices/locations/westeurope"
        fake.on("GET", ml + "/usages", (200, usages(), {}))
        fake.on("GET", ml + "/vmSizes", (200, SIZES, {}))
        self.ml, self.workspace_quotas = ml, []
        fake.on("GET", ml + "/quotas", lambda r, m: (200, {"value": self.quota_rows()}, {}))
        blob = rf"{ACCOUNT}\.blob\.core\.windows\.net/{CONTAINER}/azure-horovod-training-doctor/[\w-]+\.txt"
        fake.on(
            "PUT",
            blob,
            (
                201,
                b"",
                {
                    "ETag": '"0x8D"',
                    "Last-Modified": "Tue, 24 Nov 2026 02:00:00 GMT",
                    "x-ms-request-server-encrypted": "true",
                },
            ),
        )
        fake.on("DELETE", blob, (202, b"", {"x-ms-delete-type-permanent": "true"}))
        registry = re.escape(outputs["registry_login_server"])
        fake.on("POST", registry + "/oauth2/exchange", (200, {"refresh_token": "acr-refresh"}, {}))
        fake.on("POST", registry + "/oauth2/token", (200, {"access_token": "acr-access"}, {}))
        fake.on("GET", registry + r"/acr/v1/(.+)/_tags/([^/]+)", self.tag)

    def quota_rows(self):
        """Quotas - List: the subscription's row per family and, where one is set, a workspace's own."""
        sub, rg = self.outputs["subscription_id"], self.outputs["resource_group"]
        rows = [
            {
                "id": f"/subscriptions/{sub}/quotas/Standard_DSv5_Family_Cluster_Dedicated_vCPUs",
                "type": "Microsoft.MachineLearningServices/vmFamily/quotas",
                "limit": 100,
                "unit": "Count",
                "name": {
                    "value": "Standard DSv5 Family Cluster Dedicated vCPUs",
                    "localizedValue": "Standard DSv5 Family Cluster Dedicated vCPUs",
                },
            }
        ]
        for workspace, limit in self.workspace_quotas:
            rows.append(
                {
                    "id": f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices/"
                    f"workspaces/{workspace}/quotas/Standard_DSv5_Family_Cluster_Dedicated_vCPUs",
                    "type": "Microsoft.MachineLearningServices/workspaces/quotas",
                    "limit": limit,
                    "unit": "Count",
                    "name": {
                        "value": "Standard DSv5 Family Cluster Dedicated vCPUs",
                        "localizedValue": "Standard DSv5 Family Cluster Dedicated vCPUs",
                    },
                }
            )
        return rows

    def tag(self, request, m):
        if request.headers.get("Authorization") != "Bearer acr-access":
            login = self.outputs["registry_login_server"]
            return (
                401,
                {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]},
                {
                    "WWW-Authenticate": f'Bearer realm="https://{login}/oauth2/token",service="{login}",'
                    f'scope="repository:{urllib.parse.unquote(m[1])}:metadata_read"'
                },
            )
        repo, tag = urllib.parse.unquote(m[1]), urllib.parse.unquote(m[2])
        if (repo, tag) not in self.tags:
            return 404, {"errors": [{"code": "TAG_UNKNOWN", "message": "the specified tag does not exist"}]}, {}
        return (
            200,
            {
                "registry": self.outputs["registry_login_server"],
                "imageName": repo,
                "tag": {
                    "name": tag,
                    "digest": "sha256:" + "ab" * 32,
                    "createdTime": "2026-11-20T10:00:00Z",
                    "lastUpdateTime": "2026-11-20T10:00:00Z",
                    "signed": False,
                    "changeableAttributes": {
                        "deleteEnabled": True,
                        "writeEnabled": True,
                        "readEnabled": True,
                        "listEnabled": True,
                    },
                },
            },
            {},
        )

    def run(self) -> tuple[int, str]:
        out = io.StringIO()
        code = doctor.run(self.outputs, fake_arm.Credential(), resolver=lambda host: self.resolve(host), out=out)
        return code, out.getvalue()

    def resolve(self, host):
        assert host == f"{WS_GUID}.workspace.westeurope.api.azureml.ms"
        if isinstance(self.addresses, Exception):
            raise self.addresses
        return self.addresses


@pytest.fixture
def world(monkeypatch, dev_outputs):
    monkeypatch.setattr(images, "job_images", lambda: dict(IMAGES))
    return World(fake_arm.install(monkeypatch), stack.load_file(dev_outputs))


def test_healthy_platform_passes(world):
    code, out = world.run()
    print(out)
    assert code == 0, out
    assert (
        f"[  ok] workspace DNS: {WS_GUID}.workspace.westeurope.api.azureml.ms -> 10.40.16.5 (private endpoint)" in out
    )
    for name in (
        "workspaceblobstore",
        "workspaceartifactstore",
        "workspacefilestore",
        "workspaceworkingdirectory",
        "training_data",
        "training_logs",
    ):
        assert f"[  ok] datastore {name}:" in out
    assert f"[  ok] code upload: wrote and deleted a probe blob in {ACCOUNT}/{CONTAINER}" in out
    assert "[  ok] image training/pytorch:torch2.14.1-horovod0.28.1: in" in out
    assert [r.method for r in world.fake.requests if ".blob." in r.url] == ["PUT", "DELETE"]


def test_private_workspace_resolving_publicly_names_the_way_in(world):
    world.addresses = ["20.50.2.3"]
    code, out = world.run()
    block = lines(out, "workspace DNS")
    assert (
        code == 1 and block.startswith("[FAIL]") and "resolves to 20.50.2.3 here, not to the private endpoint" in block
    )
    assert (
        "inside the VNet" in block and "privatelink.api.azureml.ms" in block and "workspacePublicAccess: true" in block
    )
    world.addresses = OSError("Name or service not known")
    code, out = world.run()
    assert code == 1 and "does not resolve here" in lines(out, "workspace DNS")


def test_public_workspace_may_resolve_publicly(monkeypatch, dev_outputs):
    monkeypatch.setattr(images, "job_images", lambda: dict(IMAGES))
    w = World(fake_arm.install(monkeypatch), stack.load_file(dev_outputs), public_access="Enabled")
    w.addresses = ["20.50.2.3"]
    code, out = w.run()
    assert code == 0 and "(public address; public access is on)" in lines(out, "workspace DNS")


def test_missing_datastores_each_named_with_their_fix(world):
    world.fake.on(
        "GET",
        world.ws_path + r"/datastores/training_data",
        fake_arm.arm_error(404, "UserError", "Could not find datastore: training_data"),
    )
    world.fake.on(
        "GET",
        world.ws_path + r"/datastores/workspaceworkingdirectory",
        fake_arm.arm_error(404, "UserError", "Could not find datastore: workspaceworkingdirectory"),
    )
    code, out = world.run()
    assert code == 1
    assert "[FAIL] datastore training_data: the stack's data datastore missing" in out
    assert "run pulumi up (the stack declares it" in lines(out, "datastore training_data")
    assert lines(out, "datastore workspaceworkingdirectory").startswith("[WARN]")


def test_missing_blobstore_fails_and_upload_is_not_tried(world):
    world.fake.on(
        "GET",
        world.ws_path + r"/datastores/workspaceblobstore",
        fake_arm.arm_error(404, "UserError", "Could not find datastore: workspaceblobstore"),
    )
    code, out = world.run()
    assert code == 1 and "[FAIL] datastore workspaceblobstore: default datastore missing" in out
    assert "[FAIL] code upload: not tried" in out and not any(".blob." in r.url for r in world.fake.requests)


@pytest.mark.parametrize(
    "code_, expect",
    [
        ("AuthorizationPermissionMismatch", "Storage Blob Data Contributor"),
        ("AuthorizationFailure", "network.allowedClientIps"),
    ],
)
def test_upload_refused_names_role_or_firewall(world, code_, expect):
    body = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code_}</Code><Message>This request is not '
        'authorized to perform this operation.\nRequestId:fake\nTime:2026-11-24T02:00:00Z</Message></Error>'
    ).encode()
    world.fake.on(
        "PUT",
        rf"{ACCOUNT}\.blob\.core\.windows\.net/.*",
        (403, body, {"x-ms-error-code": code_, "Content-Type": "application/xml"}),
    )
    code, out = world.run()
    block = lines(out, "code upload")
    assert code == 1 and block.startswith("[FAIL]") and f"403 {code_}" in block and expect in block


def test_missing_image_named_with_its_build_command(world):
    world.tags.discard(("training/tensorflow", "tf2.15.1-horovod0.28.1"))
    world.addresses = ["20.50.2.3"]
    code, out = world.run()
    print(out)  # on failure pytest shows it; docs/preflight-and-doctor.md quotes it
    block = lines(out, "image training/tensorflow:tf2.15.1-horovod0.28.1")
    registry = world.outputs["registry_login_server"]
    assert code == 1 and block.startswith("[FAIL]") and "keras-resnet50-synthetic.yaml" in block
    assert (
        f"az acr build -r {registry.split('.')[0]} -t training/tensorflow:tf2.15.1-horovod0.28.1 "
        "-f images/tensorflow/Dockerfile"
    ) in block
    assert lines(out, "image training/pytorch:torch2.14.1-horovod0.28.1").startswith("[  ok]")


def test_registry_refusing_the_token_exchange_is_readable(world):
    registry = re.escape(world.outputs["registry_login_server"])
    world.fake.on(
        "POST",
        registry + "/oauth2/exchange",
        (403, {"errors": [{"code": "DENIED", "message": "client with IP '203.0.113.9' is not allowed access"}]}, {}),
    )
    code, out = world.run()
    block = lines(out, "image training/pytorch:torch2.14.1-horovod0.28.1")
    assert code == 1 and block.startswith("[FAIL]") and "Traceback" not in out
    assert "AcrPull" in block and "registryPublicAccess: false" in block


def test_quota_reused_for_the_deployed_clusters(world):
    sub = world.outputs["subscription_id"]
    world.fake.on(
        "GET",
        rf"management\.azure\.com/subscriptions/{sub}/providers/Microsoft\.MachineLearningServices/"
        r"locations/westeurope/usages",
        (200, usages(low_priority=40), {}),
    )
    code, out = world.run()
    assert code == 1 and "exceeds 'Total Cluster LowPriority Regional vCPUs' (40)" in lines(out, "quota gpu-ib")


def test_workspace_quota_below_the_subscriptions_caps_its_clusters(world):
    ws = world.outputs["workspace_name"]
    world.workspace_quotas = [("another-workspace", 0), (ws, 4)]  # another workspace's quota is not ours
    code, out = world.run()
    block = lines(out, "quota cpu-smoke")
    assert code == 0 and block.startswith("[WARN]"), out
    assert f"above 'Standard DSv5 Family Cluster Dedicated vCPUs (workspace {ws})' (4): at most 1 nodes" in block
    world.workspace_quotas = [(ws, 0)]
    code, out = world.run()
    assert code == 1 and "One node (4 vCPUs) exceeds" in lines(out, "quota cpu-smoke")


def test_forbidden_workspace_is_one_readable_failure(world):
    world.fake.on(
        "GET",
        world.ws_path,
        fake_arm.arm_error(
            403,
            "AuthorizationFailed",
            "The client does not have authorization to perform action "
            "'Microsoft.MachineLearningServices/workspaces/read'",
        ),
    )
    code, out = world.run()
    assert code == 1 and "Azure refused it (403 AuthorizationFailed)" in out and "workspaces/read" in out
    assert "Traceback" not in out


def test_job_images_read_from_the_job_files():
    found = images.job_images()
    assert ("training/pytorch", "torch2.14.1-horovod0.28.1") in found
    assert "pytorch-resnet50-synthetic.yaml" in found[("training/pytorch", "torch2.14.1-horovod0.28.1")]


def test_a_stopped_jump_host_is_named_with_what_it_still_blocks(world):
    """Issue 54, item 1: the evening auto-shutdown deallocates the jump host. Its extensions go with it on destroy and
    take no tag changes (wayin.py), but Azure modifies no extension of a stopped VM: the doctor reads its power state
    (Virtual Machines - Instance View, statuses[].code) and names what a `pulumi up` cannot do until it runs."""
    vm = f"/subscriptions/{world.outputs['subscription_id']}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/jh"
    world.outputs.values["way_in"] = {"mode": "bastion", "jump_host": "jh", "jump_host_id": vm}
    state = {"code": "PowerState/deallocated"}
    view = {"statuses": [{"code": "ProvisioningState/succeeded"}, state]}
    world.fake.on("GET", re.escape(f"management.azure.com{vm}/instanceView"), lambda r, m: (200, view, {}))
    code, out = world.run()
    assert code == 0, "a stopped jump host is its normal evening state, not a failure"
    block = lines(out, "jump host")
    assert "[WARN] jump host: jh is deallocated" in block and "replaces it fails until it runs" in block
    assert f"fix: az vm start --ids {vm}, then pulumi up" in block
    state["code"] = "PowerState/running"
    assert "[  ok] jump host: jh is running" in world.run()[1]
