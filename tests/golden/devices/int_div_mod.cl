// ---- kernel 0
static inline int idiv_i32(int a, int b) { return b == 0 ? 0 : b == -1 ? (int)(0u - (uint)a) : a / b; }
static inline int mod_i32(int a, int b) { return (b == 0 || b == -1) ? 0 : a % b; }
__kernel void eqk(__global int* restrict b0, __global const int* restrict b1, __global const int* restrict b2, __global const int* restrict b3) {
  long r4 = (long)get_global_id(0);
  if (r4 >= 6L) return;
  int v5 = b1[r4];
  int v6 = b2[r4];
  int v7 = idiv_i32(v5, v6);
  int v8 = mod_i32(v5, v6);
  bool v10 = v8 == 0;
  bool v11 = !v10;
  bool v12 = v8 < 0;
  bool v13 = v6 < 0;
  bool v14 = v12 ^ v13;
  bool v15 = v11 & v14;
  int v16 = (int)v15;
  int v17 = (int)((uint)0 - (uint)v16);
  int v18 = (int)((uint)v7 + (uint)v17);
  int v19 = b3[r4];
  int v21 = mod_i32(v19, 3);
  bool v22 = v21 == 0;
  bool v23 = !v22;
  bool v24 = v21 < 0;
  bool v26 = v24 ^ false;
  bool v27 = v23 & v26;
  int v28 = v27 ? 3 : 0;
  int v29 = (int)((uint)v21 + (uint)v28);
  int v30 = (int)((uint)v18 + (uint)v29);
  b0[r4] = v30;
}

