// ---- kernel 0
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2, const float* __restrict__ b3, const float* __restrict__ b4, const float* __restrict__ b5, const float* __restrict__ b6, const float* __restrict__ b7, const float* __restrict__ b8) {
  long long r9 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float v10 = b1[r9];
  float v11 = b2[r9];
  float v12 = v10 * v11;
  float v13 = b3[r9];
  float v14 = v12 + v13;
  float v16 = b4[0LL];
  float v17 = v14 * v16;
  float v18 = b5[r9];
  float v19 = -v18;
  float v20 = v17 + v19;
  float v21 = b6[0LL];
  float v22 = v20 * v21;
  float v23 = exp2f(v22);
  float v24 = b7[r9];
  bool v26 = v24 < 0.0f;
  float v27 = -v24;
  bool v28 = 0.0f < v24;
  bool v29 = v24 == 0.0f;
  float v30 = v29 ? 0.0f : v24;
  float v31 = v28 ? v24 : v30;
  float v32 = v26 ? v27 : v31;
  float v33 = v23 + v32;
  float v34 = log2f(v33);
  float v35 = b8[0LL];
  float v36 = v34 * v35;
  b0[r9] = v36;
}

