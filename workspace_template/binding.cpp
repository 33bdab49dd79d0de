// binding.cpp — PROTECTED: do not edit (its hash is checked before every evaluation).
//
// Builds the Python module `cuda_extension` (the name is the same for CUDA and CPU C++
// workspaces) from every binding registered with REGISTER_BINDING in kernels/*_binding.cpp.
// Bindings are applied in name order, so the module does not depend on link order; a name
// registered twice is an import error naming it. `cuda_extension.__bindings__` lists the
// registered names.
#include "binding_registry.h"

#include <algorithm>
#include <stdexcept>

PYBIND11_MODULE(cuda_extension, m) {
  auto entries = kernel_env::BindingRegistry::entries();
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  pybind11::list names;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0 && entries[i].first == entries[i - 1].first) {
      throw std::runtime_error("REGISTER_BINDING(" + entries[i].first +
                               ", ...) appears more than once in kernels/; names must be unique");
    }
    entries[i].second(m);
    names.append(entries[i].first);
  }
  m.attr("__bindings__") = names;
}
