"""VNet, subnets, NSG and NAT gateway: compute nodes without public IPs and one explicit way out.

Nodes have no public IP, so nothing on the internet can open a connection to them: the NSG's default
rules already drop inbound traffic that does not come from the VNet or Azure's load balancer, and the
explicit deny below only says so. Outbound, two profiles (`network.restrictOutbound`):

- false (dev): the NSG filters inbound only. Outbound traffic goes anywhere through the NAT gateway's
  fixed public IP (package mirrors, data sources). No outbound allow rules are declared, because next to
  the default `AllowInternetOutBound` rule they would restrict nothing.
- true (private profile): outbound is allowed to exactly the service tags Azure ML documents for a
  VNet-injected, no-public-IP compute (`AML_OUTBOUND`), then every other internet destination is denied.
  Traffic inside the VNet (MPI, Gloo and NCCL between nodes, private endpoints, the NFS share) stays
  allowed by the default `AllowVnetOutBound` rule, since the deny targets the `Internet` tag only.
  The NAT gateway still carries the allowed traffic: those service tags are public Azure addresses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import network

from .config import Network


@dataclass(frozen=True)
class Outbound:
    tag: str  # service tag; "{region}" is replaced by the stack's location
    ports: str  # NSG port range syntax
    protocol: str  # Tcp | Udp | *
    why: str


# Outbound needs of Azure ML compute without public IP, from Microsoft's tables:
# https://learn.microsoft.com/azure/machine-learning/how-to-access-azureml-behind-firewall ("Basic configuration",
# outbound) and https://learn.microsoft.com/azure/machine-learning/how-to-secure-training-vnet ("Compute
# instance/cluster or serverless compute with no public IP").
AML_OUTBOUND: tuple[Outbound, ...] = (
    Outbound("AzureActiveDirectory", "80,443", "Tcp", "Entra ID sign-in of the compute identity"),
    Outbound("AzureMachineLearning", "443,8787,18881", "Tcp", "Azure ML service"),
    Outbound("AzureMachineLearning", "5831", "Udp", "Azure ML compute management (no-public-IP nodes)"),
    Outbound("BatchNodeManagement.{region}", "443", "*", "Azure Batch, which runs Azure ML clusters"),
    Outbound("AzureResourceManager", "443", "Tcp", "Azure Resource Manager"),
    Outbound("Storage.{region}", "443", "Tcp", "Storage of the workspace, the data and Azure Batch"),
    # how-to-access-azureml-behind-firewall, "Firewall between Azure Machine Learning and Azure Storage
    # endpoints"; how-to-secure-training-vnet, "Limitations": SMB to the workspace storage.
    Outbound("Storage.{region}", "445", "Tcp", "SMB to the workspace's file share"),
    Outbound("AzureFrontDoor.Frontend", "443", "Tcp", "Azure ML studio's global entry point"),
    Outbound("MicrosoftContainerRegistry", "443", "Tcp", "Microsoft's base images"),
    Outbound("AzureFrontDoor.FirstParty", "443", "Tcp", "Microsoft's base images (MCR's dependency)"),
    Outbound("AzureMonitor", "443", "Tcp", "Metrics and logs (Application Insights is not behind a private link)"),
    # Not in Azure ML's table, which assumes every service has a private endpoint: the dev profile reaches
    # the registry and Key Vault over their public endpoints (Key Vault through the service endpoint).
    Outbound("AzureContainerRegistry.{region}", "443", "Tcp", "The training images' registry"),
    Outbound("AzureKeyVault.{region}", "443", "Tcp", "The workspace's Key Vault"),
)

DENY_PRIORITY = 4000


def outbound_rules(location: str) -> list[network.SecurityRuleArgs]:
    rules = []
    for i, o in enumerate(AML_OUTBOUND):
        tag = o.tag.format(region=location)
        ports = o.ports.split(",")
        rules.append(
            network.SecurityRuleArgs(
                name=f"out-{tag.replace('.', '-').lower()}-{o.protocol.replace('*', 'any').lower()}-{ports[0]}",
                priority=100 + 10 * i,
                direction="Outbound",
                access="Allow",
                protocol=o.protocol,
                source_address_prefix="VirtualNetwork",
                source_port_range="*",
                destination_address_prefix=tag,
                **({"destination_port_range": ports[0]} if len(ports) == 1 else {"destination_port_ranges": ports}),
                description=o.why,
            )
        )
    rules.append(
        network.SecurityRuleArgs(
            name="out-deny-internet",
            priority=DENY_PRIORITY,
            direction="Outbound",
            access="Deny",
            protocol="*",
            source_address_prefix="*",
            source_port_range="*",
            destination_address_prefix="Internet",
            destination_port_range="*",
            description="Nothing else leaves for the internet; VNet traffic stays allowed by AllowVnetOutBound",
        )
    )
    return rules


def security_rules(cfg: Network, location: str) -> list[network.SecurityRuleArgs]:
    rules = [
        network.SecurityRuleArgs(
            name="in-deny-internet",
            priority=DENY_PRIORITY,
            direction="Inbound",
            access="Deny",
            protocol="*",
            source_address_prefix="Internet",
            source_port_range="*",
            destination_address_prefix="*",
            destination_port_range="*",
            description="No inbound from the internet: nodes have no public IP",
        )
    ]
    if cfg.restrict_outbound:
        rules.extend(outbound_rules(location))
    return rules


class PlatformNetwork(pulumi.ComponentResource):
    """Outputs: vnet_id, compute_subnet_id, private_endpoint_subnet_id, nat_public_ip."""

    def __init__(
        self,
        name: str,
        resource_group: pulumi.Input[str],
        location: str,
        cfg: Network,
        tags: dict,
        opts: pulumi.ResourceOptions | None = None,
        service_endpoint_policies: Sequence[pulumi.Input[str]] = (),
        dns_servers: Sequence[str] = (),
    ):
        """service_endpoint_policies: ids of service endpoint policies for the compute subnet (egress.py).
        dns_servers: the VNet's custom DNS (hub mode with the hub's private DNS zones: access.dnsServers); none:
        Azure's own DNS, which answers from the zones linked to this VNet."""
        super().__init__("trainingplatform:network:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.nsg = network.NetworkSecurityGroup(
            f"{name}-compute-nsg",
            resource_group_name=resource_group,
            location=location,
            security_rules=security_rules(cfg, location),
            tags=tags,
            opts=child,
        )
        self.nat_ip = network.PublicIPAddress(
            f"{name}-nat-ip",
            resource_group_name=resource_group,
            location=location,
            sku=network.PublicIPAddressSkuArgs(name="Standard"),
            public_ip_allocation_method="Static",
            tags=tags,
            opts=child,
        )
        self.nat = network.NatGateway(
            f"{name}-nat",
            resource_group_name=resource_group,
            location=location,
            sku=network.NatGatewaySkuArgs(name="Standard"),
            public_ip_addresses=[network.SubResourceArgs(id=self.nat_ip.id)],
            idle_timeout_in_minutes=10,
            tags=tags,
            opts=child,
        )
        # Subnets are separate resources; the VNet must not own a `subnets` list or an update would drop them.
        self.vnet = network.VirtualNetwork(
            f"{name}-vnet",
            resource_group_name=resource_group,
            location=location,
            address_space=network.AddressSpaceArgs(address_prefixes=[cfg.vnet_cidr]),
            dhcp_options=network.DhcpOptionsArgs(dns_servers=list(dns_servers)) if dns_servers else None,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["subnets"]),
        )
        self.compute_subnet = network.Subnet(
            f"{name}-compute",
            resource_group_name=resource_group,
            virtual_network_name=self.vnet.name,
            address_prefix=cfg.compute_subnet_cidr,
            network_security_group=network.NetworkSecurityGroupArgs(id=self.nsg.id),
            nat_gateway=network.SubResourceArgs(id=self.nat.id),
            default_outbound_access=False,
            # Service endpoints: the storage and Key Vault firewalls admit this subnet.
            service_endpoints=[
                network.ServiceEndpointPropertiesFormatArgs(service=s)
                for s in ("Microsoft.Storage", "Microsoft.KeyVault")
            ],
            # No-public-IP clusters: Azure ML refuses a subnet with either policy on ("The specified subnet has
            # PrivateLinkServiceNetworkPolicies or PrivateEndpointNetworkEndpoints enabled", how-to-secure-training-vnet,
            # "No public IP ... Troubleshooting"); Microsoft's machine-learning-end-to-end-secure template turns
            # both off on its training subnet. Azure Batch puts a private link service in it for node management.
            private_endpoint_network_policies="Disabled",
            private_link_service_network_policies="Disabled",
            service_endpoint_policies=[network.ServiceEndpointPolicyArgs(id=i) for i in service_endpoint_policies]
            or None,
            # network.computeRouteTableId, an existing table (the hub's): a subnet PUT without routeTable detaches the
            # one it has (Azure/azure-sdk-for-python#28350), so a landing zone's policy-attached table is named here.
            route_table=network.RouteTableArgs(id=cfg.compute_route_table_id) if cfg.compute_route_table_id else None,
            opts=child,
        )
        self.private_endpoint_subnet = network.Subnet(
            f"{name}-endpoints",
            resource_group_name=resource_group,
            virtual_network_name=self.vnet.name,
            address_prefix=cfg.private_endpoint_subnet_cidr,
            default_outbound_access=False,
            private_endpoint_network_policies="Enabled",
            # Studio in a VNet: "If the storage account uses a service endpoint, the workspace private endpoint and
            # storage service endpoint must be in the same subnet" (learn.microsoft.com/azure/machine-learning/
            # how-to-enable-studio-virtual-network, "Limitations"); the workspace storage admits this subnet too.
            service_endpoints=[network.ServiceEndpointPropertiesFormatArgs(service="Microsoft.Storage")],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.compute_subnet]),
        )  # Azure: one subnet at a time
        self.register_outputs(
            {
                "vnet_id": self.vnet.id,
                "compute_subnet_id": self.compute_subnet.id,
                "private_endpoint_subnet_id": self.private_endpoint_subnet.id,
                "nat_public_ip": self.nat_ip.ip_address,
            }
        )
