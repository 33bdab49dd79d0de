// Attack: ATen's CPU kernels called directly, past the dispatcher (no dispatch mode sees them),
// through a namespace alias, so the text never names the namespace followed by a call.
#pragma once
#include "check.h"
#include <ATen/CPUFunctions.h>

namespace kernels_cpu = at::cpu;

static torch::Tensor torch_ops_aliased_direct(const torch::Tensor& x, const torch::Tensor& y) {
  return kernels_cpu::clamp_min(kernels_cpu::add(x, y), 0);
}

static void register_torch_alias_direct(pybind11::module& m) { m.def("torch_ops_aliased_direct", &torch_ops_aliased_direct); }
