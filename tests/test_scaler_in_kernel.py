"""fp16's loss scaler without a host sync per step (runtime.scaler_in_kernel): the fused SGD kernel takes
GradScaler's found-inf flag, so no step reads it on the host; an overflowing first step (fp16's usual start)
leaves the weights and momentum as they were, and the steps after it equal those of the path that skips step()
on the host, bit for bit. The two-process runs with the scaler (tests/test_ddp.py, test_device_defaults.py, both
starting at a scale of 2^24 so that the first steps overflow) hold the same numbers as before."""

import torch

from payloads.pytorch import runtime


class _Cfg:
    momentum, weight_decay = 0.9, 1e-4


class _NoBackend:
    def averaged(self, optimizer):
        import contextlib

        return contextlib.nullcontext()


def _steps(in_kernel: bool, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = runtime.optimizer(_Cfg, model, 0.1, torch.device("cpu"))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    if in_kernel:
        runtime.scaler_in_kernel(opt, scaler)
    else:
        opt._step_supports_amp_scaling = False
    reads = []
    real_item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append(1) or real_item(t))
    x = torch.randn(16, 4)
    for step in range(3):
        opt.zero_grad()
        loss = model(x).square().mean() * (float("inf") if step == 0 else 1.0)  # the first step overflows
        scaler.scale(loss).backward()
        runtime.optimizer_step(opt, scaler, _NoBackend())
        if step == 0:
            first = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.undo()
    return model.state_dict(), first, len(reads), opt


def test_the_fused_step_takes_the_overflow_flag_with_no_host_read(monkeypatch):
    fused, after_overflow, reads, opt = _steps(True, monkeypatch)
    assert all(g["fused"] for g in opt.param_groups), "this torch has no fused SGD on a CPU: nothing to test"
    host, _, host_reads, _ = _steps(False, monkeypatch)
    assert reads == 0 and host_reads >= 3  # the other path reads the flag once per step
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)).state_dict()
    moved = [k for k in start if "running" not in k and "num_batches" not in k]
    assert all(torch.equal(after_overflow[k], start[k]) for k in moved)  # the overflowing step changed no weight
    assert all(torch.isfinite(v).all() for v in fused.values() if v.is_floating_point())
    assert all(torch.equal(fused[k], host[k]) for k in fused)  # then the same updates, bit for bit
