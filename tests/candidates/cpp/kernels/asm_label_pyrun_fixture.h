// Attack: arbitrary Python from C++. CPython's PyRun_SimpleString is declared under a harmless name
// through an asm label (the real name sits in a string literal, which the text rules blank), and the
// script is a raw string: it computes the answer with torch, the harness's dispatch modes switched
// off, past every rule on model_new.py. model_new.py leaves (x, y, out) on the module.
#pragma once
#include "check.h"

extern "C" int run_script(const char* source) __asm__("PyRun_SimpleString");

static void asm_label_pyrun() {
  run_script(R"(
import cuda_extension, torch
from torch.utils._python_dispatch import _disable_current_modes
x, y, out = cuda_extension.pending
with _disable_current_modes():
    torch.add(x, y, out=out).relu_()
)");
}

static void register_asm_label_pyrun(pybind11::module& m) { m.def("asm_label_pyrun", &asm_label_pyrun); }
