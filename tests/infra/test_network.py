"""The compute subnet's NSG, judged the way Azure evaluates it, against Azure's documented names and needs.

Sources (cited per constant below):
- service tag names: https://learn.microsoft.com/azure/virtual-network/service-tags-overview ("Available service tags")
- NSG evaluation and default rules: https://learn.microsoft.com/azure/virtual-network/network-security-groups-overview
  ("Security rules": lowest priority number first, first match wins; "Default security rules")
- Azure ML's outbound needs: https://learn.microsoft.com/azure/machine-learning/how-to-access-azureml-behind-firewall
  ("Basic configuration", outbound) and how-to-secure-training-vnet ("... with no public IP")
"""

import copy
import ipaddress

import pytest
from infra_helpers import ROOT, one

from trainingplatform import config

LOCATION = "westeurope"  # both committed stacks

# Service tags usable in NSG rules -> whether a regional form (`Tag.<region>`) exists ("Can be regional?").
# Transcribed from the service-tags-overview table (revision of 2023-01-26), the tags an NSG could name;
# AzureMachineLearning, AzureMonitor and AzureResourceManager corrected to regional: the published ServiceTags
# JSON (Get-AzNetworkServiceTag, the weekly download) lists e.g. AzureMachineLearning.WestEurope.
DOCUMENTED_SERVICE_TAGS = {
    "ActionGroup": False,
    "ApiManagement": True,
    "ApplicationInsightsAvailability": False,
    "AppConfiguration": False,
    "AppService": True,
    "AppServiceManagement": False,
    "AutonomousDevelopmentPlatform": True,
    "AzureActiveDirectory": False,
    "AzureActiveDirectoryDomainServices": False,
    "AzureAdvancedThreatProtection": False,
    "AzureArcInfrastructure": False,
    "AzureAttestation": False,
    "AzureBackup": False,
    "AzureBotService": False,
    "AzureCloud": True,
    "AzureCognitiveSearch": False,
    "AzureConnectors": True,
    "AzureContainerAppsService": True,
    "AzureContainerRegistry": True,
    "AzureCosmosDB": True,
    "AzureDatabricks": False,
    "AzureDataExplorerManagement": False,
    "AzureDataLake": False,
    "AzureDeviceUpdate": False,
    "AzureDevSpaces": False,
    "AzureDevOps": True,
    "AzureDigitalTwins": False,
    "AzureEventGrid": False,
    "AzureFrontDoor.Frontend": False,
    "AzureFrontDoor.Backend": False,
    "AzureFrontDoor.FirstParty": False,
    "AzureHealthcareAPIs": False,
    "AzureInformationProtection": False,
    "AzureIoTHub": True,
    "AzureKeyVault": True,
    "AzureLoadBalancer": False,
    "AzureLoadTestingInstanceManagement": False,
    "AzureMachineLearning": True,
    "AzureMachineLearningInference": False,
    "AzureManagedGrafana": False,
    "AzureMonitor": True,
    "AzureOpenDatasets": False,
    "AzurePlatformDNS": False,
    "AzurePlatformIMDS": False,
    "AzurePlatformLKM": False,
    "AzureResourceManager": True,
    "AzureSentinel": False,
    "AzureSignalR": False,
    "AzureSiteRecovery": False,
    "AzureSphere": False,
    "AzureSpringCloud": False,
    "AzureStack": False,
    "AzureTrafficManager": False,
    "AzureUpdateDelivery": False,
    "AzureWebPubSub": True,
    "BatchNodeManagement": True,
    "ChaosStudio": False,
    "CognitiveServicesFrontend": False,
    "CognitiveServicesManagement": False,
    "DataFactory": True,
    "DataFactoryManagement": False,
    "Dynamics365ForMarketingEmail": True,
    "Dynamics365BusinessCentral": False,
    "EOPExternalPublishedIPs": False,
    "EventHub": True,
    "GatewayManager": False,
    "GuestAndHybridManagement": False,
    "HDInsight": True,
    "Internet": False,
    "KustoAnalytics": False,
    "LogicApps": False,
    "LogicAppsManagement": False,
    "Marketplace": False,
    "M365ManagementActivityApi": True,
    "M365ManagementActivityApiWebhook": True,
    "MicrosoftAzureFluidRelay": False,
    "MicrosoftCloudAppSecurity": False,
    "MicrosoftContainerRegistry": True,
    "MicrosoftDefenderForEndpoint": False,
    "MicrosoftPurviewPolicyDistribution": False,
    "PowerBI": False,
    "PowerPlatformInfra": True,
    "PowerPlatformPlex": True,
    "PowerQueryOnline": False,
    "ServiceBus": True,
    "ServiceFabric": False,
    "Sql": True,
    "SqlManagement": False,
    "Storage": True,
    "StorageSyncService": False,
    "WindowsAdminCenter": False,
    "WindowsVirtualDesktop": False,
    "VirtualNetwork": False,
}

