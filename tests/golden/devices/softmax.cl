// ---- kernel 0
static inline float max_f32(float a, float b) { return (a != a || b != b) ? a + b : fmax(a, b); }
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1) {
  long r2 = (long)get_global_id(0);
  float acc3 = (-INFINITY);
  for (long r4 = 0; r4 < 8L; r4++) {
    long v6 = r2 * 8L;
    long v7 = v6 + r4;
    float v8 = b1[v7];
    acc3 = max_f32(acc3, v8);
  }
  float v11 = acc3;
  b0[r2] = v11;
}

// ---- kernel 1
static inline float exp2_f32(float x) {
  float xc = x > 0x1p+7f ? 0x1p+7f : x;
  xc = xc < (-0x1.fcp+6f) ? (-0x1.fcp+6f) : xc;
  float fl = floor(xc);
  float f = xc - fl;
  float p = (((((0x1.c6e292p-13f * f + 0x1.46301cp-10f) * f + 0x1.3d24eap-7f) * f + 0x1.c68562p-5f) * f + 0x1.ebfd9ap-3f) * f + 0x1.62e42ap-1f) * f + 0x1p+0f;
  uint bits = (uint)as_int(fl + 0x1.8000fep+23f) << 23;
  return p * as_float(bits);
}
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1, __global const float* restrict b2) {
  long r3 = (long)get_global_id(0);
  float acc4 = 0.0f;
  for (long r5 = 0; r5 < 8L; r5++) {
    long v7 = r3 * 8L;
    long v8 = v7 + r5;
    float v9 = b1[v8];
    float v10 = b2[r3];
    float v11 = -v10;
    float v12 = v9 + v11;
    float v14 = v12 * 0x1.715476p+0f;
    float v15 = exp2_f32(v14);
    acc4 = acc4 + v15;
  }
  float v18 = acc4;
  b0[r3] = v18;
}

// ---- kernel 2
static inline float exp2_f32(float x) {
  float xc = x > 0x1p+7f ? 0x1p+7f : x;
  xc = xc < (-0x1.fcp+6f) ? (-0x1.fcp+6f) : xc;
  float fl = floor(xc);
  float f = xc - fl;
  float p = (((((0x1.c6e292p-13f * f + 0x1.46301cp-10f) * f + 0x1.3d24eap-7f) * f + 0x1.c68562p-5f) * f + 0x1.ebfd9ap-3f) * f + 0x1.62e42ap-1f) * f + 0x1p+0f;
  uint bits = (uint)as_int(fl + 0x1.8000fep+23f) << 23;
  return p * as_float(bits);
}
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1, __global const float* restrict b2, __global const float* restrict b3) {
  long r4 = (long)get_global_id(1);
  long r5 = (long)get_global_id(0);
  long v7 = r4 * 8L;
  long v8 = v7 + r5;
  float v9 = b1[v8];
  float v10 = b2[r4];
  float v11 = -v10;
  float v12 = v9 + v11;
  float v14 = v12 * 0x1.715476p+0f;
  float v15 = exp2_f32(v14);
  float v16 = b3[r4];
  float v17 = 1.0f / v16;
  float v18 = v15 * v17;
  b0[v8] = v18;
}

