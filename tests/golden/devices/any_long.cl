// ---- kernel 0
__kernel void eqk(__global uchar* restrict b0, __global const float* restrict b1, __global const float* restrict b2) {
  __local int red_int32[16];
  long gid = (long)get_group_id(0);
  long lid = (long)get_local_id(0);
  bool acc3 = false;
  for (long r4 = lid; r4 < 512L; r4 += 16L) {
    float v6 = b1[0L];
    float v7 = b2[r4];
    bool v8 = v6 < v7;
    acc3 = acc3 || v8;
  }
  red_int32[lid] = acc3;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 8) red_int32[lid] = red_int32[lid] || red_int32[lid + 8];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 4) red_int32[lid] = red_int32[lid] || red_int32[lid + 4];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 2) red_int32[lid] = red_int32[lid] || red_int32[lid + 2];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 1) red_int32[lid] = red_int32[lid] || red_int32[lid + 1];
  barrier(CLK_LOCAL_MEM_FENCE);
  acc3 = red_int32[0] != 0;
  barrier(CLK_LOCAL_MEM_FENCE);
  bool v11 = acc3;
  if (lid == 0) b0[0L] = (uchar)v11;
}

