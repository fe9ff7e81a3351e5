"""The private profile's additions to the platform, in one place for program.py: the storage egress
policy (egress.py) and the way in (wayin.py); the grants they and the studio need are access.py's.
"""

from __future__ import annotations

import pulumi

from . import naming
from .config import PlatformConfig, Principal
from .egress import StorageEgressPolicy, storage_account_id
from .network import PlatformNetwork
from .privatelink import PrivateDnsZones
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


def jump_host_problems(
    cfg: PlatformConfig, jump_host_ssh_public_key: pulumi.Input[str] | None, users: tuple[Principal, ...]
) -> list[str]:
    """What the way in's settings lack or contradict, found before anything is declared (program.py).

    jump_host_ssh_public_key: the `jumpHostSshPublicKey` secret, the jump host's own key (the clusters' is
    `sshPublicKey`): required with a jump host (its admin account takes a key only, never a password), refused
    without one. users: the principals with the user roles (`users`, else the deployer): jumpHostAdmins must be
    among them, since only they get the Reader roles Bastion's native client needs."""
    bastion = cfg.access is not None and cfg.access.mode == "bastion"
    problems = []
    if jump_host_ssh_public_key is not None and not bastion:
        problems.append(
            "jumpHostSshPublicKey is set, but only access.mode bastion declares a jump host: remove it "
            "(pulumi config rm jumpHostSshPublicKey) or declare the bastion (docs/private-access.md)"
        )
    if jump_host_ssh_public_key is None and bastion:
        problems.append(
            "jumpHostSshPublicKey is not set, and access.mode bastion declares a jump host whose admin account signs "
            "in with an SSH key only (people sign in with Entra ID; a password is never set): pulumi config set "
            '--secret jumpHostSshPublicKey "$(cat ~/.ssh/id_ed25519.pub)" (an RSA key works too; keep the private '
            "key as the break-glass credential, docs/private-access.md)"
        )
    if bastion:
        listed = {u.object_id for u in users}
        for i, admin in enumerate(cfg.access.jump_host_admins):
            if admin.object_id not in listed:
                problems.append(
                    f"access.jumpHostAdmins[{i}].objectId = {admin.object_id!r}: not one of the platform's users "
                    f"({', '.join(sorted(listed)) or 'users is empty'}); an admin is a user who also gets sudo on "
                    "the jump host: list them in users too"
                )
    return problems


def way_in(
    cfg: PlatformConfig,
    resource_group,
    net: PlatformNetwork,
    dns: PrivateDnsZones,
    tags: dict,
    jump_host_ssh_public_key: pulumi.Input[str] | None,
) -> WayIn | None:
    """jump_host_ssh_public_key: the `jumpHostSshPublicKey` secret (checked first by jump_host_problems)."""
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