# What Azure ML requires outbound from no-public-IP compute (tag, protocol, port); "{region}" is the stack's.
# how-to-access-azureml-behind-firewall "Basic configuration" + how-to-secure-training-vnet "no public IP".
AML_REQUIRED_OUTBOUND = [
    ("AzureActiveDirectory", "Tcp", 80),
    ("AzureActiveDirectory", "Tcp", 443),
    ("AzureMachineLearning", "Tcp", 443),
    ("AzureMachineLearning", "Tcp", 8787),
    ("AzureMachineLearning", "Tcp", 18881),
    ("AzureMachineLearning", "Udp", 5831),
    ("BatchNodeManagement.{region}", "Tcp", 443),
    ("BatchNodeManagement.{region}", "Udp", 443),
    ("AzureResourceManager", "Tcp", 443),
    ("Storage.{region}", "Tcp", 443),
    ("AzureFrontDoor.Frontend", "Tcp", 443),
    ("MicrosoftContainerRegistry", "Tcp", 443),
    ("AzureFrontDoor.FirstParty", "Tcp", 443),
    ("AzureMonitor", "Tcp", 443),
]


def tag_problem(prefix: str, location: str) -> str | None:
    """Why an NSG address prefix would be refused by Azure, or None. IPs, CIDRs and '*' are not tags."""
    if prefix == "*":
        return None
    try:
        ipaddress.ip_network(prefix)
        return None
    except ValueError:
        pass
    if prefix in DOCUMENTED_SERVICE_TAGS:
        return None
    base, _, region = prefix.rpartition(".")
    if base in DOCUMENTED_SERVICE_TAGS:
        if not DOCUMENTED_SERVICE_TAGS[base]:
            return f"{base} has no regional form"
        if region != location:
            return f"{prefix}: region {region!r} is not the stack's {location!r}"
        return None
    return f"{prefix} is not an Azure service tag"


def _prefixes(rule: dict, side: str) -> list[str]:
    one_ = rule.get(f"{side}AddressPrefix")
    return [one_] if one_ else list(rule.get(f"{side}AddressPrefixes") or [])


def _ports(rule: dict) -> list[str]:
    one_ = rule.get("destinationPortRange")
    return [one_] if one_ else list(rule.get("destinationPortRanges") or [])


def _port_matches(spec: str, port: int) -> bool:
    if spec == "*":
        return True
    lo, _, hi = spec.partition("-")
    return int(lo) <= port <= int(hi or lo)


# Azure's default rules, evaluated after the declared ones (network-security-groups-overview, "Default security rules").
DEFAULT_RULES = [
    {
        "name": "AllowVnetInBound",
        "priority": 65000,
        "direction": "Inbound",
        "access": "Allow",
        "protocol": "*",
        "sourceAddressPrefix": "VirtualNetwork",
        "destinationAddressPrefix": "VirtualNetwork",
        "destinationPortRange": "*",
    },
    {
        "name": "AllowAzureLoadBalancerInBound",
        "priority": 65001,
        "direction": "Inbound",
        "access": "Allow",
        "protocol": "*",
        "sourceAddressPrefix": "AzureLoadBalancer",
        "destinationAddressPrefix": "*",
        "destinationPortRange": "*",
    },
    {
        "name": "DenyAllInBound",
        "priority": 65500,
        "direction": "Inbound",
        "access": "Deny",
        "protocol": "*",
        "sourceAddressPrefix": "*",
        "destinationAddressPrefix": "*",
        "destinationPortRange": "*",
    },
    {
        "name": "AllowVnetOutBound",
        "priority": 65000,
        "direction": "Outbound",
        "access": "Allow",
        "protocol": "*",
        "sourceAddressPrefix": "VirtualNetwork",
        "destinationAddressPrefix": "VirtualNetwork",
        "destinationPortRange": "*",
    },
    {
        "name": "AllowInternetOutBound",
        "priority": 65001,
        "direction": "Outbound",
        "access": "Allow",
        "protocol": "*",
        "sourceAddressPrefix": "*",
        "destinationAddressPrefix": "Internet",
        "destinationPortRange": "*",
    },
    {
        "name": "DenyAllOutBound",
        "priority": 65500,
        "direction": "Outbound",
        "access": "Deny",
        "protocol": "*",
        "sourceAddressPrefix": "*",
        "destinationAddressPrefix": "*",
        "destinationPortRange": "*",
    },
]


