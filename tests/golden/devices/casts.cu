// ---- kernel 0
static __device__ __forceinline__ int f2i_sat(float x) { return x != x ? 0 : x >= 0x1p+31f ? 2147483647 : x <= -0x1p+31f ? (-2147483647 - 1) : (int)x; }
extern "C" __global__ void eqk(int* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2, const int* __restrict__ b3) {
  long long r4 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r4 >= 5LL) return;
  float v5 = b1[r4];
  int v6 = f2i_sat(v5);
  float v8 = b2[r4];
  bool v9 = 0.0f < v8;
  int v10 = (int)v9;
  int v11 = (int)((unsigned int)v6 + (unsigned int)v10);
  int v12 = b3[r4];
  int v13 = v11 > v12 ? v11 : v12;
  b0[r4] = v13;
}

