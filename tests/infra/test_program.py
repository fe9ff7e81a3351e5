"""The dev stack under mocks: the properties and relationships the platform depends on."""

import copy
import ipaddress
import uuid

import pytest
from infra_helpers import one

from trainingplatform import mocked

# Azure's built-in role ids, as Microsoft's "Azure built-in roles" page lists them (learn.microsoft.com/azure/
# role-based-access-control/built-in-roles; the role JSON's "name"), not taken from trainingplatform.access:
# a role definition id Azure does not know fails the assignment in the middle of `pulumi up`.
BUILT_IN_ROLES = {
    "Reader": "acdd72a7-3385-48ef-bd42-f606fba81ae7",
    "Storage Blob Data Reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "AcrPull": "7f951dda-4ed3-4680-a7ca-43fe172d538d",
}


def test_declares_every_part_of_the_platform(dev, dev_data):
    mocks, _ = dev
    types = {r.type.split(":", 1)[1] for r in mocks.resources}
    for needed in (
        "resources:ResourceGroup",
        "network:VirtualNetwork",
        "network:Subnet",
        "network:NetworkSecurityGroup",
        "network:NatGateway",
        "storage:StorageAccount",
        "network:PrivateEndpoint",
        "network:PrivateDnsZoneGroup",
        "privatedns:PrivateZone",
        "privatedns:VirtualNetworkLink",
        "containerregistry:Registry",
        "keyvault:Vault",
        "operationalinsights:Workspace",
        "applicationinsights:Component",
        "monitor:DiagnosticSetting",
        "machinelearningservices:Workspace",
        "machinelearningservices:Datastore",
        "machinelearningservices:Compute",
        "managedidentity:UserAssignedIdentity",
        "authorization:RoleAssignment",
        "pulumi:StackReference",
    ):
        assert needed in types, needed
    data_types = {r.type.split(":", 1)[1] for r in dev_data[0].resources if r.type.startswith("azure-native:")}
    assert data_types == {
        "resources:ResourceGroup",
        "storage:StorageAccount",
        "storage:BlobServiceProperties",
        "storage:BlobContainer",
        "storage:FileServiceProperties",
        "storage:FileShare",
        "storage:ManagementPolicy",
        "authorization:RoleAssignment",
    }  # users' data access
    # The durable data is the data stack's alone: the platform declares none of it.
    assert not {"storage:BlobContainer", "storage:FileShare"} & types


def test_storage_accounts(dev, dev_data):
    data_mocks, data_out = dev_data
    data = one(data_mocks, "StorageAccount", "storage-data").inputs
    logs = one(data_mocks, "StorageAccount", "storage-logs").inputs
    assert (data["kind"], data["sku"]["name"]) == ("BlockBlobStorage", "Premium_LRS")
    assert (logs["kind"], logs["sku"]["name"]) == ("StorageV2", "Standard_LRS")
    workspace_storage = one(dev[0], "StorageAccount", "ml-storage").inputs
    for acct in (data, logs, workspace_storage):
        assert acct["enableHttpsTrafficOnly"] is True
        assert acct["minimumTlsVersion"] == "TLS1_2"
        assert acct["allowBlobPublicAccess"] is False
        assert acct["allowSharedKeyAccess"] is False
        assert acct["networkRuleSet"]["defaultAction"] == "Deny"
    # The data accounts outlive the platform: no rule may name a VNet of a platform life; dev lists no
    # client IPs, so they take no public traffic at all.
    for acct in (data, logs):
        assert acct["networkRuleSet"]["virtualNetworkRules"] == [] and acct["networkRuleSet"]["ipRules"] == []
        assert acct["publicNetworkAccess"] == "Disabled"
    compute_subnet = one(dev[0], "Subnet", "net-compute").id
    # The endpoints' subnet too: the studio needs the storage service endpoint in the workspace endpoint's subnet
    # (how-to-enable-studio-virtual-network, "Limitations"; test_wayin_services.py).
    endpoint_subnet = one(dev[0], "Subnet", "net-endpoints").id
    assert [v["virtualNetworkResourceId"] for v in workspace_storage["networkRuleSet"]["virtualNetworkRules"]] == [
        compute_subnet,
        endpoint_subnet,
    ]
    svc = one(data_mocks, "BlobServiceProperties", "storage-data-blob-service").inputs
    # Soft delete on, for blobs and containers alike, within Azure's "between 1 and 365 days"
    # (learn.microsoft.com/azure/storage/blobs/soft-delete-blob-overview, "retention period").
    for policy in (svc["deleteRetentionPolicy"], svc["containerDeleteRetentionPolicy"]):
        assert policy["enabled"] is True and 1 <= policy["days"] <= 365, policy
    assert one(data_mocks, "BlobContainer", "storage-data-container").inputs["publicAccess"] == "None"


