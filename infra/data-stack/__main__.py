"""Pulumi entry point of the data stack (infra/data-stack/Pulumi.yaml): validate, declare, export.

The platform (../../Pulumi.yaml) reads these outputs through a StackReference (trainingplatform/datastack.py).
"""
import pathlib
import sys

import pulumi

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # infra/, for the trainingplatform package
from trainingplatform import dataconfig, datastack  # noqa: E402

settings = dataconfig.from_pulumi()   # raises with every config problem listed, before anything is declared
for key, value in datastack.build(settings).items():
    pulumi.export(key, value)
