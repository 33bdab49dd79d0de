// Plain C++ kernels (no torch) shared by the cpp fixtures: the honest relu(x + y), and a
// deliberately slow one (the same work repeated) for the timing attacks.
#include <cstdint>

void relu_add_cpu(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] + y[i];
    out[i] = v < 0.0f ? 0.0f : v;
  }
}

void relu_add_cpu_reps(const float* x, const float* y, float* out, int64_t n, int64_t reps) {
  for (int64_t r = 0; r < reps; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i] + y[i];
      out[i] = v < 0.0f ? 0.0f : v;
    }
    asm volatile("" : : "r"(out) : "memory");  // keep every repetition
  }
}