def test_client_ips_open_the_data_accounts_to_those_addresses_only(dev_data_raw):
    raw, location = copy.deepcopy(dev_data_raw[0]), dev_data_raw[1]
    raw["allowedClientIps"] = ["20.50.2.7", "52.168.0.0/24"]
    mocks, _ = mocked.run_data(raw, "dev", location)
    for name in ("storage-data", "storage-logs"):
        acct = one(mocks, "StorageAccount", name).inputs
        assert acct["publicNetworkAccess"] == "Enabled" and acct["networkRuleSet"]["defaultAction"] == "Deny"
        assert [r["iPAddressOrRange"] for r in acct["networkRuleSet"]["ipRules"]] == ["20.50.2.7", "52.168.0.0/24"]
    assert one(mocks, "StorageAccount", "nfs-account").inputs["publicNetworkAccess"] == "Disabled"


def _endpoint_to(mocks, target_id):
    found = [
        r
        for r in mocks.of_type("PrivateEndpoint")
        if r.inputs["privateLinkServiceConnections"][0]["privateLinkServiceId"] == target_id
    ]
    assert len(found) == 1, target_id
    return found[0]


def test_compute_reaches_the_data_through_private_endpoints_of_its_own_vnet(dev, dev_data):
    mocks, outputs = dev
    data_mocks, data_out = dev_data
    endpoint_subnet = one(mocks, "Subnet", "net-endpoints").id
    vnet = one(mocks, "VirtualNetwork", "net-vnet").id
    zone_of = {r.id: r.inputs["privateZoneName"] for r in mocks.of_type("PrivateZone")}
    linked = {
        r.inputs["privateZoneName"]
        for r in mocks.of_type("VirtualNetworkLink")
        if r.inputs["virtualNetwork"]["id"] == vnet
    }
    for account, group, zone in (
        ("storage-data", "blob", "privatelink.blob.core.windows.net"),
        ("storage-logs", "blob", "privatelink.blob.core.windows.net"),
        ("nfs-account", "file", "privatelink.file.core.windows.net"),
    ):
        pe = _endpoint_to(mocks, one(data_mocks, "StorageAccount", account).id)
        assert pe.inputs["subnet"]["id"] == endpoint_subnet
        assert pe.inputs["privateLinkServiceConnections"][0]["groupIds"] == [group]
        # Azure writes the endpoint's A record into the zones of its DNS zone group; the VNet sees the
        # record only through a zone linked to it.
        zone_groups = [
            r.inputs for r in mocks.of_type("PrivateDnsZoneGroup") if r.inputs["privateEndpointName"] == pe.name
        ]
        assert [zone_of[c["privateDnsZoneId"]] for g in zone_groups for c in g["privateDnsZoneConfigs"]] == [zone]
        assert zone in linked
    acct = one(data_mocks, "StorageAccount", "nfs-account").inputs
    assert acct["kind"] == "FileStorage" and acct["publicNetworkAccess"] == "Disabled"
    assert acct["networkRuleSet"]["defaultAction"] == "Deny"
    share = one(data_mocks, "FileShare", "nfs-share").inputs
    # Premium file shares (NFS needs them) take 100 GiB to 100 TiB (learn.microsoft.com/azure/storage/files/
    # understanding-billing, "Provisioned v1": minimum 100 GiB; storage-files-scale-targets: 102,400 GiB).
    assert share["enabledProtocols"] == "NFS" and 100 <= share["shareQuota"] <= 102400
    name = acct["accountName"]
    assert (
        outputs["nfs"]["mount_target"]
        == f"{name}.file.core.windows.net:/{name}/shared"
        == data_out["nfs"]["mount_target"]
    )


