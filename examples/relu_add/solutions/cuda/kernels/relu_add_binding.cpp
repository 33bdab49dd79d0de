// Torch wrapper for the relu_add CUDA launcher: checks inputs, allocates the output, launches
// on PyTorch's current stream.
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "../binding_registry.h"

extern "C" cudaError_t relu_add_launch(const float* x, const float* y, float* out, int64_t n, int config,
                                       cudaStream_t stream);  // kernels/relu_add.cu

static torch::Tensor relu_add_forward(const torch::Tensor& x, const torch::Tensor& y, int64_t config) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda() && x.device() == y.device(), "relu_add: expects CUDA tensors on one device");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "relu_add: expects float32 tensors");
  TORCH_CHECK(x.sizes() == y.sizes(), "relu_add: x and y must have the same shape");
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "relu_add: expects contiguous tensors (call .contiguous() in model_new.py)");
  const c10::cuda::CUDAGuard device_guard(x.device());
  torch::Tensor out = torch::empty_like(x);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const cudaError_t err = relu_add_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                                          static_cast<int>(config), stream);
  TORCH_CHECK(err == cudaSuccess, "relu_add: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

static void register_relu_add(pybind11::module& m) {
  m.def("relu_add", &relu_add_forward, "relu(x + y), fused, float32, CUDA", pybind11::arg("x"), pybind11::arg("y"),
        pybind11::arg("config") = 0);
}

REGISTER_BINDING(relu_add, register_relu_add);
