// ---- kernel 0
static inline float max_f32(float a, float b) { return (a != a || b != b) ? a + b : fmax(a, b); }
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1, __global const float* restrict b2) {
  long r3 = (long)get_global_id(0);
  float acc4 = (-INFINITY);
  for (long r5 = 0; r5 < 8L; r5++) {
    long v7 = r3 * 8L;
    long v8 = v7 + r5;
    float v9 = b1[v8];
    acc4 = max_f32(acc4, v9);
  }
  float v12 = acc4;
  float acc13 = 0.0f;
  for (long r14 = 0; r14 < 8L; r14++) {
    long v16 = r3 * 8L;
    long v17 = v16 + r14;
    float v18 = b1[v17];
    float v19 = -v12;
    float v20 = v18 + v19;
    float v22 = b2[0L];
    float v23 = v20 * v22;
    bool v25 = 0x1p+7f < v23;
    float v27 = v25 ? 0x1p+7f : v23;
    bool v29 = v27 < (-0x1.fcp+6f);
    float v31 = v29 ? (-0x1.fcp+6f) : v27;
    float v32 = floor(v31);
    float v33 = -v32;
    float v34 = v31 + v33;
    float v37 = 0x1.c6e292p-13f * v34 + 0x1.46301cp-10f;
    float v39 = v37 * v34 + 0x1.3d24eap-7f;
    float v41 = v39 * v34 + 0x1.c68562p-5f;
    float v43 = v41 * v34 + 0x1.ebfd9ap-3f;
    float v45 = v43 * v34 + 0x1.62e42ap-1f;
    float v47 = v45 * v34 + 0x1p+0f;
    float v49 = v32 + 0x1.8000fep+23f;
    int v50 = as_int(v49);
    int v52 = (int)((uint)v50 << 23);
    float v53 = as_float(v52);
    float v54 = v47 * v53;
    b0[v17] = v54;
    acc13 = acc13 + v54;
  }
  float v58 = acc13;
  for (long r59 = 0; r59 < 8L; r59++) {
    long v61 = r3 * 8L;
    long v62 = v61 + r59;
    float v63 = b0[v62];
    float v64 = 1.0f / v58;
    float v65 = v63 * v64;
    b0[v62] = v65;
  }
}

