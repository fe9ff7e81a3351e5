"""Container registry for the training images: Premium (network rules, private link, geo-replication
available), admin user off (pulls use the compute identity's AcrPull role), anonymous pull off."""
from __future__ import annotations

import pulumi
from pulumi_azure_native import containerregistry

from . import naming


class Registry(pulumi.ComponentResource):
    def __init__(self, name: str, resource_group, location: str, prefix: str, stack: str, suffix: str,
                 public_access: bool, tags: dict, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainingplatform:registry:Registry", name, None, opts)
        self.registry = containerregistry.Registry(
            f"{name}-acr", registry_name=naming.registry(prefix, stack, suffix), resource_group_name=resource_group,
            location=location, sku=containerregistry.SkuArgs(name="Premium"), admin_user_enabled=False,
            anonymous_pull_enabled=False, public_network_access="Enabled" if public_access else "Disabled",
            network_rule_bypass_options="AzureServices", tags=tags, opts=pulumi.ResourceOptions(parent=self))
        self.login_server = self.registry.login_server
        self.register_outputs({"login_server": self.login_server})
