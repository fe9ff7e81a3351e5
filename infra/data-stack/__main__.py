"""Pulumi entry point of the data stack (infra/data-stack/Pulumi.yaml): validate, declare, export.

The platform (../../Pulumi.yaml) reads these outputs through a StackReference (trainingplatform/datastack.py).
"""

import pulumi

from trainingplatform import dataconfig, datastack  # installed from infra/ (docs/deploying.md#deploy)

settings = dataconfig.from_pulumi()  # raises with every config problem listed, before anything is declared
for key, value in datastack.build(settings).items():
    pulumi.export(key, value)
