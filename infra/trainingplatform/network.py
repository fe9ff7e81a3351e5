"""VNet, subnets, NSG and NAT gateway: compute nodes without public IPs and an explicit way out.

Azure ML compute clusters here have no node public IP. Without one, nodes reach the services Azure ML
needs through outbound NSG rules for their service tags, and everything else (package mirrors, data
sources) through the NAT gateway's fixed public IP. Inbound from the internet stays denied; traffic inside
the VNet (MPI, Gloo and NCCL between nodes) is allowed by the NSG's default rule.
"""
from __future__ import annotations

import pulumi
from pulumi_azure_native import network

from .config import Network

# Outbound service tags a no-public-IP Azure ML cluster needs (Azure ML network isolation docs).
AML_OUTBOUND = [
    ("AzureActiveDirectory", "443"),
    ("AzureMachineLearning", "443"),
    ("AzureMachineLearning", "8787"),   # compute instance / cluster management
    ("AzureMachineLearning", "18881"),  # language server on nodes
    ("BatchNodeManagement", "443"),
    ("AzureResourceManager", "443"),
    ("Storage", "443"),
    ("Storage", "445"),                 # Azure Files (SMB), used by the workspace's code share
    ("AzureContainerRegistry", "443"),
    ("MicrosoftContainerRegistry", "443"),
    ("AzureFrontDoor.FirstParty", "443"),
    ("AzureMonitor", "443"),
    ("Keyvault", "443"),
]


class PlatformNetwork(pulumi.ComponentResource):
    """Outputs: vnet_id, compute_subnet_id, private_endpoint_subnet_id, nat_public_ip."""

    def __init__(self, name: str, resource_group: pulumi.Input[str], location: str, cfg: Network,
                 tags: dict, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainingplatform:network:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        rules = [
            network.SecurityRuleArgs(
                name=f"out-{tag.replace('.', '-').lower()}-{port}", priority=100 + i, direction="Outbound",
                access="Allow", protocol="Tcp", source_address_prefix="VirtualNetwork", source_port_range="*",
                destination_address_prefix=tag, destination_port_range=port,
                description=f"Azure ML compute needs {tag} on {port}")
            for i, (tag, port) in enumerate(AML_OUTBOUND)
        ]
        rules.append(network.SecurityRuleArgs(
            name="in-deny-internet", priority=4000, direction="Inbound", access="Deny", protocol="*",
            source_address_prefix="Internet", source_port_range="*", destination_address_prefix="*",
            destination_port_range="*", description="No inbound from the internet: nodes have no public IP"))
        self.nsg = network.NetworkSecurityGroup(f"{name}-compute-nsg", resource_group_name=resource_group,
                                                location=location, security_rules=rules, tags=tags, opts=child)
        self.nat_ip = network.PublicIPAddress(f"{name}-nat-ip", resource_group_name=resource_group, location=location,
                                              sku=network.PublicIPAddressSkuArgs(name="Standard"),
                                              public_ip_allocation_method="Static", tags=tags, opts=child)
        self.nat = network.NatGateway(f"{name}-nat", resource_group_name=resource_group, location=location,
                                      sku=network.NatGatewaySkuArgs(name="Standard"),
                                      public_ip_addresses=[network.SubResourceArgs(id=self.nat_ip.id)],
                                      idle_timeout_in_minutes=10, tags=tags, opts=child)
        # Subnets are separate resources; the VNet must not own a `subnets` list or an update would drop them.
        self.vnet = network.VirtualNetwork(f"{name}-vnet", resource_group_name=resource_group, location=location,
                                           address_space=network.AddressSpaceArgs(address_prefixes=[cfg.vnet_cidr]),
                                           tags=tags, opts=pulumi.ResourceOptions(parent=self, ignore_changes=["subnets"]))
        self.compute_subnet = network.Subnet(
            f"{name}-compute", resource_group_name=resource_group, virtual_network_name=self.vnet.name,
            address_prefix=cfg.compute_subnet_cidr,
            network_security_group=network.NetworkSecurityGroupArgs(id=self.nsg.id),
            nat_gateway=network.SubResourceArgs(id=self.nat.id),
            default_outbound_access=False,
            # Service endpoints: the storage and Key Vault firewalls admit this subnet.
            service_endpoints=[network.ServiceEndpointPropertiesFormatArgs(service=s)
                               for s in ("Microsoft.Storage", "Microsoft.KeyVault")],
            private_endpoint_network_policies="Disabled", opts=child)
        self.private_endpoint_subnet = network.Subnet(
            f"{name}-endpoints", resource_group_name=resource_group, virtual_network_name=self.vnet.name,
            address_prefix=cfg.private_endpoint_subnet_cidr, default_outbound_access=False,
            private_endpoint_network_policies="Enabled",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.compute_subnet]))  # Azure: one subnet at a time
        self.register_outputs({"vnet_id": self.vnet.id, "compute_subnet_id": self.compute_subnet.id,
                               "private_endpoint_subnet_id": self.private_endpoint_subnet.id,
                               "nat_public_ip": self.nat_ip.ip_address})