def test_platform_and_data_stack_must_fit(dev_raw, dev_data):
    _, data_out = dev_data
    raw, location = dev_raw
    with pytest.raises(Exception, match="is in westeurope, this platform in northeurope: set azure-native:location"):
        mocked.run(copy.deepcopy(raw), "dev", "northeurope", data_outputs=data_out)
    with pytest.raises(Exception, match="has no NFS share .* `pulumi config set mountNfs false`"):
        mocked.run(copy.deepcopy(raw), "dev", location, data_outputs=dict(data_out, nfs=None))
    mocks, outputs = mocked.run(
        dict(copy.deepcopy(raw), mountNfs=False), "dev", location, data_outputs=dict(data_out, nfs=None)
    )
    assert outputs["nfs"] is None
    assert not [
        r
        for r in mocks.of_type("PrivateEndpoint")
        if r.inputs["privateLinkServiceConnections"][0]["groupIds"] == ["file"]
    ]


def test_the_platform_reads_the_data_stack_of_its_name_unless_told(dev, dev_raw, dev_data):
    mocks, outputs = dev
    refs = [r.inputs["name"] for r in mocks.of_type("StackReference")]
    assert refs == ["organization/azure-horovod-training-data/dev"] == [outputs["data_stack"]]
    raw = dict(copy.deepcopy(dev_raw[0]), dataStack="acme/azure-horovod-training-data/shared")
    mocks, outputs = mocked.run(raw, "dev", dev_raw[1], data_outputs=dev_data[1])
    assert [r.inputs["name"] for r in mocks.of_type("StackReference")] == ["acme/azure-horovod-training-data/shared"]


def test_network_isolation(dev):
    mocks, outputs = dev
    compute = one(mocks, "Subnet", "net-compute").inputs
    assert compute["networkSecurityGroup"]["id"] == one(mocks, "NetworkSecurityGroup", "net-compute-nsg").id
    assert compute["natGateway"]["id"] == one(mocks, "NatGateway", "net-nat").id
    assert compute["defaultOutboundAccess"] is False
    rules = one(mocks, "NetworkSecurityGroup", "net-compute-nsg").inputs["securityRules"]
    # dev: the NSG filters inbound only (outbound rules and the private profile: tests/infra/test_network.py)
    assert [r for r in rules if r["direction"] == "Outbound"] == []
    assert any(
        r["direction"] == "Inbound" and r["access"] == "Deny" and r["sourceAddressPrefix"] == "Internet" for r in rules
    )
    # Azure refuses a subnet outside its VNet's address space or overlapping another subnet; the nodes' Docker
    # bridge takes 172.17.0.0/16, so the VNet must stay clear of it.
    vnet = one(mocks, "VirtualNetwork", "net-vnet").inputs
    (space,) = map(ipaddress.ip_network, vnet["addressSpace"]["addressPrefixes"])
    subnets = [ipaddress.ip_network(r.inputs["addressPrefix"]) for r in mocks.of_type("Subnet")]
    assert subnets and all(s.subnet_of(space) for s in subnets), (space, subnets)
    assert not any(a.overlaps(b) for i, a in enumerate(subnets) for b in subnets[i + 1 :]), subnets
    assert not space.overlaps(ipaddress.ip_network("172.17.0.0/16"))
    assert outputs["nat_public_ip"]


