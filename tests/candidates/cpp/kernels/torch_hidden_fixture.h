// Attack: torch compute through the dispatcher with the Python dispatch keys excluded, so no
// Python TorchDispatchMode sees it.
#pragma once
#include "check.h"
#include <c10/core/impl/LocalDispatchKeySet.h>

static torch::Tensor torch_ops_hidden(const torch::Tensor& x, const torch::Tensor& y) {
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return at::relu(at::add(x, y));
}

static void register_torch_hidden(pybind11::module& m) { m.def("torch_ops_hidden", &torch_ops_hidden); }

