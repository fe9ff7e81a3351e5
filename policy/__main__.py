"""Policy pack: `pulumi preview --policy-pack policy` (mandatory rules stop the update)."""

import training_policies
from pulumi_policy import EnforcementLevel, PolicyPack

PolicyPack(
    name="azure-horovod-training", enforcement_level=EnforcementLevel.MANDATORY, policies=training_policies.policies()
)