def _addr_matches(rule_prefix: str, peer: str) -> bool:
    """peer is a tag-like name: a service tag, 'Internet' (a non-Azure public address) or 'VirtualNetwork'.
    'Internet' covers every public address, Azure's service tags included (service-tags-overview)."""
    if rule_prefix in ("*", peer):
        return True
    return rule_prefix == "Internet" and peer != "VirtualNetwork"


def evaluate(rules: list[dict], direction: str, peer: str, protocol: str, port: int) -> str:
    """The access Azure applies to one flow: lowest priority number first, first match wins."""
    side = "destination" if direction == "Outbound" else "source"
    for r in sorted([*rules, *DEFAULT_RULES], key=lambda r: r["priority"]):
        if r["direction"] != direction or r["protocol"] not in ("*", protocol):
            continue
        if any(_addr_matches(p, peer) for p in _prefixes(r, side)) and any(_port_matches(s, port) for s in _ports(r)):
            return r["access"]
    raise AssertionError("the default rules match everything")


def _nsg_rules(mocks):
    return one(mocks, "NetworkSecurityGroup", "net-compute-nsg").inputs["securityRules"]


def test_the_tag_check_knows_azures_names():
    assert tag_problem("Keyvault", "westeurope") == "Keyvault is not an Azure service tag"
    assert tag_problem("AzureKeyVault.westeurope", "westeurope") is None
    assert tag_problem("AzureActiveDirectory.westeurope", "westeurope") == "AzureActiveDirectory has no regional form"
    assert tag_problem("Storage.eastus", "westeurope") is not None
    assert tag_problem("10.40.0.0/16", "westeurope") is None


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_nsg_address_is_an_azure_service_tag(dev, prod, stack):
    mocks, _ = dev if stack == "dev" else prod
    location = LOCATION
    rules = _nsg_rules(mocks)
    assert rules
    problems = [
        (r["name"], problem)
        for r in rules
        for side in ("source", "destination")
        for p in _prefixes(r, side)
        if (problem := tag_problem(p, location))
    ]
    assert problems == []
    assert len({r["priority"] for r in rules if r["direction"] == "Outbound"}) == sum(
        r["direction"] == "Outbound" for r in rules
    ), "NSG priorities must be unique per direction"


def test_dev_blocks_inbound_only_and_the_nat_gateway_is_the_way_out(dev):
    mocks, _ = dev
    rules = _nsg_rules(mocks)
    assert evaluate(rules, "Inbound", "Internet", "Tcp", 22) == "Deny"
    assert evaluate(rules, "Inbound", "VirtualNetwork", "Tcp", 22) == "Allow"  # SSH from inside the VNet
    assert evaluate(rules, "Outbound", "Internet", "Tcp", 443) == "Allow"  # pypi & co. through the NAT
    subnet = one(mocks, "Subnet", "net-compute").inputs
    assert subnet["natGateway"]["id"] == one(mocks, "NatGateway", "net-nat").id
    assert subnet["defaultOutboundAccess"] is False


