"""TensorFlow 2 payload (custom loop with hvd.DistributedGradientTape) and what the Keras payload shares."""

import os

# TensorFlow 2.15 turns its oneDNN CPU kernels on only for CPUs it recognises (Intel with AVX-512-class
# features); elsewhere (this project's AMD EPYC machine) convolutions take Eigen's path, several times slower
# (docs/benchmarks.md#tensorflows-onednn-kernels-on-amd). Set before TensorFlow is imported;
# TF_ENABLE_ONEDNN_OPTS=0 in the environment still turns it off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
