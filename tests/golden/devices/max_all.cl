// ---- kernel 0
static inline float max_f32(float a, float b) { return (a != a || b != b) ? a + b : fmax(a, b); }
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1) {
  float acc2 = (-INFINITY);
  for (long r3 = 0; r3 < 4L; r3++) {
    for (long r4 = 0; r4 < 8L; r4++) {
      long v6 = r3 * 8L;
      long v7 = v6 + r4;
      float v8 = b1[v7];
      acc2 = max_f32(acc2, v8);
    }
  }
  float v12 = acc2;
  b0[0L] = v12;
}

