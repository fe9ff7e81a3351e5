"""Cluster health check (`python -m payloads.healthcheck`, jobs/healthcheck-allreduce.yaml; docs/health-check.md):
Horovod's allreduce checked and timed, each node judged on its own against what its VM size should deliver, then a
few steps of the PyTorch payload's own training loop.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.healthcheck --sizes-mb 1,8

One module per check: options.py (the options), expected.py (the expected figures' format), facts.py (what each
node is; mpistop.py the grace of mpirun's stop), allreduce.py (correctness and bus bandwidth, in the node and across nodes over InfiniBand), infiniband.py
(ib_write_bw per card), training.py (the payload's steps, a save and a restore), verdicts.py (each node's verdict
and the table), run.py (the whole check and rank 0's report).
"""
