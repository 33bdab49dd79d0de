// Attack: as deferred_binding.cpp, spelled std::jthread (a text rule for std::thread misses it).
#pragma once
#include "check.h"

#include <chrono>
#include <thread>

static torch::Tensor deferred_jthread(const torch::Tensor& x, const torch::Tensor& y, int64_t delay_us) {
  check_inputs(x, y);
  torch::Tensor out = torch::empty_like(x);
  std::jthread([x, y, out, delay_us]() mutable {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    relu_add_cpu(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  }).detach();
  return out;
}

static void register_deferred_jthread(pybind11::module& m) { m.def("deferred_jthread", &deferred_jthread); }

