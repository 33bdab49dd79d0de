// Input checks shared by the fixture bindings.
#pragma once
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

static inline void check_inputs(const torch::Tensor& x, const torch::Tensor& y) {
  TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu(), "expects CPU tensors");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "expects float32");
  TORCH_CHECK(x.sizes() == y.sizes() && x.is_contiguous() && y.is_contiguous(), "expects contiguous, same shape");
}

void relu_add_cpu(const float* x, const float* y, float* out, int64_t n);
void relu_add_cpu_reps(const float* x, const float* y, float* out, int64_t n, int64_t reps);
