"""Tries to loosen the tolerance from inside: environment variables, atol/rtol globals in every
harness module in the module table, and the EvalSettings defaults. Returns an answer off by 0.5.
Must be incorrect (the tolerance lives in the trusted parent)."""

from os import environ
from sys import modules

import torch.nn as nn

from kernels.relu_add import relu_add

for key in ("KE_ATOL", "KE_RTOL", "KERNEL_ENV_ATOL", "KERNEL_ENV_RTOL", "ATOL", "RTOL"):
    environ[key] = "1e9"
for name, module in list(modules.items()):
    if name.startswith(("kernel_env", "timing", "guards", "compare", "harness", "records", "runner", "zygote", "__main__")):
        try:
            module.atol = module.rtol = module.ATOL = module.RTOL = 1e9
            module.FINGERPRINT_SAMPLES = 0
        except Exception:  # noqa: BLE001
            pass
        settings = module.EvalSettings if hasattr(module, "EvalSettings") else None
        if settings is not None:
            settings.model_fields["atol"].default = 1e9
            settings.model_fields["rtol"].default = 1e9


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = relu_add(x, y)
        return relu_add(out, out.new_full(out.shape, 0.5))  # relu(out + 0.5) = out + 0.5
