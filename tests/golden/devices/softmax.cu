// ---- kernel 0
static __device__ __forceinline__ float max_f32(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2) {
  long long r3 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float acc4 = (-__int_as_float(0x7f800000));
  for (long long r5 = 0; r5 < 8LL; r5++) {
    long long v7 = r3 * 8LL;
    long long v8 = v7 + r5;
    float v9 = b1[v8];
    acc4 = max_f32(acc4, v9);
  }
  float v12 = acc4;
  float acc13 = 0.0f;
  for (long long r14 = 0; r14 < 8LL; r14++) {
    long long v16 = r3 * 8LL;
    long long v17 = v16 + r14;
    float v18 = b1[v17];
    float v19 = -v12;
    float v20 = v18 + v19;
    float v22 = b2[0LL];
    float v23 = v20 * v22;
    float v24 = exp2f(v23);
    b0[v17] = v24;
    acc13 = acc13 + v24;
  }
  float v28 = acc13;
  for (long long r29 = 0; r29 < 8LL; r29++) {
    long long v31 = r3 * 8LL;
    long long v32 = v31 + r29;
    float v33 = b0[v32];
    float v34 = 1.0f / v28;
    float v35 = v33 * v34;
    b0[v32] = v35;
  }
}

