// ---- kernel 0
; kernel eqk (tiny)
declare i32 @llvm.smax.i32(i32, i32)

define void @eqk(ptr noalias %p0, ptr noalias readonly %p1, i64 %lo, i64 %hi) nounwind {
entry:
  %a2 = alloca i32
  %r3.p = alloca i64
  %r4.p = alloca i64
  store i32 -2139095041, ptr %a2
  store i64 0, ptr %r3.p
  br label %L3.cond
L3.cond:
  %r3 = load i64, ptr %r3.p
  %r3.c = icmp slt i64 %r3, 4
  br i1 %r3.c, label %L3.body, label %L3.exit
L3.body:
  store i64 0, ptr %r4.p
  br label %L4.cond
L4.cond:
  %r4 = load i64, ptr %r4.p
  %r4.c = icmp slt i64 %r4, 8
  br i1 %r4.c, label %L4.body, label %L4.exit
L4.body:
  %t1 = mul i64 %r3, 8
  %t2 = add i64 %t1, %r4
  %t3 = getelementptr inbounds float, ptr %p1, i64 %t2
  %t4 = load float, ptr %t3
  %t5 = fcmp uno float %t4, %t4
  %t6 = select i1 %t5, float 0x7FF8000000000000, float %t4
  %t7 = bitcast float %t6 to i32
  %t8 = ashr i32 %t7, 31
  %t9 = lshr i32 %t8, 1
  %t10 = xor i32 %t7, %t9
  %t11 = load i32, ptr %a2
  %t12 = call i32 @llvm.smax.i32(i32 %t11, i32 %t10)
  store i32 %t12, ptr %a2
  %r4.n = add nuw nsw i64 %r4, 1
  store i64 %r4.n, ptr %r4.p
  br label %L4.cond, !llvm.loop !0
L4.exit:
  %r3.n = add nuw nsw i64 %r3, 1
  store i64 %r3.n, ptr %r3.p
  br label %L3.cond, !llvm.loop !6
L3.exit:
  %t13 = load i32, ptr %a2
  %t14 = ashr i32 %t13, 31
  %t15 = lshr i32 %t14, 1
  %t16 = xor i32 %t13, %t15
  %t17 = bitcast i32 %t16 to float
  %t18 = getelementptr inbounds float, ptr %p0, i64 0
  store float %t17, ptr %t18
  ret void
}

!0 = distinct !{!0, !1}
!1 = !{!"llvm.loop.mustprogress"}
!2 = !{!"llvm.loop.interleave.count", i32 4}
!3 = distinct !{!3, !1, !2}
!4 = distinct !{!4, !1, !5}
!5 = !{!"llvm.loop.unroll.disable"}
!6 = distinct !{!6, !1, !5, !7}
!7 = !{!"llvm.loop.vectorize.width", i32 1}