def test_restricted_outbound_admits_what_azure_ml_documents_and_nothing_else(prod):
    mocks, _ = prod
    location = LOCATION
    rules = _nsg_rules(mocks)
    for tag, protocol, port in AML_REQUIRED_OUTBOUND:
        peer = tag.format(region=location)
        assert evaluate(rules, "Outbound", peer, protocol, port) == "Allow", (peer, protocol, port)
    assert evaluate(rules, "Outbound", "Internet", "Tcp", 443) == "Deny"  # pypi.org, github.com, ...
    assert evaluate(rules, "Outbound", "Internet", "Udp", 53) == "Deny"
    assert evaluate(rules, "Outbound", f"Storage.{location}", "Tcp", 80) == "Deny"
    # Inside the VNet everything stays open: MPI/NCCL between nodes, NFS 2049, private endpoints on 443.
    for protocol, port in (("Tcp", 2049), ("Tcp", 443), ("Tcp", 1024), ("Udp", 4791)):
        assert evaluate(rules, "Outbound", "VirtualNetwork", protocol, port) == "Allow", (protocol, port)
    assert evaluate(rules, "Inbound", "Internet", "Tcp", 443) == "Deny"


def test_the_private_profiles_egress_docs_name_every_tag_its_nsg_lets_out(prod):
    # docs/private-access.md lists what stays open beside the service endpoint policy; it once named one of the two
    # Azure Front Door tags the NSG allows. Compared with the rules the prod stack declares, not a list of our own.
    mocks, _ = prod
    allowed = {
        prefix.replace(f".{LOCATION}", ".<region>")
        for r in _nsg_rules(mocks)
        if r["direction"] == "Outbound" and r["access"] == "Allow"
        for prefix in _prefixes(r, "destination")
    }
    page = (ROOT / "docs" / "private-access.md").read_text()
    egress = page.split("## Egress:", 1)[1].split("\n## ", 1)[0]
    assert {"AzureFrontDoor.Frontend", "AzureFrontDoor.FirstParty"} <= allowed
    assert [tag for tag in sorted(allowed) if f"`{tag}`" not in egress] == []


def test_each_rule_field_the_evaluator_reads_is_declared(prod):
    # The evaluator ignores fields it does not know; a rule written with other fields would be judged wrongly.
    mocks, _ = prod
    for r in _nsg_rules(mocks):
        assert r["protocol"] in ("Tcp", "Udp", "*") and r["access"] in ("Allow", "Deny")
        assert _prefixes(r, "destination") and _ports(r) and 100 <= r["priority"] <= 4096


def test_compute_subnet_turns_off_private_link_network_policies(dev):
    # Azure ML refuses no-public-IP compute in a subnet with either policy on ("The specified subnet has
    # PrivateLinkServiceNetworkPolicies or PrivateEndpointNetworkEndpoints enabled", how-to-secure-training-vnet).
    mocks, _ = dev
    subnet = one(mocks, "Subnet", "net-compute").inputs
    assert subnet["privateEndpointNetworkPolicies"] == "Disabled"
    assert subnet["privateLinkServiceNetworkPolicies"] == "Disabled"


def test_restrict_outbound_must_be_a_boolean(dev_raw):
    raw, location = copy.deepcopy(dev_raw)
    raw["network"]["restrictOutbound"] = "sometimes"
    with pytest.raises(config.ConfigError, match="network.restrictOutbound = 'sometimes': expected bool"):
        config.load(raw, "dev", location)


def test_the_compute_subnet_takes_an_existing_route_table_or_none(dev, dev_raw, dev_data):
    """Issue 54, item 5: network.computeRouteTableId attaches an existing route table (the hub's, which a platform
    reaching another platform's data endpoints needs; azurecheck/hub.py checks its routes). Unset, the subnet declares
    none; a subnet PUT carries the whole subnet, so one a landing zone's policy attached is named here to be kept."""
    from trainingplatform import mocked

    assert "routeTable" not in one(dev[0], "Subnet", "net-compute").inputs
    table = (
        f"/subscriptions/{mocked.SUBSCRIPTION}/resourceGroups/rg-hub/providers/Microsoft.Network/routeTables/rt-spokes"
    )
    raw, location = copy.deepcopy(dev_raw)
    raw["network"]["computeRouteTableId"] = table
    mocks, _ = mocked.run(raw, "dev", location, data_outputs=dev_data[1])
    assert one(mocks, "Subnet", "net-compute").inputs["routeTable"] == {"id": table}
    assert "routeTable" not in one(mocks, "Subnet", "net-endpoints").inputs
    raw["network"]["computeRouteTableId"] = "rt-spokes"
    with pytest.raises(config.ConfigError, match="network.computeRouteTableId = 'rt-spokes': a route table's full"):
        config.load(raw, "dev", location)
