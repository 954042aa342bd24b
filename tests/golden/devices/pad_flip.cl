// ---- kernel 0
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1) {
  long r2 = (long)get_global_id(1);
  long r3 = (long)get_global_id(0);
  if (r3 >= 6L) return;
  long v6 = r2 + (-1L);
  bool v7 = (-1L) < v6;
  long v8 = r3 * (-1L);
  long v10 = v8 + 5L;
  bool v12 = v10 < 4L;
  bool v13 = v7 & v12;
  long v14 = r2 * 4L;
  long v15 = v14 + v8;
  long v17 = v15 + 1L;
  long v19 = v13 ? v17 : 0L;
  float v20 = b1[v19];
  float v21 = v13 ? v20 : 0.0f;
  bool v22 = 0.0f < v21;
  float v23 = v22 ? v21 : 0.0f;
  long v25 = r2 * 6L;
  long v26 = v25 + r3;
  b0[v26] = v23;
}

