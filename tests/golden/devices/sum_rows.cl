// ---- kernel 0
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1) {
  long r2 = (long)get_global_id(0);
  float acc3 = 0.0f;
  for (long r4 = 0; r4 < 8L; r4++) {
    long v6 = r2 * 8L;
    long v7 = v6 + r4;
    float v8 = b1[v7];
    acc3 = acc3 + v8;
  }
  float v11 = acc3;
  b0[r2] = v11;
}

