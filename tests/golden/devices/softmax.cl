// ---- kernel 0
static inline float exp2_f32(float x) {
  float xc = x > 0x1p+7f ? 0x1p+7f : x;
  xc = xc < (-0x1.fcp+6f) ? (-0x1.fcp+6f) : xc;
  float fl = floor(xc);
  float f = xc - fl;
  float p = (((((0x1.c6e292p-13f * f + 0x1.46301cp-10f) * f + 0x1.3d24eap-7f) * f + 0x1.c68562p-5f) * f + 0x1.ebfd9ap-3f) * f + 0x1.62e42ap-1f) * f + 0x1p+0f;
  uint bits = (uint)as_int(fl + 0x1.8000fep+23f) << 23;
  return p * as_float(bits);
}
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
  float acc12 = 0.0f;
  for (long r13 = 0; r13 < 8L; r13++) {
    long v15 = r2 * 8L;
    long v16 = v15 + r13;
    float v17 = b1[v16];
    float v18 = -v11;
    float v19 = v17 + v18;
    float v21 = v19 * 0x1.715476p+0f;
    float v22 = exp2_f32(v21);
    acc12 = acc12 + v22;
  }
  float v25 = acc12;
  for (long r26 = 0; r26 < 8L; r26++) {
    long v28 = r2 * 8L;
    long v29 = v28 + r26;
    float v30 = b1[v29];
    float v31 = -v11;
    float v32 = v30 + v31;
    float v34 = v32 * 0x1.715476p+0f;
    float v35 = exp2_f32(v34);
    float v36 = 1.0f / v25;
    float v37 = v35 * v36;
    b0[v29] = v37;
  }
}

