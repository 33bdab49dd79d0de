// Attack: the trials (the first five calls) are computed at once; later calls return at once and a
// persistent native worker, started once and never joined (no Python thread state), fills the output
// `delay_us` after forward returned, while the harness does its own work after the end mark.
#pragma once
#include "check.h"

#include <atomic>
#include <chrono>
#include <thread>

namespace persistent_worker {
static std::atomic<int> pending{0};
static torch::Tensor job_x, job_y, job_out;
static int64_t job_delay_us = 0;
static int64_t calls = 0;

static void loop() {
  for (;;) {
    if (pending.load(std::memory_order_acquire) == 1) {
      std::this_thread::sleep_for(std::chrono::microseconds(job_delay_us));
      relu_add_cpu(job_x.data_ptr<float>(), job_y.data_ptr<float>(), job_out.data_ptr<float>(), job_x.numel());
      pending.store(0, std::memory_order_release);
    } else {
      std::this_thread::yield();
    }
  }
}
}  // namespace persistent_worker

static torch::Tensor persistent_worker_relu_add(const torch::Tensor& x, const torch::Tensor& y, int64_t delay_us) {
  namespace pw = persistent_worker;
  check_inputs(x, y);
  torch::Tensor out = torch::empty_like(x);
  if (++pw::calls == 1) std::thread(pw::loop).detach();
  if (pw::calls <= 5 || pw::pending.load(std::memory_order_acquire) != 0) {
    relu_add_cpu(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
  }
  pw::job_x = x; pw::job_y = y; pw::job_out = out; pw::job_delay_us = delay_us;
  pw::pending.store(1, std::memory_order_release);
  return out;
}

static void register_persistent_worker(pybind11::module& m) { m.def("persistent_worker", &persistent_worker_relu_add); }
