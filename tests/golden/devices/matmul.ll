// ---- kernel 0
; kernel eqk (tiny)


define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, ptr noalias readonly %p2, i64 %lo, i64 %hi) nounwind {
entry:
  %a3 = alloca <4 x float>
  %a7 = alloca <4 x float>
  %r11.p = alloca i64
  store <4 x float> splat (float 0x0000000000000000), ptr %a3
  store <4 x float> splat (float 0x0000000000000000), ptr %a7
  store i64 0, ptr %r11.p
  br label %L11.cond
L11.cond:
  %r11 = load i64, ptr %r11.p
  %r11.c = icmp slt i64 %r11, 8
  br i1 %r11.c, label %L11.body, label %L11.exit
L11.body:
  %t1 = getelementptr inbounds float, ptr %p1, i64 %r11
  %t2 = load float, ptr %t1
  %t3 = mul i64 %r11, 4
  %t4 = add i64 %r11, 8
  %t5 = getelementptr inbounds float, ptr %p1, i64 %t4
  %t6 = load float, ptr %t5
  %t7 = insertelement <4 x float> poison, float %t2, i64 0
  %t8 = shufflevector <4 x float> %t7, <4 x float> poison, <4 x i32> zeroinitializer
  %t9 = getelementptr inbounds float, ptr %p2, i64 %t3
  %t10 = load <4 x float>, ptr %t9, align 4
  %t11 = fmul contract <4 x float> %t8, %t10
  %t12 = load <4 x float>, ptr %a3
  %t13 = fadd reassoc contract <4 x float> %t12, %t11
  store <4 x float> %t13, ptr %a3
  %t14 = insertelement <4 x float> poison, float %t6, i64 0
  %t15 = shufflevector <4 x float> %t14, <4 x float> poison, <4 x i32> zeroinitializer
  %t16 = fmul contract <4 x float> %t15, %t10
  %t17 = load <4 x float>, ptr %a7
  %t18 = fadd reassoc contract <4 x float> %t17, %t16
  store <4 x float> %t18, ptr %a7
  %r11.n = add nuw nsw i64 %r11, 1
  store i64 %r11.n, ptr %r11.p
  br label %L11.cond, !llvm.loop !0
L11.exit:
  %t19 = load <4 x float>, ptr %a3
  %t20 = load <4 x float>, ptr %a7
  %t21 = getelementptr inbounds float, ptr %p0, i64 0
  store <4 x float> %t19, ptr %t21, align 4
  %t22 = getelementptr inbounds float, ptr %p0, i64 4
  store <4 x float> %t20, ptr %t22, align 4
  ret void
}

!0 = distinct !{!0, !1, !2}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.vectorize.width", i32 1}
!4 = distinct !{!4, !1, !2, !5}
!5 = !{!"llvm.loop.unroll.disable"}

