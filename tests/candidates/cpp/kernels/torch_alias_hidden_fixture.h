// Attack: relu and add through the dispatcher with the Python dispatch key excluded (so the
// harness's Python dispatch mode never sees them); the guard's and the key's names are assembled
// by the preprocessor and the namespace is aliased, so no text rule recognises them.
#pragma once
#include "check.h"

namespace aten = at;
#define KE_PASTE3(a, b, c) a##b##c
#define KE_PASTE2(a, b) a##b

static torch::Tensor torch_ops_aliased_hidden(const torch::Tensor& x, const torch::Tensor& y) {
  c10::impl::KE_PASTE3(Exclude, Dispatch, KeyGuard) no_python(c10::KE_PASTE2(Dispatch, Key)::Python);
  return aten::relu(aten::add(x, y));
}

static void register_torch_alias_hidden(pybind11::module& m) { m.def("torch_ops_aliased_hidden", &torch_ops_aliased_hidden); }
