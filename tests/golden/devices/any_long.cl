// ---- kernel 0
__kernel void eqk(__global uchar* restrict b0, __global const float* restrict b1) {
  __local int red_int32[16];
  long gid = (long)get_group_id(0);
  long lid = (long)get_local_id(0);
  bool acc2 = false;
  for (long r3 = lid; r3 < 512L; r3 += 16L) {
    float v5 = b1[r3];
    bool v6 = 0x1.4p+1f < v5;
    acc2 = acc2 || v6;
  }
  red_int32[lid] = acc2;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 8) red_int32[lid] = red_int32[lid] || red_int32[lid + 8];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 4) red_int32[lid] = red_int32[lid] || red_int32[lid + 4];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 2) red_int32[lid] = red_int32[lid] || red_int32[lid + 2];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 1) red_int32[lid] = red_int32[lid] || red_int32[lid + 1];
  barrier(CLK_LOCAL_MEM_FENCE);
  acc2 = red_int32[0] != 0;
  barrier(CLK_LOCAL_MEM_FENCE);
  bool v9 = acc2;
  if (lid == 0) b0[0L] = (uchar)v9;
}

