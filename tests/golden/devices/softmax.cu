// ---- kernel 0
static __device__ __forceinline__ float max_f32(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1) {
  long long r2 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float acc3 = (-__int_as_float(0x7f800000));
  for (long long r4 = 0; r4 < 8LL; r4++) {
    long long v6 = r2 * 8LL;
    long long v7 = v6 + r4;
    float v8 = b1[v7];
    acc3 = max_f32(acc3, v8);
  }
  float v11 = acc3;
  float acc12 = 0.0f;
  for (long long r13 = 0; r13 < 8LL; r13++) {
    long long v15 = r2 * 8LL;
    long long v16 = v15 + r13;
    float v17 = b1[v16];
    float v18 = -v11;
    float v19 = v17 + v18;
    float v21 = v19 * 0x1.715476p+0f;
    float v22 = exp2f(v21);
    acc12 = acc12 + v22;
  }
  float v25 = acc12;
  for (long long r26 = 0; r26 < 8LL; r26++) {
    long long v28 = r2 * 8LL;
    long long v29 = v28 + r26;
    float v30 = b1[v29];
    float v31 = -v11;
    float v32 = v30 + v31;
    float v34 = v32 * 0x1.715476p+0f;
    float v35 = exp2f(v34);
    float v36 = 1.0f / v25;
    float v37 = v35 * v36;
    b0[v29] = v37;
  }
}

