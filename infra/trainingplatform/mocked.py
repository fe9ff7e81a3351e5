"""Run the program in-process under Pulumi's mocks: no Azure, no Pulumi CLI.

Used by the tests and by the review aid (`python -m trainingplatform.review`). The mocks echo every
resource's inputs back as its state and fill in the few outputs Azure would compute (ids, principal ids,
login server), so relationships between resources can be asserted. Two programs run here: the data stack
(`run_data`) and the platform (`run`), which reads the data stack's outputs through a StackReference; the
mocks answer that reference with outputs given to them (`stack_outputs`).
"""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from dataclasses import dataclass
from typing import Any

import pulumi
import yaml
from pulumi.runtime.mocks import MockCallArgs, MockResourceArgs, Mocks
from pulumi.runtime.settings import SETTINGS
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from . import config, dataconfig, datastack, program

SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
TENANT = "11111111-1111-1111-1111-111111111111"
DEPLOYER = "22222222-2222-2222-2222-222222222222"  # object id of whoever runs `pulumi up` (getClientConfig)
ORGANIZATION = "organization"  # what the Pulumi CLI's self-managed backends call the org
# Secrets are never in a stack file (`pulumi config set --secret`). A stack that declares the bastion's jump host
# must set jumpHostSshPublicKey to deploy (the program refuses it otherwise); the mocks stand in this for it
# unless the settings given to them carry the key (a value, or None: "not set").
JUMP_HOST_KEY_PLACEHOLDER = "<the stack's jumpHostSshPublicKey secret>"
DATA_DIR = pathlib.Path(__file__).resolve().parents[1] / "data-stack"  # the data project (its stack files)


@dataclass
class Resource:
    type: str
    name: str
    inputs: dict
    id: str


class RecordingMocks(Mocks):
    def __init__(
        self,
        subscription: str = SUBSCRIPTION,
        random_result: str = "x7k2q",
        stack_outputs: dict[str, dict] | None = None,
    ):
        self.subscription = subscription
        self.random_result = random_result  # what pulumi_random answers (a new stack life: a new value)
        self.stack_outputs = dict(stack_outputs or {})  # fully qualified stack name -> its outputs
        self.resources: list[Resource] = []
        self.retained: set[str] = set()  # logical names declared with retain_on_delete
        self.protected: set[str] = set()  # logical names declared with protect
        self.options: dict[str, pulumi.ResourceOptions] = {}  # logical name -> the options it was declared with

    def new_resource(self, args: MockResourceArgs):
        typ, name, inputs = args.typ, args.name, dict(args.inputs)
        provider_name = next((inputs[k] for k in _NAME_KEYS.get(typ, ()) if inputs.get(k)), name)
        if typ == "pulumi:pulumi:StackReference":
            ref = inputs["name"]
            if ref not in self.stack_outputs:
                raise KeyError(f"unknown stack {ref!r}: the mocks know {sorted(self.stack_outputs)}")
            self.resources.append(Resource(typ, name, inputs, ref))
            return ref, {"name": ref, "outputs": self.stack_outputs[ref], "secretOutputNames": []}
        rid = f"/subscriptions/{self.subscription}/mock/{typ.split(':')[-1]}/{provider_name}"
        state = dict(inputs, name=provider_name)
        identity = inputs.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # Azure takes a list of identity ids and answers with a map keyed by them.
            state["identity"] = dict(
                identity, userAssignedIdentities={i: {} for i in identity["userAssignedIdentities"]}
            )
        if typ == "random:index/randomString:RandomString":
            state["result"] = self.random_result
        elif typ == "azure-native:managedidentity:UserAssignedIdentity":
            state.update(principalId=f"principal-{name}", clientId=f"client-{name}")
        elif typ == "azure-native:machinelearningservices:Workspace":
            state["identity"] = dict(inputs.get("identity", {}), principalId=f"principal-{name}")
        elif typ == "azure-native:containerregistry:Registry":
            state["loginServer"] = f"{provider_name}.azurecr.io"
        elif typ == "azure-native:network:PublicIPAddress":
            state["ipAddress"] = "20.0.0.1"
        elif typ == "azure-native:operationalinsights:Workspace":
            state["customerId"] = log_analytics_customer_id(rid)
        self.resources.append(Resource(typ, name, inputs, rid))
        return rid, state

    def call(self, args: MockCallArgs):
        if args.token == "azure-native:authorization:getClientConfig":
            return {
                "subscriptionId": self.subscription,
                "tenantId": TENANT,
                "clientId": "client",
                "objectId": DEPLOYER,
            }, []
        raise NotImplementedError(f"no mock for {args.token}")

    def of_type(self, suffix: str) -> list[Resource]:
        return [r for r in self.resources if r.type.endswith(suffix)]

    def depends_on(self, name: str) -> set[str]:
        """Logical names of the resources `name` was declared to depend on (explicit depends_on only)."""
        opts = self.options.get(name)
        deps = (opts.depends_on if opts else None) or []
        return {
            d.pulumi_resource_name
            for d in (deps if isinstance(deps, list) else [deps])
            if isinstance(d, pulumi.Resource)
        }