def test_registry_and_workspace(dev, dev_data):
    mocks, outputs = dev
    acr = one(mocks, "Registry", "registry-acr")
    assert acr.inputs["sku"]["name"] == "Premium" and acr.inputs["adminUserEnabled"] is False
    ws = one(mocks, "machinelearningservices:Workspace", "ml-workspace").inputs
    assert ws["keyVault"] == one(mocks, "Vault", "ml-kv").id
    assert ws["applicationInsights"] == one(mocks, "Component", "ml-insights").id
    assert ws["storageAccount"] == one(mocks, "StorageAccount", "ml-storage").id
    assert ws["containerRegistry"] == acr.id
    # The build cluster's Azure ML name, not its config name (test_replacements: image builds name a cluster).
    assert ws["imageBuildCompute"] == one(mocks, "Compute", "compute-cpu-smoke").inputs["computeName"]
    assert ws["identity"]["type"] == "SystemAssigned"
    insights = one(mocks, "Component", "ml-insights").inputs
    assert insights["workspaceResourceId"] == one(mocks, "operationalinsights:Workspace", "ml-log-analytics").id
    kv = one(mocks, "Vault", "ml-kv").inputs["properties"]
    assert kv["enablePurgeProtection"] and kv["enableRbacAuthorization"]
    # Soft-deleted names: the random suffix is part of both.
    assert "x7k2q" in ws["workspaceName"] and one(mocks, "Vault", "ml-kv").inputs["vaultName"].endswith("x7k2q")
    stores = {r.inputs["name"]: r.inputs["properties"] for r in mocks.of_type("Datastore")}
    assert stores["training_data"]["credentials"]["credentialsType"] == "None"  # identity-based
    # The datastore names the data stack's training-data container (not a name of its own).
    data_container = one(dev_data[0], "BlobContainer", "storage-data-container").inputs["containerName"]
    assert stores["training_data"]["containerName"] == data_container
    assert stores["training_logs"]["accountName"] == outputs["datastores"]["logs"]["account"]


def test_the_workspace_sends_its_run_status_log_to_the_stacks_log_analytics_workspace(dev):
    # The cost ledger (launcher/cost) reads every status change of a job from the table AmlRunStatusChangedEvent.
    # Microsoft's supported logs for Microsoft.MachineLearningServices/workspaces: category `AmlRunStatusChangedEvent`,
    # log table AmlRunStatusChangedEvent ("Azure Machine Learning services run status event logs"). That table, not
    # AzureDiagnostics, is resource-specific mode: Diagnostic Settings' logAnalyticsDestinationType "Dedicated" (null:
    # "the default destination type, i.e. AzureDiagnostics").
    mocks, outputs = dev
    (setting,) = mocks.of_type("monitor:DiagnosticSetting")
    logs = one(mocks, "operationalinsights:Workspace", "ml-log-analytics")
    assert setting.inputs["resourceUri"] == one(mocks, "machinelearningservices:Workspace", "ml-workspace").id
    assert setting.inputs["workspaceId"] == logs.id
    assert setting.inputs["logAnalyticsDestinationType"] == "Dedicated"
    assert setting.inputs["logs"] == [{"category": "AmlRunStatusChangedEvent", "enabled": True}], "that category only"
    assert not setting.inputs.get("metrics"), "no metrics: nothing reads them"
    assert not {"storageAccountId", "eventHubAuthorizationRuleId", "eventHubName"} & setting.inputs.keys()
    assert setting.inputs["name"] == "run-status-to-log-analytics"
    # Declared in the workspace component (it goes with the workspace), with no replacement options of its own.
    opts = mocks.options[setting.name]
    assert opts.parent is not None and opts.parent.pulumi_resource_name == "ml"
    assert not opts.replace_on_changes and not opts.delete_before_replace and not opts.protect
    # The ledger finds the workspace through the stack outputs: its customerId, the id the Log Analytics query API
    # takes (POST /v1/workspaces/{workspaceId}/query: "Workspace ID from the Properties blade"), not its ARM id.
    assert outputs["status_log_workspace_id"] == mocked.log_analytics_customer_id(logs.id)
    assert str(uuid.UUID(outputs["status_log_workspace_id"])) == outputs["status_log_workspace_id"]


