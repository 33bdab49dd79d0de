// One module, many fixtures. Honest: relu_add (fused, one pass) and relu_add_slow (the same
// result, `reps` times the work). Attacks: uninit (no compute, uninitialised memory), inplace
// (writes the answer into input x), cache_by_ptr (replays results cached by input address).
#pragma once
#include "check.h"

#include <map>
#include <utility>

static torch::Tensor relu_add(const torch::Tensor& x, const torch::Tensor& y) {
  check_inputs(x, y);
  torch::Tensor out = torch::empty_like(x);
  relu_add_cpu(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  return out;
}

static torch::Tensor relu_add_slow(const torch::Tensor& x, const torch::Tensor& y, int64_t reps) {
  check_inputs(x, y);
  torch::Tensor out = torch::empty_like(x);
  relu_add_cpu_reps(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel(), reps);
  return out;
}

static torch::Tensor uninit(const torch::Tensor& x, const torch::Tensor& y) {
  return torch::empty_like(x);
}

static torch::Tensor inplace(const torch::Tensor& x, const torch::Tensor& y) {
  check_inputs(x, y);
  relu_add_cpu(x.data_ptr<float>(), y.data_ptr<float>(), x.data_ptr<float>(), x.numel());
  return x;
}

static torch::Tensor cache_by_ptr(const torch::Tensor& x, const torch::Tensor& y) {
  static std::map<std::pair<void*, void*>, torch::Tensor> cache;
  auto key = std::make_pair(x.data_ptr(), y.data_ptr());
  auto hit = cache.find(key);
  if (hit != cache.end()) return hit->second;
  check_inputs(x, y);
  torch::Tensor out = torch::empty_like(x);
  relu_add_cpu(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  cache[key] = out;
  return out;
}

static void register_misc(pybind11::module& m) {
  m.def("relu_add", &relu_add);
  m.def("relu_add_slow", &relu_add_slow);
  m.def("uninit", &uninit);
  m.def("inplace", &inplace);
  m.def("cache_by_ptr", &cache_by_ptr);
}

