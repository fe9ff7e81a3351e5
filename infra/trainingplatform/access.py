"""Role assignments: who may do what, at the narrowest scope Azure allows.

- The compute identity reads data, writes outputs and pulls images, and nothing more.
- The workspace identity reads the two datastores (studio browsing).
- The platform's users (config `users`; default: whoever runs `pulumi up`) can submit jobs, upload data
  and browse outputs: with shared keys off and identity-based system datastores, azure-ai-ml uploads each
  job's code snapshot with the submitting user's own token, so the user needs data-plane roles on the
  workspace storage (learn.microsoft.com/azure/machine-learning/how-to-disable-local-auth-storage:
  "Storage Blob Data Contributor" and "Storage File Data Privileged Contributor"); Azure subscription
  Owner grants no data-plane access. They also query the stack's Log Analytics workspace (Log Analytics
  Reader there alone), where the cost ledger reads each job's status log.

Assignment names are GUIDs derived from (scope, principal, role definition, stack), like Azure's own
templates (`guid(scope, principalId, roleDefinitionId)`): Azure refuses to change the principal of an
existing assignment (RoleAssignmentUpdateNotPermitted), so a new principal must mean a new name.

Azure holds one assignment per (scope, principal, role): a second one under another name is refused
(RoleAssignmentExists), and deleting either stack's copy would revoke the access for both. So each grant
has exactly one owning stack: user access to the data and logs containers is the data stack's (its own
`users`), a platform stack grants only its own identities, and users only on its own resources. The stack
in the name keeps two stacks' names apart even so. Replacements delete first (`delete_before_replace`):
a renamed assignment of the same triple could not be created while the old one exists.

Who "users" are by default: whoever runs `pulumi up`, as a User. A service principal (CI) must list
`users` instead: Azure refuses an assignment whose principalType does not match (UnmatchedPrincipalType),
and the deployer's type cannot be read from getClientConfig (`deployer_users`).
"""

from __future__ import annotations

import json
import os
import pathlib
import uuid
from dataclasses import dataclass

import pulumi
import pulumiverse_time
from pulumi_azure_native import authorization

from .config import ConfigError, Principal

# Azure built-in role definition IDs (the same in every tenant), as Microsoft's "Azure built-in roles" page lists
# them (learn.microsoft.com/azure/role-based-access-control/built-in-roles; tests/infra/wayin_helpers.py quotes the rows).
ROLES = {
    "Storage Blob Data Reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "Storage File Data Privileged Contributor": "69566ab7-960f-475b-8e7c-b3118f30c6bd",
    "AzureML Data Scientist": "f6c7c914-8db3-469d-8ca1-694a8f32e121",
    "AcrPull": "7f951dda-4ed3-4680-a7ca-43fe172d538d",
    "AcrPush": "8311e382-0749-4cb8-b61a-304f252e45ec",
    # `az acr build`'s quick runs: "Provides the ability to manage ACR tasks"; it grants no push or pull itself.
    "Container Registry Tasks Contributor": "fb382eab-e894-4461-af04-94435c366c3f",
    "Reader": "acdd72a7-3385-48ef-bd42-f606fba81ae7",
    # Querying the stack's Log Analytics workspace (the cost ledger's status log, platform_grants assigns it there alone):
    # "Log Analytics Reader can view and search all monitoring data as well as and view monitoring settings"
    # ("Azure built-in roles for Monitor"): */read, workspaces/analytics/query/action, workspaces/search/action,
    # Microsoft.Support/*; notActions workspaces/sharedKeys/read (the agents' keys); no data actions.
    "Log Analytics Reader": "73c42c96-874c-492b-b04d-ab87d138a893",
    # Entra ID sign-in to the jump host: "login as administrator" (sudo) or "login as a regular user".
    "Virtual Machine Administrator Login": "1c0163c0-47e6-4577-8991-ea5c82e286e4",
    "Virtual Machine User Login": "fb879df8-f326-4884-b1cf-06f3ad86be52",
    # Starting the jump host after its evening auto-shutdown (private.py assigns it on the VM alone). Of the built-in
    # roles holding Microsoft.Compute/virtualMachines/start/action, the one whose Compute actions are only that and
    # reads ("Azure built-in roles for Compute", Desktop Virtualization Power On Contributor, ms.date 2025-01-10):
    #   "Microsoft.Compute/virtualMachines/start/action", "Microsoft.Compute/virtualMachines/read",
    #   "Microsoft.Compute/virtualMachines/instanceView/read"
    # No write, restart, deallocate, run command or extension rights on the VM. Its other actions
    # ("Microsoft.Insights/alertRules/*", "Microsoft.Resources/deployments/*", resource group read, Azure Arc /
    # Azure Stack HCI machines) act on resources that are not under a VM, so at the VM's scope they reach nothing.
    # Its description names its usual holder ("Provide permission to the Azure Virtual Desktop Resource Provider to
    # start virtual machines"); Azure RBAC does not tie a built-in role to one kind of principal. Rejected:
    # DevTest Labs User (also virtualMachines/restart/action and deallocate/action: any user could stop the shared
    # jump host under everyone else) and Virtual Machine Contributor (virtualMachines/*: run command, extensions,
    # reset access, so root on the VM).
    "Desktop Virtualization Power On Contributor": "489581de-a3bd-480d-9518-53dea7416b33",
}

