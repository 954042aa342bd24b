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
  b0[r2] = v11;
}

// ---- kernel 1
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2) {
  long long r3 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float acc4 = 0.0f;
  for (long long r5 = 0; r5 < 8LL; r5++) {
    long long v7 = r3 * 8LL;
    long long v8 = v7 + r5;
    float v9 = b1[v8];
    float v10 = b2[r3];
    float v11 = -v10;
    float v12 = v9 + v11;
    float v14 = v12 * 0x1.715476p+0f;
    float v15 = exp2f(v14);
    acc4 = acc4 + v15;
  }
  float v18 = acc4;
  b0[r3] = v18;
}

// ---- kernel 2
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2, const float* __restrict__ b3) {
  long long r4 = (long long)blockIdx.y * blockDim.y + threadIdx.y;
  long long r5 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long v7 = r4 * 8LL;
  long long v8 = v7 + r5;
  float v9 = b1[v8];
  float v10 = b2[r4];
  float v11 = -v10;
  float v12 = v9 + v11;
  float v14 = v12 * 0x1.715476p+0f;
  float v15 = exp2f(v14);
  float v16 = b3[r4];
  float v17 = 1.0f / v16;
  float v18 = v15 * v17;
  b0[v8] = v18;
}

