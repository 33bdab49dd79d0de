"""Arbitrary Python from C++: the extension calls CPython's PyRun_SimpleString, declared under a
harmless name through an asm label (`extern "C" int run_script(const char*) __asm__("PyRun_SimpleString")`,
the real name in a string literal the text rules blank); its script, a raw string, computes the answer
with torch while the harness's dispatch modes are switched off, past every rule on model_new.py. Must be
refused before anything runs: by the source rules (the asm label) and by the module rules (the module
imports PyRun_SimpleString)."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp asm_label_pyrun_fixture.h

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        cuda_extension.pending = (x, y, out)
        cuda_extension.asm_label_pyrun()
        return out
