"""Container registry for the training images: Premium (network rules, private link, geo-replication
available), admin user off (pulls use the compute identity's AcrPull role), anonymous pull off.

With `registryPublicAccess: false` the registry is reached only through its private endpoint
(group `registry`, zone `privatelink.azurecr.io`); without one, neither the clusters nor Azure ML's image
builds could pull or push (https://learn.microsoft.com/azure/container-registry/container-registry-private-link).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import containerregistry

from . import naming
from .privatelink import PrivateDnsZones, PrivateLink


@dataclass(frozen=True)
class RegistryArgs:
    """What the registry takes from the stack's configuration."""

    location: str
    prefix: str
    stack: str
    public_access: bool  # registryPublicAccess
    tags: dict

    @classmethod
    def of(cls, cfg) -> RegistryArgs:
        return cls(cfg.location, cfg.prefix, cfg.stack, cfg.registry_public_access, cfg.tags)


class Registry(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        resource_group,
        args: RegistryArgs,
        suffix: str,
        endpoint_subnet_id=None,
        dns: PrivateDnsZones | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("trainingplatform:registry:Registry", name, None, opts)
        self.registry = containerregistry.Registry(
            f"{name}-acr",
            registry_name=naming.registry(args.prefix, args.stack, suffix),
            resource_group_name=resource_group,
            location=args.location,
            sku=containerregistry.SkuArgs(name="Premium"),
            admin_user_enabled=False,
            anonymous_pull_enabled=False,
            public_network_access="Enabled" if args.public_access else "Disabled",
            network_rule_bypass_options="AzureServices",
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.link = None
        if not args.public_access:
            if dns is None or endpoint_subnet_id is None:
                raise ValueError(
                    "a registry without public access needs endpoint_subnet_id and dns for its private endpoint"
                )
            self.link = PrivateLink(
                f"{name}-acr-link",
                resource_group=resource_group,
                location=args.location,
                target_id=self.registry.id,
                group_id="registry",
                subnet_id=endpoint_subnet_id,
                dns=dns,
                tags=args.tags,
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.login_server = self.registry.login_server
        self.register_outputs({"login_server": self.login_server})
