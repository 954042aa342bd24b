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
  float acc12 = 0.0f;
  for (long r13 = 0; r13 < 8L; r13++) {
    long v15 = r2 * 8L;
    long v16 = v15 + r13;
    float v17 = b1[v16];
    float v18 = -v11;
    float v19 = v17 + v18;
    float v21 = v19 * 0x1.715476p+0f;
    bool v23 = 0x1p+7f < v21;
    float v25 = v23 ? 0x1p+7f : v21;
    bool v27 = v25 < (-0x1.fcp+6f);
    float v29 = v27 ? (-0x1.fcp+6f) : v25;
    float v30 = floor(v29);
    float v31 = -v30;
    float v32 = v29 + v31;
    float v35 = 0x1.c6e292p-13f * v32 + 0x1.46301cp-10f;
    float v37 = v35 * v32 + 0x1.3d24eap-7f;
    float v39 = v37 * v32 + 0x1.c68562p-5f;
    float v41 = v39 * v32 + 0x1.ebfd9ap-3f;
    float v43 = v41 * v32 + 0x1.62e42ap-1f;
    float v45 = v43 * v32 + 0x1p+0f;
    float v47 = v30 + 0x1.8000fep+23f;
    int v48 = as_int(v47);
    int v50 = (int)((uint)v48 << 23);
    float v51 = as_float(v50);
    float v52 = v45 * v51;
    acc12 = acc12 + v52;
  }
  float v55 = acc12;
  for (long r56 = 0; r56 < 8L; r56++) {
    long v58 = r2 * 8L;
    long v59 = v58 + r56;
    float v60 = b1[v59];
    float v61 = -v11;
    float v62 = v60 + v61;
    float v64 = v62 * 0x1.715476p+0f;
    bool v66 = 0x1p+7f < v64;
    float v68 = v66 ? 0x1p+7f : v64;
    bool v70 = v68 < (-0x1.fcp+6f);
    float v72 = v70 ? (-0x1.fcp+6f) : v68;
    float v73 = floor(v72);
    float v74 = -v73;
    float v75 = v72 + v74;
    float v78 = 0x1.c6e292p-13f * v75 + 0x1.46301cp-10f;
    float v80 = v78 * v75 + 0x1.3d24eap-7f;
    float v82 = v80 * v75 + 0x1.c68562p-5f;
    float v84 = v82 * v75 + 0x1.ebfd9ap-3f;
    float v86 = v84 * v75 + 0x1.62e42ap-1f;
    float v88 = v86 * v75 + 0x1p+0f;
    float v90 = v73 + 0x1.8000fep+23f;
    int v91 = as_int(v90);
    int v93 = (int)((uint)v91 << 23);
    float v94 = as_float(v93);
    float v95 = v88 * v94;
    float v96 = 1.0f / v55;
    float v97 = v95 * v96;
    b0[v59] = v97;
  }
}

