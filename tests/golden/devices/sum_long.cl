// ---- kernel 0
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1) {
  __local float red_float32[16];
  long gid = (long)get_group_id(0);
  long lid = (long)get_local_id(0);
  long r2 = gid;
  float acc3 = 0.0f;
  for (long r4 = lid; r4 < 256L; r4 += 16L) {
    long v6 = r2 * 256L;
    long v7 = v6 + r4;
    float v8 = b1[v7];
    acc3 = acc3 + v8;
  }
  red_float32[lid] = acc3;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 8) red_float32[lid] = red_float32[lid] + red_float32[lid + 8];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 4) red_float32[lid] = red_float32[lid] + red_float32[lid + 4];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 2) red_float32[lid] = red_float32[lid] + red_float32[lid + 2];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 1) red_float32[lid] = red_float32[lid] + red_float32[lid + 1];
  barrier(CLK_LOCAL_MEM_FENCE);
  acc3 = red_float32[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  float v11 = acc3;
  if (lid == 0) b0[r2] = v11;
}

