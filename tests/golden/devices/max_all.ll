// ---- kernel 0
; kernel eqk (tiny)
declare i32 @llvm.smax.i32(i32, i32)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, i64 %lo, i64 %hi) nounwind {
entry:
  %a2 = alloca i32
  %r3.p = alloca i64
  store i32 -2139095041, ptr %a2
  store i64 0, ptr %r3.p
  br label %L3.cond
L3.cond:
  %r3 = load i64, ptr %r3.p
  %r3.c = icmp slt i64 %r3, 32
  br i1 %r3.c, label %L3.body, label %L3.exit
L3.body:
  %t1 = getelementptr inbounds float, ptr %p1, i64 %r3
  %t2 = load float, ptr %t1
  %t3 = fcmp uno float %t2, %t2
  %t4 = select i1 %t3, float 0x7FF8000000000000, float %t2
  %t5 = bitcast float %t4 to i32
  %t6 = ashr i32 %t5, 31
  %t7 = lshr i32 %t6, 1
  %t8 = xor i32 %t5, %t7
  %t9 = load i32, ptr %a2
  %t10 = call i32 @llvm.smax.i32(i32 %t9, i32 %t8)
  store i32 %t10, ptr %a2
  %r3.n = add nuw nsw i64 %r3, 1
  store i64 %r3.n, ptr %r3.p
  br label %L3.cond, !llvm.loop !0
L3.exit:
  %t11 = load i32, ptr %a2
  %t12 = ashr i32 %t11, 31
  %t13 = lshr i32 %t12, 1
  %t14 = xor i32 %t11, %t13
  %t15 = bitcast i32 %t14 to float
  %t16 = getelementptr inbounds float, ptr %p0, i64 0
  store float %t15, ptr %t16
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.unroll.disable"}

