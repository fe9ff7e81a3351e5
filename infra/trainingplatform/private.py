"""The private profile's additions to the platform, in one place for program.py: the storage egress
policy (egress.py), the way in (wayin.py) and the grants they and the studio need.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from . import naming
from .access import Grant
from .config import PlatformConfig
from .egress import StorageEgressPolicy, storage_account_id
from .network import PlatformNetwork
from .privatelink import PrivateDnsZones, PrivateLink
from .registry import Registry
from .wayin import WayIn


def egress_policy(cfg: PlatformConfig, subscription_id, resource_group, suffix, data) -> StorageEgressPolicy | None:
    """With `restrictOutbound`, the compute subnet may reach only the stack's accounts and Azure ML's own
    (egress.py); without it outbound is open anyway and the policy would only break jobs that read other
    accounts."""
    if not cfg.network.restrict_outbound:
        return None
    # The workspace storage's name as workspace.py gives it (the id is built: see storage_account_id).
    ws_account = naming.storage_account(cfg.prefix, cfg.stack, "mlws", suffix)
    accounts = [
        storage_account_id(subscription_id, resource_group, ws_account),
        data.data_account.id,
        data.logs_account.id,
    ]
    if data.nfs is not None:
        accounts.append(data.nfs.apply(lambda n: n["account_id"]))
    return StorageEgressPolicy("egress", resource_group, cfg.location, accounts, cfg.tags)


def way_in(
    cfg: PlatformConfig,
    resource_group,
    net: PlatformNetwork,
    dns: PrivateDnsZones,
    tags: dict,
    jump_host_ssh_public_key: pulumi.Input[str] | None,
) -> WayIn | None:
    """jump_host_ssh_public_key: the `jumpHostSshPublicKey` secret, the jump host's own key (the clusters' is
    `sshPublicKey`): a key for a jump host that is not declared is refused rather than ignored."""
    if jump_host_ssh_public_key is not None and (cfg.access is None or cfg.access.mode != "bastion"):
        raise ValueError(
            "jumpHostSshPublicKey is set, but only access.mode bastion declares a jump host: remove it "
            "(pulumi config rm jumpHostSshPublicKey) or declare the bastion (docs/private-access.md)"
        )
    if cfg.access is None or cfg.access.mode == "none":
        return None
    return WayIn(
        "wayin",
        resource_group,
        cfg.location,
        cfg.access,
        net.vnet,
        net.private_endpoint_subnet,
        net.nat.id,
        dns,
        tags,
        jump_host_ssh_public_key,
    )


def grants(
    cfg: PlatformConfig,
    users: list[tuple[str, str, str]],
    workspace_identity,
    registry: Registry,
    way_in: WayIn | None,
    storage_links: Sequence[PrivateLink],
) -> list[Grant]:
    out = [
        # Studio data preview over storage behind private endpoints: "the workspace managed identity ... Reader
        # role for the storage private endpoint(s)" (learn.microsoft.com/azure/machine-learning/
        # how-to-enable-studio-virtual-network, "Azure Storage Account").
        Grant(f"workspace-reads-{link.pulumi_resource_name}", "Reader", workspace_identity, link.endpoint.id)
        for link in storage_links
    ]
    for label, principal, kind in users:
        if not cfg.registry_public_access:
            # Images are built and pushed from inside the VNet with the user's own token (docs/private-access.md):
            # `docker push` needs AcrPush (learn.microsoft.com/azure/container-registry/container-registry-roles).
            out.append(Grant(f"{label}-pushes-images", "AcrPush", principal, registry.registry.id, kind))
        if way_in is not None and way_in.jump_host is not None:
            # Entra ID SSH sign-in to the jump host, with sudo (Docker): "Virtual Machine Administrator Login"
            # (learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux).
            out.append(
                Grant(
                    f"{label}-jumphost-login",
                    "Virtual Machine Administrator Login",
                    principal,
                    way_in.jump_host.id,
                    kind,
                )
            )
    return out
