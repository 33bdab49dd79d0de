// Refused by rule: relu_add split over two std::threads, joined before returning. The cpp skill
// allows threads through OpenMP only.
#pragma once
#include "check.h"

#include <thread>

static torch::Tensor relu_add_threads(const torch::Tensor& x, const torch::Tensor& y) {
  check_inputs(x, y);
  torch::Tensor out = torch::empty_like(x);
  const int64_t n = x.numel(), half = n / 2;
  const float *px = x.data_ptr<float>(), *py = y.data_ptr<float>();
  float* po = out.data_ptr<float>();
  std::thread worker([=] { relu_add_cpu(px + half, py + half, po + half, n - half); });
  relu_add_cpu(px, py, po, half);
  worker.join();
  return out;
}

static void register_threads(pybind11::module& m) { m.def("relu_add_threads", &relu_add_threads); }