def log_analytics_customer_id(resource_id: str) -> str:
    """The customerId the mocks give a Log Analytics workspace: a GUID, as Azure's (the query API's workspace id), one
    per workspace and the same on every run."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, resource_id))


# Which input holds the Azure name of each resource type (others fall back to the logical name).
_NAME_KEYS = {
    "azure-native:resources:ResourceGroup": ("resourceGroupName",),
    "azure-native:storage:StorageAccount": ("accountName",),
    "azure-native:storage:BlobContainer": ("containerName",),
    "azure-native:storage:FileShare": ("shareName",),
    "azure-native:containerregistry:Registry": ("registryName",),
    "azure-native:keyvault:Vault": ("vaultName",),
    "azure-native:machinelearningservices:Workspace": ("workspaceName",),
    "azure-native:machinelearningservices:Compute": ("computeName",),
    "azure-native:machinelearningservices:Datastore": ("name",),
    "azure-native:privatedns:PrivateZone": ("privateZoneName",),
}


def read_stack_file(path: pathlib.Path, project: str = config.PROJECT) -> tuple[dict, str | None]:
    """(project settings without the project prefix, azure-native:location) from a Pulumi.<stack>.yaml."""
    data = yaml.safe_load(pathlib.Path(path).read_text()) or {}
    raw, location = {}, None
    for key, value in (data.get("config") or {}).items():
        if key == "azure-native:location":
            location = value
        elif key.startswith(project + ":"):
            raw[key.split(":", 1)[1]] = value
    return raw, location


@contextlib.contextmanager
def recording_options(mocks: RecordingMocks):
    """Resource options never reach the mocks; record the ones reviews and tests care about."""
    original = pulumi.CustomResource.__init__

    def recording_init(self, t, name, props=None, opts=None, *args, **kwargs):
        if opts is not None and opts.retain_on_delete:
            mocks.retained.add(name)
        if opts is not None and opts.protect:
            mocks.protected.add(name)
        if opts is not None:
            mocks.options[name] = opts
        return original(self, t, name, props, opts, *args, **kwargs)

    pulumi.CustomResource.__init__ = recording_init
    try:
        yield mocks
    finally:
        pulumi.CustomResource.__init__ = original


def _declare(mocks: RecordingMocks, project: str, stack: str, build) -> dict[str, Any]:
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, organization=ORGANIZATION)
    SETTINGS.rpc_manager.clear()
    SETTINGS.outputs.clear()
    resolved: dict[str, Any] = {}

    def body():
        resolved.update(_sync_await(pulumi.Output.from_input(build()).future()))

    with recording_options(mocks):
        _sync_await(run_pulumi_func(body))
    return resolved


def data_stack_file(stack: str) -> pathlib.Path:
    return DATA_DIR / f"Pulumi.{stack}.yaml"


def run_data(
    raw: dict, stack: str, location: str | None, mocks: RecordingMocks | None = None
) -> tuple[RecordingMocks, dict[str, Any]]:
    """Validate and declare the data stack (project azure-horovod-training-data) under mocks."""
    mocks = mocks or RecordingMocks()
    # The stack's azure-native:subscriptionId (required): here, the mocked subscription.
    cfg = dataconfig.load(raw, stack, location, mocks.subscription)
    return mocks, _declare(mocks, dataconfig.PROJECT, stack, lambda: datastack.build(cfg))


def run(
    raw: dict, stack: str, location: str | None, mocks: RecordingMocks | None = None, data_outputs: dict | None = None
) -> tuple[RecordingMocks, dict[str, Any]]:
    """Validate and declare the platform stack under mocks; returns the recorded resources and resolved outputs.

    The platform reads its data stack's outputs: `data_outputs`, or else those of the committed data stack
    file of the same stack name (infra/data-stack/Pulumi.<stack>.yaml), declared first under mocks of the
    same subscription."""
    mocks = mocks or RecordingMocks()
    cfg = config.load(raw, stack, location, mocks.subscription)
    reference = cfg.data_stack or datastack.default_reference(ORGANIZATION, stack)
    if reference not in mocks.stack_outputs:
        if data_outputs is None:
            if not data_stack_file(stack).is_file():
                raise FileNotFoundError(
                    f"no data stack file {data_stack_file(stack)} for stack {stack}: copy "
                    "infra/data-stack/Pulumi.dev.yaml to it (docs/deploying.md#deploy)"
                )
            data_raw, data_location = read_stack_file(data_stack_file(stack), dataconfig.PROJECT)
            _, data_outputs = run_data(data_raw, stack, data_location, RecordingMocks(subscription=mocks.subscription))
        mocks.stack_outputs[reference] = data_outputs
    bastion = cfg.access is not None and cfg.access.mode == "bastion"
    jump_host_key = raw.get("jumpHostSshPublicKey", JUMP_HOST_KEY_PLACEHOLDER if bastion else None)
    return mocks, _declare(
        mocks,
        config.PROJECT,
        stack,
        lambda: program.build(cfg, ssh_public_key=raw.get("sshPublicKey"), jump_host_ssh_public_key=jump_host_key),
    )
