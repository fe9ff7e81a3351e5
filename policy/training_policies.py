"""Policies for the training platform, as plain functions over (resource type, properties).

`__main__.py` wraps them in a pulumi-policy PolicyPack (`pulumi preview --policy-pack policy`); the
tests call the same functions on the resources the mocked program declares and on bad ones.
Properties are the engine's camelCase names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainingplatform import vm_sizes  # one catalog for config checks and policies (infra/pyproject.toml)

STORAGE = "azure-native:storage:StorageAccount"
REGISTRY = "azure-native:containerregistry:Registry"
VAULT = "azure-native:keyvault:Vault"
COMPUTE = "azure-native:machinelearningservices:Compute"
WORKSPACE = "azure-native:machinelearningservices:Workspace"
PRIVATE_ENDPOINT = "azure-native:network:PrivateEndpoint"
PRIVATE_ZONE = "azure-native:privatedns:PrivateZone"
ZONE_GROUP = "azure-native:network:PrivateDnsZoneGroup"
NSG = "azure-native:network:NetworkSecurityGroup"
DEFAULT_MAX_GPUS = 64
# The zones a workspace endpoint registers in (public cloud; Azure ML's how-to-custom-dns).
AML_ZONES = ("privatelink.api.azureml.ms", "privatelink.notebooks.azure.net")
# Resources that must have public network access off in the private profile (policy config privateProfile).
PRIVATE_PROFILE_TYPES = {
    REGISTRY: "container registry",
    VAULT: "Key Vault",
    WORKSPACE: "Azure ML workspace",
    STORAGE: "storage account",
}


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    resource_type: str
    check: Callable[[dict], str | None]  # props -> violation message or None
    mandatory: bool = True


def _nfs_behind_private_endpoint(p: dict) -> bool:
    return p.get("kind") == "FileStorage" and p.get("publicNetworkAccess") == "Disabled"


def _aml(p: dict) -> dict:
    return ((p.get("properties") or {}).get("properties")) or {}


def _storage_https(p):
    if p.get("enableHttpsTrafficOnly") is False and not _nfs_behind_private_endpoint(p):
        return (
            "storage accounts must require secure transfer (enableHttpsTrafficOnly); only a FileStorage "
            "account for NFS with publicNetworkAccess Disabled may turn it off"
        )


def _storage_tls(p):
    if p.get("minimumTlsVersion") not in ("TLS1_2", "TLS1_3"):
        return f"minimumTlsVersion is {p.get('minimumTlsVersion')!r}: set TLS1_2 or later"


def _storage_public_blob(p):
    if p.get("allowBlobPublicAccess") is not False:
        return "allowBlobPublicAccess must be false: training data and results are never anonymous"


def _storage_network(p):
    rules = p.get("networkRuleSet") or {}
    if rules.get("defaultAction") != "Deny" and p.get("publicNetworkAccess") != "Disabled":
        return (
            "storage must deny network access by default (networkRuleSet.defaultAction Deny) or disable public access"
        )


def _storage_shared_key(p):
    if p.get("allowSharedKeyAccess") is not False:
        return "allowSharedKeyAccess must be false: use Entra ID (managed identities, az login), not account keys"


def _acr_admin(p):
    if p.get("adminUserEnabled") is not False:
        return "the registry's admin user must be disabled: pulls use the compute identity's AcrPull role"


def _acr_premium(p):
    if (p.get("sku") or {}).get("name") != "Premium":
        return "the registry must be Premium (network rules, private link)"


def _vault(p):
    props = p.get("properties") or {}
    if props.get("enablePurgeProtection") is not True or props.get("enableRbacAuthorization") is not True:
        return "Key Vaults need purge protection and RBAC authorization"


def _compute_private(p):
    props = _aml(p)
    if props and props.get("enableNodePublicIp") is not False:
        return "compute nodes must have no public IP (enableNodePublicIp false) and sit in the VNet"
    if props and not (props.get("subnet") or {}).get("id"):
        return "compute clusters must be placed in the compute subnet"


def _compute_ssh(p):
    props = _aml(p)
    if props and (
        props.get("remoteLoginPortPublicAccess") != "Disabled"
        or (props.get("userAccountCredentials") or {}).get("adminUserSshPublicKey")
    ):
        return "SSH to compute nodes is on: keep it off unless debugging (sshEnabled in the stack config)"


def _compute_size(p, today: dt.date | None = None):
    size = vm_sizes.lookup(_aml(p).get("vmSize") or "")
    today = today or dt.date.today()
    if size and size.retired and size.retired <= today:
        return f"{size.name} was retired on {size.retired.isoformat()}; use one of {', '.join(size.successors)}"


RULES = [
    Rule(
        "storage-secure-transfer",
        "Storage accounts require HTTPS (NFS-only accounts behind a private endpoint excepted)",
        STORAGE,
        _storage_https,
    ),
    Rule("storage-min-tls-1-2", "Storage accounts accept TLS 1.2 or later only", STORAGE, _storage_tls),
    Rule("storage-no-public-blob-access", "No anonymous blob access", STORAGE, _storage_public_blob),
    Rule("storage-network-deny-by-default", "Storage firewalls deny by default", STORAGE, _storage_network),
    Rule("storage-no-shared-keys", "Storage uses Entra ID, not account keys", STORAGE, _storage_shared_key),
    Rule("registry-admin-user-disabled", "Container registry admin user off", REGISTRY, _acr_admin),
    Rule("registry-premium", "Container registry is Premium", REGISTRY, _acr_premium),
    Rule("keyvault-purge-protection-rbac", "Key Vault purge protection and RBAC", VAULT, _vault),
    Rule("compute-no-public-ip", "Compute nodes have no public IP and sit in the VNet", COMPUTE, _compute_private),
    Rule("compute-current-vm-size", "Compute uses no retired VM size", COMPUTE, _compute_size),
    Rule("compute-ssh-disabled", "SSH to nodes is off", COMPUTE, _compute_ssh, mandatory=False),
]


def total_gpus(resources: Iterable[tuple[str, dict]]) -> int:
    total = 0
    for resource_type, props in resources:
        if resource_type == COMPUTE:
            props_ = _aml(props)
            size = vm_sizes.lookup(props_.get("vmSize") or "")
            nodes = int(((props_.get("scaleSettings") or {}).get("maxNodeCount")) or 0)
            total += nodes * (size.gpus if size else 0)
    return total


def check_gpu_budget(resources: Iterable[tuple[str, dict]], max_gpus: int = DEFAULT_MAX_GPUS) -> str | None:
    total = total_gpus(resources)
    if total > max_gpus:
        return (
            f"the clusters can scale to {total} GPUs, above this stack's cap of {max_gpus}: lower maxNodes, "
            "or raise the policy's maxGpus deliberately"
        )


def check_workspace_endpoint(resources: Iterable[tuple[str, dict]]) -> str | None:
    """Clusters without node public IP need the workspace's private endpoint and its DNS zones.

    Azure ML refuses them otherwise ("Provided EnableNodePublicIp 'False' requires workspace private
    endpoint"; how-to-secure-training-vnet: "You must use a workspace private endpoint").
    """
    resources = list(resources)
    private_nodes = [p for t, p in resources if t == COMPUTE and _aml(p).get("enableNodePublicIp") is False]
    if not private_nodes:
        return None
    endpoint = any(
        t == PRIVATE_ENDPOINT
        and any("amlworkspace" in (c.get("groupIds") or []) for c in p.get("privateLinkServiceConnections") or [])
        for t, p in resources
    )
    if not endpoint:
        return (
            "compute clusters without node public IP need a workspace private endpoint (group amlworkspace) "
            "in the VNet: Azure ML refuses to create them otherwise"
        )
    zones = {p.get("privateZoneName") for t, p in resources if t == PRIVATE_ZONE}
    # Hub mode with the hub's own zones (access.privateDnsZoneIds): the stack declares none, its zone groups name
    # existing zones by id (.../privateDnsZones/<zone name>).
    zones |= {
        c["privateDnsZoneId"].rsplit("/", 1)[-1].lower()
        for t, p in resources
        if t == ZONE_GROUP
        for c in p.get("privateDnsZoneConfigs") or []
        if isinstance(c.get("privateDnsZoneId"), str) and "/privatednszones/" in c["privateDnsZoneId"].lower()
    }
    missing = [z for z in AML_ZONES if z not in zones]
    if missing:
        return (
            f"the workspace private endpoint needs the private DNS zones {', '.join(missing)} linked to the "
            "VNet, or nodes resolve the workspace to its public address"
        )


def check_private_profile(resource_type: str, props: dict) -> str | None:
    """In the private profile, the registry, Key Vault, workspace and storage accounts take no traffic from the
    internet."""
    if resource_type not in PRIVATE_PROFILE_TYPES:
        return None
    value = ((props.get("properties") or {}) if resource_type == VAULT else props).get("publicNetworkAccess")
    if value != "Disabled":
        return (
            f"the {PRIVATE_PROFILE_TYPES[resource_type]} has publicNetworkAccess {value!r} in the private "
            "profile: set it to Disabled (registryPublicAccess / keyVaultPublicAccess / workspacePublicAccess: "
            "false in the stack config, which brings its private endpoint; for the data stack's accounts: no "
            "allowedClientIps)"
        )


def _denies_internet_outbound(rule: dict) -> bool:
    return (
        rule.get("direction") == "Outbound"
        and rule.get("access") == "Deny"
        and rule.get("destinationAddressPrefix") in ("Internet", "*", "0.0.0.0/0")
        and rule.get("destinationPortRange") == "*"
        and rule.get("protocol") == "*"
    )


def _allows_internet_outbound(rule: dict) -> bool:
    destinations = [rule.get("destinationAddressPrefix"), *(rule.get("destinationAddressPrefixes") or [])]
    return (
        rule.get("direction") == "Outbound"
        and rule.get("access") == "Allow"
        and any(d in ("Internet", "*", "0.0.0.0/0") for d in destinations)
    )


def check_outbound_deny(resource_type: str, props: dict) -> str | None:
    """In the private profile every NSG ends its outbound rules with a deny of the internet (restrictOutbound),
    and no allow rule before it reopens the internet as a whole.

    NSG rules are processed in priority order, lowest number first, and processing stops at the first match
    (https://learn.microsoft.com/azure/virtual-network/network-security-groups-overview#security-rules); the
    default AllowInternetOutBound (65001) admits everything that no rule of ours denies first."""
    if resource_type != NSG:
        return None
    rules = props.get("securityRules") or []
    denies = [r for r in rules if _denies_internet_outbound(r)]
    if not denies:
        return (
            "the network security group has no outbound rule denying the Internet in the private profile: set "
            "network.restrictOutbound: true, which adds it after Azure ML's documented service tags"
        )
    first_deny = min(int(r.get("priority", 65000)) for r in denies)
    reopen = sorted(
        r.get("name", "?") for r in rules if _allows_internet_outbound(r) and int(r.get("priority", 65000)) < first_deny
    )
    if reopen:
        return (
            f"outbound rule(s) {', '.join(reopen)} allow the whole Internet before the deny "
            f"(priority {first_deny}): allow service tags, not Internet"
        )


def check_no_client_ips(resource_type: str, props: dict) -> str | None:
    """In the private profile no firewall admits a public client address: people come through the VNet."""
    if resource_type == STORAGE:
        ips = (props.get("networkRuleSet") or {}).get("ipRules") or []
        where = "the storage account's networkRuleSet.ipRules"
    elif resource_type == VAULT:
        ips = ((props.get("properties") or {}).get("networkAcls") or {}).get("ipRules") or []
        where = "the Key Vault's networkAcls.ipRules"
    elif resource_type == REGISTRY:
        ips = (props.get("networkRuleSet") or {}).get("ipRules") or []
        where = "the registry's networkRuleSet.ipRules"
    else:
        return None
    if ips:
        values = [i.get("iPAddressOrRange") or i.get("value") for i in ips]
        return (
            f"{where} admit {values} in the private profile: empty network.allowedClientIps (and the data "
            "stack's) and come in through the way in (docs/private-access.md)"
        )


def policies() -> list:
    """The rules as pulumi-policy objects (what the pack serves to `pulumi preview --policy-pack`)."""
    from pulumi_policy import EnforcementLevel, PolicyConfigSchema, ResourceValidationPolicy, StackValidationPolicy

    def resource_policy(rule: Rule) -> ResourceValidationPolicy:
        def validate(args, report_violation):
            if args.resource_type == rule.resource_type and (message := rule.check(args.props)):
                report_violation(message)

        return ResourceValidationPolicy(
            name=rule.name,
            description=rule.description,
            validate=validate,
            enforcement_level=EnforcementLevel.MANDATORY if rule.mandatory else EnforcementLevel.ADVISORY,
        )

    def gpu_budget(args, report_violation):
        max_gpus = int((args.get_config() or {}).get("maxGpus", DEFAULT_MAX_GPUS))
        message = check_gpu_budget(((r.resource_type, r.props) for r in args.resources), max_gpus)
        if message:
            report_violation(message)

    budget = StackValidationPolicy(
        name="gpu-budget",
        description="Cap on the GPUs all clusters together can scale to",
        validate=gpu_budget,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema(properties={"maxGpus": {"type": "integer", "default": DEFAULT_MAX_GPUS}}),
    )

    def workspace_endpoint(args, report_violation):
        message = check_workspace_endpoint((r.resource_type, r.props) for r in args.resources)
        if message:
            report_violation(message)

    endpoint = StackValidationPolicy(
        name="workspace-endpoint-for-private-nodes",
        description="Clusters without node public IP come with the workspace private endpoint and its DNS zones",
        validate=workspace_endpoint,
        enforcement_level=EnforcementLevel.MANDATORY,
    )

    def private_profile(args, report_violation):
        if (args.get_config() or {}).get("privateProfile") and (
            message := check_private_profile(args.resource_type, args.props)
        ):
            report_violation(message)

    private = ResourceValidationPolicy(
        name="no-public-network-access-in-private-profile",
        description="In the private profile (policy config privateProfile: true), registry, Key Vault, workspace "
        "and storage accounts have public network access disabled",
        validate=private_profile,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema(properties={"privateProfile": {"type": "boolean", "default": False}}),
    )

    def private_profile_policy(name: str, description: str, check) -> ResourceValidationPolicy:
        def validate(args, report_violation):
            if (args.get_config() or {}).get("privateProfile") and (message := check(args.resource_type, args.props)):
                report_violation(message)

        return ResourceValidationPolicy(
            name=name,
            description=description,
            validate=validate,
            enforcement_level=EnforcementLevel.MANDATORY,
            config_schema=PolicyConfigSchema(properties={"privateProfile": {"type": "boolean", "default": False}}),
        )

    outbound = private_profile_policy(
        "outbound-deny-in-private-profile",
        "In the private profile (policy config privateProfile: true), every NSG denies outbound Internet",
        check_outbound_deny,
    )
    client_ips = private_profile_policy(
        "no-client-ips-in-private-profile",
        "In the private profile, storage, Key Vault and registry firewalls admit no client IP addresses",
        check_no_client_ips,
    )
    return [*(resource_policy(r) for r in RULES), budget, endpoint, private, outbound, client_ips]
