"""Typed, validated stack configuration: the one place that reads `Pulumi.<stack>.yaml`.

`load()` takes the project's config as a plain dict (camelCase keys, as in the YAML) and either returns a
PlatformConfig or raises ConfigError listing every problem, each naming the key, the bad value and what
is allowed. It runs before any resource is declared.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from .clusterconfig import Cluster, image_build_cluster, read_clusters  # the clusters', beside compute.py
from .networkconfig import Network, read_network  # the network's, beside network.py
from .reader import GUID, ConfigError, Principal, Reader, read_principals, read_users
from .wayinconfig import AccessConfig, central_zones_cover, read_access  # the way in's, beside wayin.py

PROJECT = "azure-horovod-training"


@dataclass(frozen=True, kw_only=True)
class PlatformConfig:
    stack: str
    # azure-native:subscriptionId: required, because the globally unique names hash it (naming.py): a
    # stack that followed whatever subscription `az account show` prints would plan replacing every
    # globally named resource the day another subscription is the default.
    subscription_id: str
    prefix: str
    location: str
    network: Network
    clusters: tuple[Cluster, ...]
    workspace_public_access: bool
    registry_public_access: bool
    image_build_cluster: str | None
    tags: dict[str, str]
    key_vault_public_access: bool = True
    # The data stack (storage, NFS) this platform attaches to, "<org>/<project>/<stack>"; None: the data
    # project's stack of the same name in the same organization (see datastack.py).
    data_stack: str | None = None
    # Who gets the user roles (access.py); None: the principal that runs `pulumi up`.
    users: tuple[Principal, ...] | None = None
    # Reach the data stack's NFS share from this platform's VNet (a private endpoint per platform life).
    mount_nfs: bool = True
    # How people reach a private platform from outside its VNet (config `access`; wayin.py).
    access: AccessConfig | None = None
    # Who may push images (AcrPush; config `imageBuilders`). None: with a private registry, the users (they build
    # the images from inside the VNet, and nobody else could), which the program refuses unless they are the deployer
    # alone; with a public one, nobody by this grant (the deployer pushes as Owner). Every other user gets AcrPull only
    # (access.py).
    image_builders: tuple[Principal, ...] | None = None
    # A custom role that reads Azure ML's quota at the subscription (usages, VM sizes, quotas), given to `users`, so
    # that the submission's quota check works for them (config `quotaReaderRole`; access.QuotaReaders). The deployer
    # then needs Microsoft.Authorization/roleDefinitions/write on the subscription (Owner, User Access Administrator).
    quota_reader_role: bool = True
    # Settings that are valid but probably not what the user wants; the program logs them (pulumi.log.warn).
    warnings: tuple[str, ...] = ()


_LOCATION = re.compile(r"^[a-z]+[a-z0-9]*$")
PREFIX_NAME = re.compile(r"^[a-z][a-z0-9]{1,7}$")
CONTAINER_NAME = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
SHARE_NAME = CONTAINER_NAME
_STACK_REF = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")

# Every setting each level knows; anything else is refused (with the closest name), never ignored.
PLATFORM_KEYS = (
    "prefix",
    "network",
    "clusters",
    "imageBuildCluster",
    "maxTotalGpus",
    "maxTotalNodes",
    "workspacePublicAccess",
    "registryPublicAccess",
    "keyVaultPublicAccess",
    "tags",
    "users",
    "dataStack",
    "mountNfs",
    "sshPublicKey",
    "jumpHostSshPublicKey",
    "access",
    "imageBuilders",
    "quotaReaderRole",
)

# Keys refused with a message of their own (moved to the data stack) rather than as unknown.
_MOVED = ("storage", "nfs")


def location_and_subscription(r: Reader, location: str | None, subscription_id: str | None, where: str = "") -> None:
    """The two azure-native settings a stack must set: the region, and the subscription its names hash."""
    if not location:
        r.problems.append(
            "azure-native:location is missing: set the Azure region, e.g. "
            f"`pulumi config set azure-native:location westeurope`{where}"
        )
    elif not _LOCATION.match(location):
        r.bad(
            "azure-native:location",
            location,
            "an Azure region's short name such as westeurope or eastus2 (lowercase, no spaces)",
        )
    if not subscription_id:
        r.problems.append(
            "azure-native:subscriptionId is missing: resource names hash the subscription, so the "
            "stack must name it rather than follow whichever subscription is the CLI's default (another "
            "default would plan replacing every globally named resource): `pulumi config set "
            f"azure-native:subscriptionId <id>`{where} (`az account show --query id -o tsv`)"
        )
    elif not GUID.match(subscription_id):
        r.bad(
            "azure-native:subscriptionId",
            subscription_id,
            "a subscription id (a GUID), not its name: `az account show --subscription <name> --query id -o tsv`",
        )


def load(
    raw: dict, stack: str, location: str | None, subscription_id: str | None = None, today: dt.date | None = None
) -> PlatformConfig:
    """Validate the project's config dict (keys without the project prefix) for `stack`."""

    today = today or dt.date.today()
    r = Reader()
    location_and_subscription(r, location, subscription_id)
    r.known(raw, "", PLATFORM_KEYS, also=_MOVED)
    prefix = r.get(raw, "prefix", "", str, allowed="2-8 lowercase letters and digits, starting with a letter")
    if prefix is not None and not PREFIX_NAME.match(prefix):
        r.bad(
            "prefix",
            prefix,
            "2-8 lowercase letters and digits, starting with a letter (it goes into storage account names)",
        )
    network = read_network(r, raw, "network")
    for moved in _MOVED:
        if moved in raw:
            r.problems.append(
                f"{moved} is set in the platform's stack file, but the durable data has a stack of its "
                f"own now: move the key to infra/data-stack/Pulumi.<stack>.yaml (as "
                f"azure-horovod-training-data:{moved}) and remove it here (docs/deploying.md#two-stacks)"
            )
    users = read_users(r, raw)
    mount_nfs = r.get(raw, "mountNfs", "", bool, True)
    data_stack = r.get(raw, "dataStack", "", str, None)
    if data_stack is not None and not _STACK_REF.match(data_stack):
        r.bad(
            "dataStack",
            data_stack,
            "a fully qualified stack name <organization>/<project>/<stack>, e.g. "
            "acme/azure-horovod-training-data/dev; leave it out to use the data stack of the same name",
        )
    clusters = read_clusters(r, raw, today)
    max_gpus = r.get(raw, "maxTotalGpus", "", int, 64)
    max_nodes = r.get(raw, "maxTotalNodes", "", int, 32)
    if clusters and max_gpus is not None:
        total = sum(c.max_nodes * c.size.gpus for c in clusters)
        if total > max_gpus:
            r.bad(
                "clusters",
                [f"{c.name}: {c.max_nodes} x {c.size.gpus} GPUs" for c in clusters if c.size.gpus],
                f"together they can scale to {total} GPUs, above maxTotalGpus = {max_gpus}; lower maxNodes or "
                "raise maxTotalGpus (and your subscription's quota) deliberately",
            )
    if clusters and max_nodes is not None:
        nodes = sum(c.max_nodes for c in clusters)
        if nodes > max_nodes:
            r.bad(
                "clusters",
                f"{nodes} nodes at most",
                f"above maxTotalNodes = {max_nodes}; lower maxNodes or raise maxTotalNodes",
            )
        if network is not None:
            usable = ipaddress.IPv4Network(network.compute_subnet_cidr).num_addresses - 5  # Azure keeps 5
            if nodes > usable:
                r.bad(
                    "network.computeSubnetCidr",
                    network.compute_subnet_cidr,
                    f"has {usable} usable addresses for up to {nodes} nodes; use a larger subnet",
                )
    build = image_build_cluster(r, raw, clusters)
    ws_public = r.get(raw, "workspacePublicAccess", "", bool, True)
    acr_public = r.get(raw, "registryPublicAccess", "", bool, True)
    kv_public = r.get(raw, "keyVaultPublicAccess", "", bool, True)
    tags = r.get(raw, "tags", "", dict, {})
    if network is not None and network.restrict_outbound and acr_public is True:
        r.bad(
            "registryPublicAccess",
            acr_public,
            "network.restrictOutbound puts a service endpoint policy on the compute subnet that drops storage "
            "requests to any account it does not list, and a registry reached over its public endpoint serves the "
            "image layers from storage accounts the registry service owns (*.blob.core.windows.net), which no policy "
            "can list: the clusters could not pull the training images. Set registryPublicAccess: false (the "
            "registry then answers on its private endpoint, which the policy does not filter; images are pushed "
            "from inside the VNet, docs/private-access.md) or restrictOutbound: false",
        )
    access = read_access(r, raw, network, ws_public)
    if access is not None and access.private_dns_zones:
        central_zones_cover(r, access, ws_public, acr_public, kv_public, mount_nfs)
    quota_reader_role = r.get(raw, "quotaReaderRole", "", bool, True)
    # Unset with a private registry: refused once users names anyone but the deployer, whose object id only the
    # program reads (access.image_builder_problems).
    builders = read_principals(r, raw, "imageBuilders", "")
    if r.problems:
        raise ConfigError(r.problems)
    return PlatformConfig(
        stack=stack,
        subscription_id=subscription_id.lower(),
        prefix=prefix,
        location=location,
        network=network,
        clusters=clusters,
        workspace_public_access=ws_public,
        registry_public_access=acr_public,
        image_build_cluster=build,
        tags={"project": PROJECT, "stack": stack, **{str(k): str(v) for k, v in tags.items()}},
        key_vault_public_access=kv_public,
        data_stack=data_stack,
        users=users,
        mount_nfs=mount_nfs,
        warnings=tuple(r.warnings),
        access=access,
        image_builders=builders,
        quota_reader_role=quota_reader_role,
    )


def all_settings(project: str) -> dict[str, Any]:
    """Every key the stack sets for `project` (without the prefix), as Pulumi hands them to the program,
    with structured values parsed from their JSON: unknown ones included, so they can be refused."""
    import json

    from pulumi.runtime import config as runtime_config

    every = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw = {}
    for key, text in every.items():
        if not key.startswith(project + ":"):
            continue
        name = key.split(":", 1)[1]
        try:
            raw[name] = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            raw[name] = text
    return raw


def pulumi_settings(project: str) -> tuple[dict, str, str | None, str | None]:
    """The current stack's settings for `project`, its name, and its azure-native location and subscription:
    what `load` takes."""
    import pulumi

    provider = pulumi.Config("azure-native")
    return all_settings(project), pulumi.get_stack(), provider.get("location"), provider.get("subscriptionId")


def from_pulumi() -> PlatformConfig:
    """Read the current stack's config through Pulumi (the program's entry point)."""
    raw, stack, location, subscription = pulumi_settings(PROJECT)
    for secret in ("sshPublicKey", "jumpHostSshPublicKey"):
        raw.pop(secret, None)  # secrets, read by the entry point itself
    return load(raw, stack, location, subscription)
