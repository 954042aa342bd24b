// ---- kernel 0
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1) {
  long long r2 = (long long)blockIdx.y * blockDim.y + threadIdx.y;
  long long r3 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r3 >= 6LL) return;
  long long v5 = r2 + (-1LL);
  bool v6 = (-1LL) < v5;
  long long v7 = r3 * (-1LL);
  long long v9 = v7 + 5LL;
  bool v11 = v9 < 4LL;
  bool v12 = v6 & v11;
  long long v13 = r2 * 4LL;
  long long v14 = v13 + v7;
  long long v16 = v14 + 1LL;
  long long v18 = v12 ? v16 : 0LL;
  float v19 = b1[v18];
  float v21 = v12 ? v19 : 0.0f;
  bool v22 = v21 < 0.0f;
  bool v23 = v21 == 0.0f;
  bool v24 = v22 | v23;
  float v25 = v24 ? 0.0f : v21;
  long long v27 = r2 * 6LL;
  long long v28 = v27 + r3;
  b0[v28] = v25;
}

