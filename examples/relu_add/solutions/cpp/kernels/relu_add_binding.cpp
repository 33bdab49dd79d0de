// Torch wrapper for relu_add_cpu: checks its inputs, allocates the output, calls the kernel.
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#include "../binding_registry.h"

void relu_add_cpu(const float* x, const float* y, float* out, int64_t n);  // kernels/relu_add.cpp

static torch::Tensor relu_add_forward(const torch::Tensor& x, const torch::Tensor& y) {
  TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu(), "relu_add: expects CPU tensors");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "relu_add: expects float32 tensors");
  TORCH_CHECK(x.sizes() == y.sizes(), "relu_add: x and y must have the same shape");
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "relu_add: expects contiguous tensors (call .contiguous() in model_new.py)");
  torch::Tensor out = torch::empty_like(x);
  relu_add_cpu(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  return out;
}

static void register_relu_add(pybind11::module& m) {
  m.def("relu_add", &relu_add_forward, "relu(x + y), fused, float32, CPU", pybind11::arg("x"), pybind11::arg("y"));
}

REGISTER_BINDING(relu_add, register_relu_add);
