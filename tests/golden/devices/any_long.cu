// ---- kernel 0
extern "C" __global__ void eqk(unsigned char* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2) {
  __shared__ int red_int32[128];
  long long gid = (long long)blockIdx.x;
  long long lid = (long long)threadIdx.x;
  bool acc3 = false;
  for (long long r4 = lid; r4 < 512LL; r4 += 128LL) {
    float v6 = b1[0LL];
    float v7 = b2[r4];
    bool v8 = v6 < v7;
    acc3 = acc3 || v8;
  }
  red_int32[lid] = acc3;
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
  acc3 = red_int32[0] != 0;
  __syncthreads();
  bool v11 = acc3;
  if (lid == 0) b0[0LL] = (unsigned char)v11;
}

