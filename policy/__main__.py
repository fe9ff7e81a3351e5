"""Policy pack: `pulumi preview --policy-pack policy` (mandatory rules stop the update)."""
from pulumi_policy import EnforcementLevel, PolicyPack

import training_policies

PolicyPack(name="azure-horovod-training", enforcement_level=EnforcementLevel.MANDATORY,
           policies=training_policies.policies())
