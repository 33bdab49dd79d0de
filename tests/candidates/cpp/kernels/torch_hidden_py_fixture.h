// Attack: as torch_hidden_binding.cpp, excluding only DispatchKey::Python (named nowhere in a
// way a text rule about the dispatcher's thread-local state would recognise).
#pragma once
#include "check.h"
#include <c10/core/impl/LocalDispatchKeySet.h>

static torch::Tensor torch_ops_hidden_py(const torch::Tensor& x, const torch::Tensor& y) {
  c10::impl::ExcludeDispatchKeyGuard no_python(c10::DispatchKey::Python);
  return at::relu(at::add(x, y));
}

static void register_torch_hidden_py(pybind11::module& m) { m.def("torch_ops_hidden_py", &torch_ops_hidden_py); }