# Fixed namespace for the assignment-name GUIDs: the same inputs give the same name on every machine.
_NAMESPACE = uuid.UUID("5b0f3c3e-7d55-4c6a-9a53-2f1d7c8e9b10")


@dataclass(frozen=True)
class Grant:
    label: str  # logical-name part; unique within one AccessGrants
    role: str  # a key of ROLES
    principal_id: pulumi.Input[str]
    scope: pulumi.Input[str]
    # "ServicePrincipal" | "User" | "Group": Azure needs it for principals created moments ago (managed
    # identities: replication delay) and refuses one that does not match the principal.
    principal_type: str = "ServicePrincipal"


def container_scope(account_id: pulumi.Input[str], container_name: pulumi.Input[str]) -> pulumi.Output[str]:
    return pulumi.Output.concat(account_id, "/blobServices/default/containers/", container_name)


def role_definition_id(subscription_id: pulumi.Input[str], role: str) -> pulumi.Output[str]:
    return pulumi.Output.concat(
        "/subscriptions/", subscription_id, "/providers/Microsoft.Authorization/roleDefinitions/", ROLES[role]
    )


def assignment_name(scope: str, principal_id: str, role_definition: str, stack: str) -> str:
    """guid(scope, principal, role, stack): a changed principal, role or scope gives a new assignment name."""
    return str(uuid.uuid5(_NAMESPACE, "|".join((scope.lower(), principal_id.lower(), role_definition.lower(), stack))))


# The azure-native provider's settings and environment variables that sign it in as a service principal or
# managed identity rather than through the Azure CLI's user login
# (https://www.pulumi.com/registry/packages/azure-native/installation-configuration/).
_SP_SETTINGS = ("clientId", "clientSecret", "clientCertificatePath", "useMsi", "useOidc", "oidcToken")
SP_ENVIRONMENT = (
    "ARM_CLIENT_ID",
    "ARM_CLIENT_SECRET",
    "ARM_CLIENT_CERTIFICATE_PATH",
    "ARM_USE_MSI",
    "ARM_USE_OIDC",
    "ARM_OIDC_TOKEN",
)


