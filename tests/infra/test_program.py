"""The dev stack under mocks: the properties and relationships the platform depends on."""
from infra_helpers import one

from trainingplatform import access


def test_declares_every_part_of_the_platform(dev):
    mocks, _ = dev
    types = {r.type.split(":", 1)[1] for r in mocks.resources}
    for needed in ("resources:ResourceGroup", "network:VirtualNetwork", "network:Subnet", "network:NetworkSecurityGroup",
                   "network:NatGateway", "storage:StorageAccount", "storage:BlobContainer", "storage:FileShare",
                   "network:PrivateEndpoint", "privatedns:PrivateZone", "privatedns:VirtualNetworkLink",
                   "containerregistry:Registry", "keyvault:Vault", "operationalinsights:Workspace",
                   "applicationinsights:Component", "machinelearningservices:Workspace",
                   "machinelearningservices:Datastore", "machinelearningservices:Compute",
                   "managedidentity:UserAssignedIdentity", "authorization:RoleAssignment"):
        assert needed in types, needed


def test_storage_accounts(dev):
    mocks, _ = dev
    data, logs = one(mocks, "StorageAccount", "storage-data").inputs, one(mocks, "StorageAccount", "storage-logs").inputs
    assert (data["kind"], data["sku"]["name"]) == ("BlockBlobStorage", "Premium_LRS")
    assert (logs["kind"], logs["sku"]["name"]) == ("StorageV2", "Standard_LRS")
    compute_subnet = one(mocks, "Subnet", "net-compute").id
    for acct in (data, logs, one(mocks, "StorageAccount", "ml-storage").inputs):
        assert acct["enableHttpsTrafficOnly"] is True
        assert acct["minimumTlsVersion"] == "TLS1_2"
        assert acct["allowBlobPublicAccess"] is False
        assert acct["allowSharedKeyAccess"] is False
        rules = acct["networkRuleSet"]
        assert rules["defaultAction"] == "Deny"
        assert [v["virtualNetworkResourceId"] for v in rules["virtualNetworkRules"]] == [compute_subnet]
    svc = one(mocks, "BlobServiceProperties", "storage-data-blob-service").inputs
    assert svc["deleteRetentionPolicy"] == {"enabled": True, "days": 14}
    assert svc["containerDeleteRetentionPolicy"]["enabled"] is True
    assert one(mocks, "BlobContainer", "storage-data-container").inputs["publicAccess"] == "None"


def test_nfs_share_is_reachable_from_the_vnet_only(dev):
    mocks, outputs = dev
    acct = one(mocks, "StorageAccount", "nfs-account")
    assert acct.inputs["kind"] == "FileStorage" and acct.inputs["publicNetworkAccess"] == "Disabled"
    assert acct.inputs["networkRuleSet"]["defaultAction"] == "Deny"
    share = one(mocks, "FileShare", "nfs-share").inputs
    assert share["enabledProtocols"] == "NFS" and share["shareQuota"] == 100
    pe = one(mocks, "PrivateEndpoint", "nfs-endpoint").inputs
    assert pe["subnet"]["id"] == one(mocks, "Subnet", "net-endpoints").id
    conn = pe["privateLinkServiceConnections"][0]
    assert conn["privateLinkServiceId"] == acct.id and conn["groupIds"] == ["file"]
    link = one(mocks, "VirtualNetworkLink", "dns-privatelink-file-core-windows-net-link").inputs
    assert link["virtualNetwork"]["id"] == one(mocks, "VirtualNetwork", "net-vnet").id
    assert outputs["nfs"]["mount_target"] == f"{acct.inputs['accountName']}.file.core.windows.net:/{acct.inputs['accountName']}/shared"


def test_network_isolation(dev):
    mocks, outputs = dev
    compute = one(mocks, "Subnet", "net-compute").inputs
    assert compute["networkSecurityGroup"]["id"] == one(mocks, "NetworkSecurityGroup", "net-compute-nsg").id
    assert compute["natGateway"]["id"] == one(mocks, "NatGateway", "net-nat").id
    assert compute["defaultOutboundAccess"] is False
    rules = one(mocks, "NetworkSecurityGroup", "net-compute-nsg").inputs["securityRules"]
    # dev: the NSG filters inbound only (outbound rules and the private profile: tests/infra/test_network.py)
    assert [r for r in rules if r["direction"] == "Outbound"] == []
    assert any(r["direction"] == "Inbound" and r["access"] == "Deny" and r["sourceAddressPrefix"] == "Internet" for r in rules)
    vnet = one(mocks, "VirtualNetwork", "net-vnet").inputs
    assert vnet["addressSpace"]["addressPrefixes"] == ["10.40.0.0/16"]
    assert outputs["nat_public_ip"]


