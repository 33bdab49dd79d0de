// Attacks: torch compute from C++. torch_ops goes through the dispatcher (torch::add,
// torch::relu); torch_ops_direct calls ATen's CPU kernels directly (at::cpu::add,
// at::cpu::clamp_min), past the dispatcher.
#pragma once
#include "check.h"
#include <ATen/CPUFunctions.h>

static torch::Tensor torch_ops(const torch::Tensor& x, const torch::Tensor& y) {
  return torch::relu(torch::add(x, y));
}

static torch::Tensor torch_ops_direct(const torch::Tensor& x, const torch::Tensor& y) {
  return at::cpu::clamp_min(at::cpu::add(x, y), 0);
}

static void register_torch_ops(pybind11::module& m) {
  m.def("torch_ops", &torch_ops);
  m.def("torch_ops_direct", &torch_ops_direct);
}

