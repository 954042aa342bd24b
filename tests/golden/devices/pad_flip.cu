// ---- kernel 0
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1) {
  long long r2 = (long long)blockIdx.y * blockDim.y + threadIdx.y;
  long long r3 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r3 >= 6LL) return;
  long long v6 = r2 + (-1LL);
  bool v7 = (-1LL) < v6;
  long long v8 = r3 * (-1LL);
  long long v10 = v8 + 5LL;
  bool v12 = v10 < 4LL;
  bool v13 = v7 & v12;
  long long v14 = r2 * 4LL;
  long long v15 = v14 + v8;
  long long v17 = v15 + 1LL;
  long long v19 = v13 ? v17 : 0LL;
  float v20 = b1[v19];
  float v21 = v13 ? v20 : 0.0f;
  bool v22 = 0.0f < v21;
  float v23 = v22 ? v21 : 0.0f;
  long long v25 = r2 * 6LL;
  long long v26 = v25 + r3;
  b0[v26] = v23;
}

