// binding_registry.h — PROTECTED: do not edit (its hash is checked before every evaluation).
//
// Lets every kernels/*_binding.cpp register its Python functions with the `cuda_extension`
// module without touching binding.cpp:
//
//     #include "../binding_registry.h"
//     static void register_relu_add(pybind11::module& m) {
//         m.def("relu_add", &relu_add_forward, "relu(x + y)");
//     }
//     REGISTER_BINDING(relu_add, register_relu_add);
//
// `name` is a plain identifier, unique across kernels/ (it names a static variable and is
// checked for duplicates when the module is imported); `register_fn` is any function, or
// capture-less lambda, taking `pybind11::module&`.
//
// The registry lives in a function-local static (a Meyers singleton), so it is constructed
// on first use: registrations from any translation unit, in any static-initialisation
// order, are all in place before binding.cpp's PYBIND11_MODULE runs.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>
#include <vector>

namespace kernel_env {

using BindingFn = void (*)(pybind11::module&);

class BindingRegistry {
 public:
  using Entries = std::vector<std::pair<std::string, BindingFn>>;

  static Entries& entries() {
    static Entries registered;  // constructed on first use, shared by every translation unit
    return registered;
  }

  static bool add(const char* name, BindingFn fn) {
    entries().emplace_back(name, fn);
    return true;
  }
};

}  // namespace kernel_env

#define REGISTER_BINDING(name, register_fn)                                   \
  [[maybe_unused]] static const bool kernel_env_binding_registered_##name = \
      ::kernel_env::BindingRegistry::add(#name, register_fn)