def test_clusters(dev):
    mocks, outputs = dev
    identity = one(mocks, "UserAssignedIdentity", "compute-identity")
    subnet = one(mocks, "Subnet", "net-compute").id
    gpu = one(mocks, "Compute", "compute-gpu-ib").inputs
    props = gpu["properties"]["properties"]
    assert props["vmSize"] == "Standard_ND96asr_v4" and props["vmPriority"] == "LowPriority"
    assert props["enableNodePublicIp"] is False and props["remoteLoginPortPublicAccess"] == "Disabled"
    assert props["subnet"]["id"] == subnet
    assert props["scaleSettings"] == {"minNodeCount": 0, "maxNodeCount": 2, "nodeIdleTimeBeforeScaleDown": "PT600S"}
    assert gpu["identity"] == {"type": "UserAssigned", "userAssignedIdentities": [identity.id]}
    assert outputs["clusters"]["gpu-ib"]["gpus_per_node"] == 8 and outputs["clusters"]["gpu-ib"]["infiniband"] is True
    assert outputs["clusters"]["cpu-smoke"]["gpus_per_node"] == 0


def test_compute_identity_gets_exactly_read_data_write_logs_pull_images(dev, dev_data):
    mocks, _ = dev
    principal = "principal-compute-identity"  # the principalId the mocks give the compute identity
    grants = {
        (r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"])
        for r in mocks.of_type("RoleAssignment")
        if r.inputs["principalId"] == principal
    }
    data = one(dev_data[0], "StorageAccount", "storage-data").id
    logs = one(dev_data[0], "StorageAccount", "storage-logs").id
    assert grants == {
        (BUILT_IN_ROLES["Storage Blob Data Reader"], f"{data}/blobServices/default/containers/training-data"),
        (BUILT_IN_ROLES["Storage Blob Data Contributor"], f"{logs}/blobServices/default/containers/logs"),
        (BUILT_IN_ROLES["AcrPull"], one(mocks, "Registry", "registry-acr").id),
        (BUILT_IN_ROLES["Storage Blob Data Contributor"], one(mocks, "StorageAccount", "ml-storage").id),
    }
    workspace = {
        (r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"])
        for r in mocks.of_type("RoleAssignment")
        if r.inputs["principalId"] == "principal-ml-workspace"
    }
    assert workspace == {
        (BUILT_IN_ROLES["Storage Blob Data Reader"], f"{data}/blobServices/default/containers/training-data"),
        (BUILT_IN_ROLES["Storage Blob Data Reader"], f"{logs}/blobServices/default/containers/logs"),
        # Studio data preview through the storage private endpoints (test_wayin_services.py)
        (BUILT_IN_ROLES["Reader"], one(mocks, "PrivateEndpoint", "data-blob-endpoint").id),
        (BUILT_IN_ROLES["Reader"], one(mocks, "PrivateEndpoint", "logs-blob-endpoint").id),
    }
    for r in mocks.of_type("RoleAssignment"):
        if r.inputs["principalId"] in (principal, "principal-ml-workspace"):
            assert r.inputs["principalType"] == "ServicePrincipal"  # managed identities


def test_outputs_are_complete_and_hold_no_secrets(dev):
    _, outputs = dev
    for key in (
        "subscription_id",
        "resource_group",
        "workspace_name",
        "registry_login_server",
        "clusters",
        "datastores",
        "nfs",
        "compute_identity_client_id",
        "location",
        "status_log_workspace_id",
    ):
        assert outputs.get(key), key
    text = repr(outputs).lower()
    for secret_word in ("key", "password", "connectionstring", "sas"):
        assert secret_word not in text.replace("keyvault", ""), secret_word


def test_a_clusters_description_names_its_gpus_or_its_cpus(dev):
    """The cluster summary the dev stack declares (the AmlCompute description, shown in the studio and in
    infra/review/dev.txt): a CPU size said "0x CPU" before. The figures are Azure's size tables' (Dsv5: D4s_v5 has
    4 vCPUs; NDasrA100_v4: ND96asr_v4 has 8 A100 GPUs on HDR InfiniBand), not read from vm_sizes."""
    mocks, _ = dev
    cpu = one(mocks, "Compute", "compute-cpu-smoke").inputs["properties"]
    gpu = one(mocks, "Compute", "compute-gpu-ib").inputs["properties"]
    assert cpu["properties"]["vmSize"] == "Standard_D4s_v5" and cpu["description"] == "4 vCPUs, no GPU"
    assert gpu["properties"]["vmSize"] == "Standard_ND96asr_v4" and gpu["description"] == "8x A100, InfiniBand HDR"
