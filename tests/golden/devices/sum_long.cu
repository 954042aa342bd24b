// ---- kernel 0
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1) {
  long long r2 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float acc3 = 0.0f;
  for (long long r4 = 0; r4 < 256LL; r4++) {
    long long v6 = r2 * 256LL;
    long long v7 = v6 + r4;
    float v8 = b1[v7];
    acc3 = acc3 + v8;
  }
  float v11 = acc3;
  b0[r2] = v11;
}