def azure_cli_account(subscription_id: str | None) -> dict | None:
    """The Azure CLI's account for the subscription (else its default one), from azureProfile.json in
    $AZURE_CONFIG_DIR or ~/.azure: the login the provider uses when none of the settings above is given.
    `az login --service-principal` and `az login --identity` record it with user.type "servicePrincipal"
    (azure-cli's _profile.py); `az login` as a person, "user"."""
    folder = pathlib.Path(os.environ.get("AZURE_CONFIG_DIR") or pathlib.Path.home() / ".azure")
    try:
        accounts = json.loads((folder / "azureProfile.json").read_text(encoding="utf-8-sig")).get("subscriptions")
    except (OSError, ValueError, AttributeError):
        return None  # no CLI login here: the provider then fails with its own sign-in message
    accounts = [a for a in accounts or [] if isinstance(a, dict)]
    wanted = (subscription_id or "").lower()
    matching = [a for a in accounts if wanted and str(a.get("id", "")).lower() == wanted] or accounts
    return next((a for a in matching if a.get("isDefault")), matching[0] if matching else None)


def signed_in_as_service_principal() -> list[str]:
    """How the deployment signs in as a service principal: provider settings, environment variables, or the Azure
    CLI's login (empty: a person's login)."""
    provider = pulumi.Config("azure-native")
    found = [f"azure-native:{k}" for k in _SP_SETTINGS if provider.get(k) not in (None, "", "false")]
    found += [k for k in SP_ENVIRONMENT if os.environ.get(k) not in (None, "", "false")]
    if not found:  # the provider falls back to the Azure CLI's login
        user = (azure_cli_account(provider.get("subscriptionId")) or {}).get("user") or {}
        if str(user.get("type", "")).lower() == "serviceprincipal":
            found.append(
                f"the Azure CLI's login as {user.get('name') or 'a service principal'} (az login --service-principal or --identity)"
            )
    return found


def deployer_users(users: tuple[Principal, ...] | None, project: str) -> tuple[Principal, ...]:
    """The principals that get user roles. Call before declaring anything: refuses a service principal
    deployment without `users` (its assignments would be sent as principalType User and fail mid-`up`)."""
    if users is not None:
        return users
    service = signed_in_as_service_principal()
    if service:
        raise ConfigError(
            [
                f"users is not set, so the user roles would go to whoever runs `pulumi up`, as a User; this deployment "
                f"signs in as a service principal ({', '.join(service)}), and Azure refuses a role assignment whose "
                "principalType does not match (UnmatchedPrincipalType): list the people explicitly, e.g. "
                f"`pulumi config set --path '{project}:users[0].objectId' <object id>` and "
                f"`pulumi config set --path '{project}:users[0].type' User` (Group for a group; add the service "
                "principal itself with type ServicePrincipal if it needs the roles)"
            ]
        )
    deployer = authorization.get_client_config().object_id.lower()  # as reader.read_principals writes listed ids
    return (Principal(object_id=deployer, type="User"),)


def image_builder_problems(cfg, users: tuple[Principal, ...]) -> list[str]:
    """Refuses a private registry without `imageBuilders` once `users` names anyone but the deployer: every user
    would get AcrPush (platform_grants), so any of them could replace the image every job and every resume runs.
    With the deployer alone (the default `users`) nobody else gets it. Call before declaring anything."""
    if cfg.image_builders is not None or cfg.registry_public_access:
        return []
    deployer = authorization.get_client_config().object_id.lower()  # as reader.read_principals writes listed ids
    if all(u.object_id == deployer for u in users):
        return []
    return [
        "imageBuilders is not set and the registry is private, so every principal in users would get AcrPush and "
        "could replace the images every job runs: list who builds them, "
        f"imageBuilders: [{{objectId: <group id>, type: Group}}] in Pulumi.{cfg.stack}.yaml (docs/private-access.md, "
        '"Images")'
    ]


