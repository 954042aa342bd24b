// ---- kernel 0
extern "C" __global__ void eqk(float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2) {
  float acc3 = 0.0f;
  float acc4 = 0.0f;
  float acc5 = 0.0f;
  float acc6 = 0.0f;
  float acc7 = 0.0f;
  float acc8 = 0.0f;
  float acc9 = 0.0f;
  float acc10 = 0.0f;
  for (long long r11 = 0; r11 < 8LL; r11++) {
    float v12 = b1[r11];
    long long v14 = r11 * 4LL;
    float v15 = b2[v14];
    float v16 = v12 * v15;
    long long v18 = v14 + 1LL;
    float v19 = b2[v18];
    float v20 = v12 * v19;
    long long v22 = v14 + 2LL;
    float v23 = b2[v22];
    float v24 = v12 * v23;
    long long v26 = v14 + 3LL;
    float v27 = b2[v26];
    float v28 = v12 * v27;
    long long v30 = r11 + 8LL;
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
  b0[0LL] = v45;
  b0[1LL] = v46;
  b0[2LL] = v47;
  b0[3LL] = v48;
  b0[4LL] = v49;
  b0[5LL] = v50;
  b0[6LL] = v51;
  b0[7LL] = v52;
}

