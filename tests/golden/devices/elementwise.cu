// ---- kernel 0
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2, const float* __restrict__ b3, const float* __restrict__ b4, const float* __restrict__ b5) {
  long long r6 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float v7 = b1[r6];
  float v8 = b2[r6];
  float v9 = v7 * v8;
  float v10 = b3[r6];
  float v11 = v9 + v10;
  float v13 = v11 * 0x1p-1f;
  float v14 = b4[r6];
  float v15 = -v14;
  float v16 = v13 + v15;
  float v18 = v16 * 0x1.715476p+0f;
  float v19 = exp2f(v18);
  float v20 = b5[r6];
  bool v22 = v20 < 0.0f;
  float v23 = -v20;
  float v24 = v22 ? v23 : v20;
  float v25 = v19 + v24;
  float v26 = log2f(v25);
  float v28 = v26 * 0x1.62e43p-1f;
  b0[r6] = v28;
}

