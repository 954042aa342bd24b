// ---- kernel 0
static inline float max_f32(float a, float b) { return (a != a || b != b) ? a + b : fmax(a, b); }
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1) {
  float acc2 = (-INFINITY);
  for (long r3 = 0; r3 < 32L; r3++) {
    float v4 = b1[r3];
    acc2 = max_f32(acc2, v4);
  }
  float v7 = acc2;
  b0[0L] = v7;
}

