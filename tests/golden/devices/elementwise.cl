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
static inline float log2_f32(float x) {
  bool sub = x < 0x1p-126f;
  int bits = as_int(sub ? x * 0x1p+23f : x);
  int e = (int)((uint)bits >> 23) - 127;
  float m = as_float((bits & 8388607) | 1065353216);
  bool big = m > 0x1.6a09e6p+0f;
  m = big ? m * 0.5f : m;
  float ef = (float)(e + (int)big) - (sub ? 0x1.7p+4f : 0.0f);
  float t = m - 1.0f;
  float r = ef + ((((((((0x1.fe1cap-4f * t + (-0x1.a3710ap-3f)) * t + 0x1.b87fbep-3f) * t + (-0x1.e9f9a6p-3f)) * t + 0x1.26ead6p-2f) * t + (-0x1.715996p-2f)) * t + 0x1.ec7322p-2f) * t + (-0x1.715474p-1f)) * t + 0x1.715476p+0f) * t;
  r = x == 0.0f ? (-INFINITY) : r;
  r = x == INFINITY ? x : r;
  return (x < 0.0f || x != x) ? NAN : r;
}
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1, __global const float* restrict b2, __global const float* restrict b3, __global const float* restrict b4, __global const float* restrict b5) {
  long r6 = (long)get_global_id(0);
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
  float v19 = exp2_f32(v18);
  float v20 = b5[r6];
  bool v22 = v20 < 0.0f;
  float v23 = -v20;
  float v24 = v22 ? v23 : v20;
  float v25 = v19 + v24;
  float v26 = log2_f32(v25);
  float v28 = v26 * 0x1.62e43p-1f;
  b0[r6] = v28;
}