def test_registry_and_workspace(dev):
    mocks, outputs = dev
    acr = one(mocks, "Registry", "registry-acr")
    assert acr.inputs["sku"]["name"] == "Premium" and acr.inputs["adminUserEnabled"] is False
    ws = one(mocks, "machinelearningservices:Workspace", "ml-workspace").inputs
    assert ws["keyVault"] == one(mocks, "Vault", "ml-kv").id
    assert ws["applicationInsights"] == one(mocks, "Component", "ml-insights").id
    assert ws["storageAccount"] == one(mocks, "StorageAccount", "ml-storage").id
    assert ws["containerRegistry"] == acr.id
    assert ws["imageBuildCompute"] == "cpu-smoke"
    assert ws["identity"]["type"] == "SystemAssigned"
    insights = one(mocks, "Component", "ml-insights").inputs
    assert insights["workspaceResourceId"] == one(mocks, "operationalinsights:Workspace", "ml-log-analytics").id
    kv = one(mocks, "Vault", "ml-kv").inputs["properties"]
    assert kv["enablePurgeProtection"] and kv["enableRbacAuthorization"]
    # Soft-deleted names: the random suffix is part of both.
    assert ws["workspaceName"].endswith("x7k2q") and one(mocks, "Vault", "ml-kv").inputs["vaultName"].endswith("x7k2q")
    stores = {r.inputs["name"]: r.inputs["properties"] for r in mocks.of_type("Datastore")}
    assert stores["training_data"]["credentials"]["credentialsType"] == "None"   # identity-based
    assert stores["training_data"]["containerName"] == "training-data"
    assert stores["training_logs"]["accountName"] == outputs["datastores"]["logs"]["account"]


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


def test_compute_identity_gets_exactly_read_data_write_logs_pull_images(dev):
    mocks, _ = dev
    principal = "principal-compute-identity"   # the principalId the mocks give the compute identity
    grants = {(r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"])
              for r in mocks.of_type("RoleAssignment") if r.inputs["principalId"] == principal}
    data = one(mocks, "StorageAccount", "storage-data").id
    logs = one(mocks, "StorageAccount", "storage-logs").id
    assert grants == {
        (access.ROLES["Storage Blob Data Reader"], f"{data}/blobServices/default/containers/training-data"),
        (access.ROLES["Storage Blob Data Contributor"], f"{logs}/blobServices/default/containers/logs"),
        (access.ROLES["AcrPull"], one(mocks, "Registry", "registry-acr").id),
        (access.ROLES["Storage Blob Data Contributor"], one(mocks, "StorageAccount", "ml-storage").id),
    }
    workspace = {(r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"])
                 for r in mocks.of_type("RoleAssignment") if r.inputs["principalId"] == "principal-ml-workspace"}
    assert workspace == {
        (access.ROLES["Storage Blob Data Reader"], f"{data}/blobServices/default/containers/training-data"),
        (access.ROLES["Storage Blob Data Reader"], f"{logs}/blobServices/default/containers/logs"),
    }
    assert len(mocks.of_type("RoleAssignment")) == len(grants) + len(workspace), "no other grants"


def test_outputs_are_complete_and_hold_no_secrets(dev):
    _, outputs = dev
    for key in ("subscription_id", "resource_group", "workspace_name", "registry_login_server", "clusters",
                "datastores", "nfs", "compute_identity_client_id", "location"):
        assert outputs.get(key), key
    text = repr(outputs).lower()
    for secret_word in ("key", "password", "connectionstring", "sas"):
        assert secret_word not in text.replace("keyvault", ""), secret_word


def test_data_survives_destroy(dev):
    mocks, _ = dev
    for name in ("data", "storage-data", "storage-logs", "storage-data-container", "storage-logs-container",
                 "nfs-account", "nfs-share"):
        assert name in mocks.retained, name
    assert "platform" not in mocks.retained and "ml-workspace" not in mocks.retained
    data_group = one(mocks, "ResourceGroup", "data").inputs["resourceGroupName"]
    for name in ("storage-data", "storage-logs", "nfs-account"):
        assert one(mocks, "StorageAccount", name).inputs["resourceGroupName"] == data_group
