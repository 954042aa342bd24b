// ---- kernel 0
__kernel void eqk(__global float* restrict b0, __global const float* restrict b1, __global const float* restrict b2) {
  float acc3 = 0.0f;
  float acc4 = 0.0f;
  float acc5 = 0.0f;
  float acc6 = 0.0f;
  float acc7 = 0.0f;
  float acc8 = 0.0f;
  float acc9 = 0.0f;
  float acc10 = 0.0f;
  for (long r11 = 0; r11 < 8L; r11++) {
    float v12 = b1[r11];
    long v14 = r11 * 4L;
    float v15 = b2[v14];
    float v16 = v12 * v15;
    long v18 = v14 + 1L;
    float v19 = b2[v18];
    float v20 = v12 * v19;
    long v22 = v14 + 2L;
    float v23 = b2[v22];
    float v24 = v12 * v23;
    long v26 = v14 + 3L;
    float v27 = b2[v26];
    float v28 = v12 * v27;
    long v30 = r11 + 8L;
    float v31 = b1[v30];
    float v32 = v31 * v15;
    float v33 = v31 * v19;
    float v34 = v31 * v23;
    float v35 = v31 * v27;
    acc3 = acc3 + v16;
    acc4 = acc4 + v20;
    acc5 = acc5 + v24;
    acc6 = acc6 + v28;
    acc7 = acc7 + v32;
    acc8 = acc8 + v33;
    acc9 = acc9 + v34;
    acc10 = acc10 + v35;
  }
  float v45 = acc3;
  float v46 = acc4;
  float v47 = acc5;
  float v48 = acc6;
  float v49 = acc7;
  float v50 = acc8;
  float v51 = acc9;
  float v52 = acc10;
  b0[0L] = v45;
  b0[1L] = v46;
  b0[2L] = v47;
  b0[3L] = v48;
  b0[4L] = v49;
  b0[5L] = v50;
  b0[6L] = v51;
  b0[7L] = v52;
}

