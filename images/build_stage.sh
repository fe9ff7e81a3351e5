#!/usr/bin/env bash
# The build stage both training images share, run on their CUDA devel base (images/pytorch/Dockerfile,
# images/tensorflow/Dockerfile): the compilers Horovod's build needs, a released CPython 3.11 in /opt/python and
# the NCCL topology files of the InfiniBand sizes in /opt/microsoft. One home for their pins (docs/images.md).
set -euo pipefail

# A released CPython 3.11 (Ubuntu 22.04's apt python3.11 is 3.11.0~rc1, which every torch optimizer step breaks;
# TensorFlow 2.15 stops at 3.11): python-build-standalone, the builds uv installs, pinned by release tag and sha256
# (the sha256 astral-sh/uv's crates/uv-python/download-metadata.json records for this file).
PYTHON_URL=https://github.com/astral-sh/python-build-standalone/releases/download/20260814/cpython-3.11.16%2B20260814-x86_64-unknown-linux-gnu-install_only_stripped.tar.gz
PYTHON_SHA256=3b437f08720d3ddd9c1904532476ec9fb373e800d1598c72c907dd6d5f29b79b
# NCCL topology files as Azure's HPC VM images install them (Azure/azhpc-images topology/, MIT licence), at
# pinned commits. The launcher points NCCL_TOPO_FILE at the file the VM-size catalog names for the cluster's
# size (infra/trainingplatform/vm_sizes.py, launcher/interconnect.py).
AZHPC_IMAGES=https://raw.githubusercontent.com/Azure/azhpc-images

# Unpinned apt packages: their versions come with the Ubuntu release under the CUDA base image, and pinned ones
# vanish from the archive and break rebuilds. g++ 12: Ubuntu 22.04's default g++ 11 is not known to compile
# torch >= 2.14's C++20 headers (the Dockerfiles name it to each tool with ENV CC=gcc-12 ...).
apt-get update
apt-get install -y --no-install-recommends gcc-12 g++-12 make cmake libopenmpi-dev openmpi-bin curl ca-certificates
rm -rf /var/lib/apt/lists/*

curl -fsSL -o /tmp/python.tar.gz "${PYTHON_URL}"
echo "${PYTHON_SHA256}  /tmp/python.tar.gz" | sha256sum -c -
tar -xzf /tmp/python.tar.gz -C /opt && rm /tmp/python.tar.gz
/opt/python/bin/python3.11 -c "import sys; assert sys.version_info[:2] == (3, 11) and sys.version_info.releaselevel == 'final', sys.version"

mkdir -p /opt/microsoft
curl -fsSL -o /opt/microsoft/ndv4-topo.xml \
  ${AZHPC_IMAGES}/4a4565a0c0aa9d6944c53420155936061b9c3a98/topology/ndv4-topo.xml
curl -fsSL -o /opt/microsoft/ndv5-topo.xml \
  ${AZHPC_IMAGES}/d21d11e3e5001bd25f7cec26bee987dcd51b2066/topology/ndv5-topo.xml
grep -q "<system" /opt/microsoft/ndv4-topo.xml && grep -q "<system" /opt/microsoft/ndv5-topo.xml
