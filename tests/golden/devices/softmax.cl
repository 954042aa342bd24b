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
    acc13 = acc13 + v54;
  }
  float v57 = acc13;
  for (long r58 = 0; r58 < 8L; r58++) {
    long v60 = r3 * 8L;
    long v61 = v60 + r58;
    float v62 = b1[v61];
    float v63 = -v12;
    float v64 = v62 + v63;
    float v66 = b2[0L];
    float v67 = v64 * v66;
    bool v69 = 0x1p+7f < v67;
    float v71 = v69 ? 0x1p+7f : v67;
    bool v73 = v71 < (-0x1.fcp+6f);
    float v75 = v73 ? (-0x1.fcp+6f) : v71;
    float v76 = floor(v75);
    float v77 = -v76;
    float v78 = v75 + v77;
    float v81 = 0x1.c6e292p-13f * v78 + 0x1.46301cp-10f;
    float v83 = v81 * v78 + 0x1.3d24eap-7f;
    float v85 = v83 * v78 + 0x1.c68562p-5f;
    float v87 = v85 * v78 + 0x1.ebfd9ap-3f;
    float v89 = v87 * v78 + 0x1.62e42ap-1f;
    float v91 = v89 * v78 + 0x1p+0f;
    float v93 = v76 + 0x1.8000fep+23f;
    int v94 = as_int(v93);
    int v96 = (int)((uint)v94 << 23);
    float v97 = as_float(v96);
    float v98 = v91 * v97;
    float v99 = 1.0f / v57;
    float v100 = v98 * v99;
    b0[v61] = v100;
  }
}

