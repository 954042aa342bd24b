// ---- kernel 0
extern "C" __global__ void eqk(unsigned char* __restrict__ b0, const float* __restrict__ b1) {
  __shared__ int red_int32[128];
  long long gid = (long long)blockIdx.x;
  long long lid = (long long)threadIdx.x;
  bool acc2 = false;
  for (long long r3 = lid; r3 < 512LL; r3 += 128LL) {
    float v5 = b1[r3];
    bool v6 = 0x1.4p+1f < v5;
    acc2 = acc2 || v6;
  }
  red_int32[lid] = acc2;
  __syncthreads();
  if (lid < 64) red_int32[lid] = red_int32[lid] || red_int32[lid + 64];
  __syncthreads();
  if (lid < 32) red_int32[lid] = red_int32[lid] || red_int32[lid + 32];
  __syncthreads();
  if (lid < 16) red_int32[lid] = red_int32[lid] || red_int32[lid + 16];
  __syncthreads();
  if (lid < 8) red_int32[lid] = red_int32[lid] || red_int32[lid + 8];
  __syncthreads();
  if (lid < 4) red_int32[lid] = red_int32[lid] || red_int32[lid + 4];
  __syncthreads();
  if (lid < 2) red_int32[lid] = red_int32[lid] || red_int32[lid + 2];
  __syncthreads();
  if (lid < 1) red_int32[lid] = red_int32[lid] || red_int32[lid + 1];
  __syncthreads();
  acc2 = red_int32[0] != 0;
  __syncthreads();
  bool v9 = acc2;
  if (lid == 0) b0[0LL] = (unsigned char)v9;
}