def platform_grants(
    cfg, users: tuple[Principal, ...], job_identity, ws, registry, data, way_in, data_links
) -> list[Grant]:
    """Every grant of the platform stack (program.py declares them in one AccessGrants): its identities', and its
    users' on its own resources only. Their access to the data and logs containers is the data stack's grant (its
    `users`): two platforms on one data stack would otherwise both claim the same (scope, principal, role), which
    Azure holds once (above). data_links: the data accounts' private endpoints this stack declares (none with
    access.dataEndpointRecords another-platform)."""
    workspace_identity = ws.workspace.identity.apply(lambda i: i.principal_id)
    data_scope = container_scope(data.data_account.id, data.data_container.name)
    logs_scope = container_scope(data.logs_account.id, data.logs_container.name)
    acr = registry.registry.id
    grants = [
        Grant("compute-reads-data", "Storage Blob Data Reader", job_identity, data_scope),
        Grant("compute-writes-logs", "Storage Blob Data Contributor", job_identity, logs_scope),
        Grant("compute-pulls-images", "AcrPull", job_identity, acr),
        # Jobs upload code snapshots to and read them from the workspace's own storage.
        Grant("compute-workspace-storage", "Storage Blob Data Contributor", job_identity, ws.storage.id),
        # The workspace identity browses the datastores in the studio.
        Grant("workspace-reads-data", "Storage Blob Data Reader", workspace_identity, data_scope),
        Grant("workspace-reads-logs", "Storage Blob Data Reader", workspace_identity, logs_scope),
    ]
    for u in users:
        label = f"user-{u.object_id}"  # from the object id alone: listing the deployer keeps the same resources
        grants += [
            # Submitting a job uploads its code snapshot to the workspace storage with the user's token
            # (blob), and the studio's file views need the file share (how-to-disable-local-auth-storage).
            Grant(f"{label}-workspace-blob", "Storage Blob Data Contributor", u.object_id, ws.storage.id, u.type),
            Grant(
                f"{label}-workspace-files",
                "Storage File Data Privileged Contributor",
                u.object_id,
                ws.storage.id,
                u.type,
            ),
            Grant(f"{label}-submits-jobs", "AzureML Data Scientist", u.object_id, ws.workspace.id, u.type),
            # The cost ledger's status log: AmlRunStatusChangedEvent, which the workspace's diagnostic setting sends
            # to the stack's Log Analytics workspace (workspace.py). Querying it, on that workspace alone.
            Grant(f"{label}-reads-status-log", "Log Analytics Reader", u.object_id, ws.logs.id, u.type),
            # Reading the registry's tags (the doctor's image check) and pulling a job's image to reproduce it:
            # AcrPull, and no more. Pushing is the builders' (below): a user who could push could overwrite the image
            # every job runs (learn.microsoft.com/azure/container-registry/container-registry-roles: AcrPush "Push
            # artifacts to or pull artifacts from a registry"; AcrPull "Pull artifacts from a registry").
            Grant(f"{label}-pulls-images", "AcrPull", u.object_id, acr, u.type),
        ]
    # Who builds and pushes the images (config imageBuilders). Absent with a private registry: the users, since
    # images are pushed from inside the VNet and every job pulls one (program.build has refused this unless the users
    # are the deployer alone: image_builder_problems); absent with a public one: nobody by this grant.
    builders = cfg.image_builders
    if builders is None and not cfg.registry_public_access:
        builders = users
    for b in builders or ():
        grants.append(Grant(f"builder-{b.object_id}-pushes-images", "AcrPush", b.object_id, acr, b.type))
        if cfg.registry_public_access:
            # `az acr build` (docs/images.md, the public profile's build) queues an ACR Tasks run, which AcrPush
            # does not allow: Container Registry Tasks Contributor (registries/scheduleRun/action and the runs'
            # logs). A private registry has no Tasks path (shared agents cannot reach it): docker push from the
            # jump host, AcrPush alone.
            grants.append(
                Grant(
                    f"builder-{b.object_id}-runs-builds",
                    "Container Registry Tasks Contributor",
                    b.object_id,
                    acr,
                    b.type,
                )
            )
    # Studio data preview over storage behind private endpoints: "the workspace managed identity ... Reader role for
    # the storage private endpoint(s)" (learn.microsoft.com/azure/machine-learning/how-to-enable-studio-virtual-network,
    # "Azure Storage Account"): the datastores' accounts and the workspace storage (not the NFS share: no datastore).
    studio_links = [*data_links[:2], *(link for k, link in ws.links.items() if k.startswith("storage"))]
    grants += [
        Grant(f"workspace-reads-{link.pulumi_resource_name}", "Reader", workspace_identity, link.endpoint.id)
        for link in studio_links
    ]
    if way_in is None or way_in.jump_host is None:
        return grants
    jump_host, admins = way_in.jump_host, {a.object_id for a in cfg.access.jump_host_admins}
    for u in users:
        label = f"user-{u.object_id}"
        # Bastion's native client (`az network bastion ssh`, learn.microsoft.com/azure/bastion/
        # connect-vm-native-client-linux, "Verify roles and ports"): "Reader role on the virtual machine.
        # Reader role on the NIC with private IP of the virtual machine. Reader role on the Azure Bastion
        # resource. Virtual Machine Administrator Login or Virtual Machine User Login role".
        # Entra ID sign-in (learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux): User
        # Login for "regular user privileges" ("Users who are assigned the VM User role won't be able to run
        # sudo"); Administrator Login, with sudo (the machine's upkeep; builds use rootless Docker), for
        # access.jumpHostAdmins only.
        login = "Virtual Machine Administrator Login" if u.object_id in admins else "Virtual Machine User Login"
        grants += [
            Grant(f"{label}-reads-jumphost", "Reader", u.object_id, jump_host.id, u.type),
            Grant(f"{label}-reads-jumphost-nic", "Reader", u.object_id, way_in.jump_host_nic.id, u.type),
            Grant(f"{label}-reads-bastion", "Reader", u.object_id, way_in.bastion.id, u.type),
            Grant(f"{label}-jumphost-login", login, u.object_id, jump_host.id, u.type),
            # The auto-shutdown (wayin.py) deallocates the jump host every evening; the first user of the day starts
            # it again (`az vm start`, Microsoft.Compute/virtualMachines/start/action). The narrowest built-in role
            # holding that action, on the VM alone (ROLES explains the choice).
            Grant(
                f"{label}-starts-jumphost",
                "Desktop Virtualization Power On Contributor",
                u.object_id,
                jump_host.id,
                u.type,
            ),
        ]
    return grants


