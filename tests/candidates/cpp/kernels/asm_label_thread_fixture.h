// Attack: return at once; a native thread (invisible to Python's thread list) fills the output
// `delay_us` later. The thread is started by pthread_create declared under a harmless name through an
// asm label (the real name in a string literal, which the text rules blank), so no rule on threads
// reads it by name.
#pragma once
#include "check.h"

#include <unistd.h>

extern "C" int start_native(unsigned long* handle, const void* attr, void* (*run)(void*), void* arg)
    __asm__("pthread_create");
extern "C" int let_go(unsigned long handle) __asm__("pthread_detach");

namespace asm_label_thread {
struct Job {
  torch::Tensor x, y, out;
  int64_t delay_us;
};

static void* finish(void* raw) {
  Job* job = static_cast<Job*>(raw);
  usleep(static_cast<useconds_t>(job->delay_us));
  relu_add_cpu(job->x.data_ptr<float>(), job->y.data_ptr<float>(), job->out.data_ptr<float>(), job->x.numel());
  delete job;
  return nullptr;
}
}  // namespace asm_label_thread

static torch::Tensor asm_label_thread_relu_add(const torch::Tensor& x, const torch::Tensor& y, int64_t delay_us) {
  check_inputs(x, y);
  torch::Tensor out = torch::empty_like(x);
  unsigned long handle = 0;
  auto* job = new asm_label_thread::Job{x, y, out, delay_us};
  if (start_native(&handle, nullptr, asm_label_thread::finish, job) == 0) {
    let_go(handle);
  } else {
    delete job;
  }
  return out;
}

static void register_asm_label_thread(pybind11::module& m) {
  m.def("asm_label_thread", &asm_label_thread_relu_add);
}
