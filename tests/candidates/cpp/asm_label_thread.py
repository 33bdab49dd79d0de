"""Returns at once; a native thread started through pthread_create declared under a harmless name
(an asm label: `extern "C" int start_native(...) __asm__("pthread_create")`, the real name in a string
literal the text rules blank) fills the output 5 ms later, invisible to Python's thread list. Must be
refused before anything runs: by the source rules (the asm label) and by the module rules (the module
imports pthread_create)."""

# kernels: relu_add.cpp check.h fixtures_binding.cpp asm_label_thread_fixture.h

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.asm_label_thread(x.contiguous(), y.contiguous(), 5000)
