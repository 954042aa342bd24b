// ---- kernel 0
static inline int f2i_sat(float x) { return x != x ? 0 : x >= 0x1p+31f ? 2147483647 : x <= -0x1p+31f ? (-2147483647 - 1) : (int)x; }
__kernel void eqk(__global int* restrict b0, __global const float* restrict b1, __global const float* restrict b2, __global const int* restrict b3) {
  long r4 = (long)get_global_id(0);
  if (r4 >= 5L) return;
  float v5 = b1[r4];
  int v6 = f2i_sat(v5);
  float v8 = b2[r4];
  bool v9 = 0.0f < v8;
  int v10 = (int)v9;
  int v11 = (int)((uint)v6 + (uint)v10);
  int v12 = b3[r4];
  int v13 = v11 > v12 ? v11 : v12;
  b0[r4] = v13;
}

