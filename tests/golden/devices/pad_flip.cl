// ---- kernel 0
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1) {
  long r2 = (long)get_global_id(1);
  long r3 = (long)get_global_id(0);
  if (r3 >= 6L) return;
  long v5 = r2 + (-1L);
  bool v6 = (-1L) < v5;
  long v7 = r3 * (-1L);
  long v9 = v7 + 5L;
  bool v11 = v9 < 4L;
  bool v12 = v6 & v11;
  long v13 = r2 * 4L;
  long v14 = v13 + v7;
  long v16 = v14 + 1L;
  long v18 = v12 ? v16 : 0L;
  float v19 = b1[v18];
  float v21 = v12 ? v19 : 0.0f;
  bool v22 = v21 < 0.0f;
  bool v23 = v21 == 0.0f;
  bool v24 = v22 | v23;
  float v25 = v24 ? 0.0f : v21;
  long v27 = r2 * 6L;
  long v28 = v27 + r3;
  b0[v28] = v25;
}