class AccessGrants(pulumi.ComponentResource):
    """`assignments`: {label: RoleAssignment}, so that other resources can depend on a grant."""

    def __init__(
        self,
        name: str,
        subscription_id: pulumi.Input[str],
        stack: str,
        grants: list[Grant],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("trainingplatform:access:AccessGrants", name, None, opts)
        labels = [g.label for g in grants]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ValueError(f"duplicate grant labels {duplicates}: each grant needs its own label")
        self.assignments: dict[str, authorization.RoleAssignment] = {}
        for g in grants:
            definition = role_definition_id(subscription_id, g.role)
            self.assignments[g.label] = authorization.RoleAssignment(
                f"{name}-{g.label}",
                role_assignment_name=pulumi.Output.all(g.scope, g.principal_id, definition).apply(
                    lambda a: assignment_name(*a, stack)
                ),
                principal_id=g.principal_id,
                principal_type=g.principal_type,
                scope=g.scope,
                role_definition_id=definition,
                description=f"{g.role}: {g.label}",
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
        self.register_outputs({})


# ---- The quota reader role (config `quotaReaderRole`): the submission's quota check for the platform's users ----

# What the quota check reads (azurecheck/quota.py): Usages - List, Virtual Machine Sizes - List and Quotas - List,
# GETs under /subscriptions/{id}/providers/Microsoft.MachineLearningServices/locations/{location}/. Workspace roles
# (AzureML Data Scientist) cannot read them: they live at the subscription. Azure's permission for each, as "Azure
# permissions for AI + machine learning" lists them (learn.microsoft.com/azure/role-based-access-control/permissions/
# ai-machine-learning, Microsoft.MachineLearningServices), and nothing more: no write, no other provider.
QUOTA_READ_ACTIONS = (
    "Microsoft.MachineLearningServices/locations/usages/read",  # "Usage report for aml compute resources in a subscription"
    "Microsoft.MachineLearningServices/locations/vmsizes/read",  # "Get supported vm sizes"
    "Microsoft.MachineLearningServices/locations/quotas/read",  # "Gets the currently assigned Workspace Quotas based on VMFamily."
)


def quota_reader_role_name(prefix: str, stack: str, subscription_id: str) -> str:
    """A custom role's name is unique in the tenant (Azure refuses a second role of one name in a directory): one per
    stack and subscription."""
    return f"Azure ML quota reader ({prefix}-{stack}, subscription {subscription_id.lower()})"


def quota_reader_role_id(prefix: str, stack: str, subscription_id: str) -> str:
    """The role definition's name, a GUID as Azure requires: the same for a stack on every `up`, another per stack."""
    return str(uuid.uuid5(_NAMESPACE, "|".join(("quota-reader", subscription_id.lower(), prefix, stack))))


# A custom role just written is not yet known to every replica of Azure's authorization service: an assignment made
# at once can fail with RoleDefinitionDoesNotExist, and a role deleted at once after its assignments can fail with
# RoleDefinitionHasAssignments. The first `up` and the last `destroy` of every stack would meet it. A pause between
# them, in both directions: assignments wait after the role is created, the role waits after they are deleted.
# pulumiverse-time's Sleep (the `time` provider, a plugin Pulumi installs like azure-native's), not a dynamic
# provider of ours: the state then holds no pickled code of this package, so a venv without it still destroys it.
ROLE_SETTLE_SECONDS = {"create": 120, "delete": 60}


class QuotaReaders(pulumi.ComponentResource):
    """A custom role holding QUOTA_READ_ACTIONS at the subscription, assigned there to each of the platform's users.

    Declaring it needs Microsoft.Authorization/roleDefinitions/write on the subscription (Owner, User Access
    Administrator: not Role Based Access Control Administrator, which writes assignments only); preflight checks it
    (azurecheck/roles.py). Each stack defines its own role, so destroying one stack never takes another's away.
    `role_name` goes to the stack outputs, where the quota check names it."""

    def __init__(
        self,
        name: str,
        subscription_id: str,
        prefix: str,
        stack: str,
        users: tuple[Principal, ...],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("trainingplatform:access:QuotaReaders", name, None, opts)
        scope = f"/subscriptions/{subscription_id.lower()}"
        guid = quota_reader_role_id(prefix, stack, subscription_id)
        definition_id = f"{scope}/providers/Microsoft.Authorization/roleDefinitions/{guid}"
        self.role_name = quota_reader_role_name(prefix, stack, subscription_id)
        self.definition = authorization.RoleDefinition(
            f"{name}-role",
            role_definition_id=guid,
            scope=scope,
            role_name=self.role_name,
            description="Reads Azure ML's compute quota, usage and VM sizes in this subscription, and nothing else "
            f"(the submission's quota check; azure-horovod-training stack {stack})",
            role_type="CustomRole",
            permissions=[authorization.PermissionArgs(actions=list(QUOTA_READ_ACTIONS))],
            assignable_scopes=[scope],
            opts=pulumi.ResourceOptions(parent=self),
        )
        # Assignments wait until the new role has reached Azure's replicas (ROLE_SETTLE_SECONDS).
        # Its triggers: a replaced role (another id) is waited for again.
        self.settled = pulumiverse_time.Sleep(
            f"{name}-role-settled",
            create_duration=f"{ROLE_SETTLE_SECONDS['create']}s",
            destroy_duration=f"{ROLE_SETTLE_SECONDS['delete']}s",
            triggers={"after": self.definition.id},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.definition]),
        )
        self.assignments: dict[str, authorization.RoleAssignment] = {}
        for u in users:
            self.assignments[u.object_id] = authorization.RoleAssignment(
                f"{name}-user-{u.object_id}",
                role_assignment_name=assignment_name(scope, u.object_id, definition_id, stack),
                principal_id=u.object_id,
                principal_type=u.type,
                scope=scope,
                role_definition_id=definition_id,
                description=f"Azure ML quota reader: user-{u.object_id}",
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.settled], delete_before_replace=True),
            )
        self.register_outputs({})
